"""The load options as the Python functions take them, each checked (and
turned into what the extension takes) before anything is opened or read."""
from __future__ import annotations

import operator
import os
from typing import Dict, Optional

from ._errors import ArgumentTypeError, UsageError

_IO = {"auto": 0, "pread": 1, "uring": 2, "mmap": 3}
_GDS = {"auto": 0, "on": 1, "off": 2}
_UNIFIED = {"auto": 0, "on": 1, "off": 2}  # enum fst_unified
_READAHEAD_OFF = 2 ** 64 - 1  # FST_READAHEAD_OFF
_STREAM_OFF = 2 ** 64 - 1  # FST_STREAM_OFF
_MAX_THREADS = 64  # libfst's limit (MAX_THREADS in its engine)
_DEVICES = "'cpu', 'cuda', 'cuda:N', an int N or a torch.device"


def _is_int(value) -> bool:
    return not isinstance(value, bool) and hasattr(type(value), "__index__")


def _device(device) -> str:
    if device is None:
        return "cpu"
    if _is_int(device):
        n = operator.index(device)
        if n < 0:
            raise UsageError(f"device={device!r}: expected {_DEVICES}", -1)
        return f"cuda:{n}"
    if isinstance(device, str):
        s = device
    elif not isinstance(device, bool) and hasattr(device, "type") and hasattr(device, "index"):
        s = str(device)  # torch.device, without importing torch
    else:
        raise ArgumentTypeError(f"device={device!r}: expected {_DEVICES}", -1)
    if s == "cuda":
        return "cuda:0"
    # torch.device("cpu", 0) is "cpu:0": torch's CPU has one index
    return "cpu" if s == "cpu:0" else s


def _framework(framework) -> str:
    if framework is None:
        return "pt"
    if not isinstance(framework, str):
        raise ArgumentTypeError(f"framework={framework!r}: expected 'pt' or 'numpy'", -1)
    f = framework.lower()
    if f in ("pt", "torch", "pytorch"):
        return "pt"
    if f in ("np", "numpy"):
        return "numpy"
    raise UsageError(f"framework {framework!r}: expected 'pt' or 'numpy'", -1)


def _choice(name: str, value, table: Dict[str, int]) -> int:
    if isinstance(value, str) and value in table:
        return table[value]
    cls = UsageError if isinstance(value, str) else ArgumentTypeError
    raise cls(f"{name}={value!r}: expected one of {sorted(table)}", -1)


def _count(name: str, value, what: str, limit: int = 2 ** 64 - 1) -> int:
    """A non-negative int argument; None is its default, 0."""
    if value is None:
        return 0
    if not _is_int(value):
        raise ArgumentTypeError(f"{name}={value!r}: expected an int, {what}", -1)
    n = operator.index(value)
    if not 0 <= n <= limit:
        raise UsageError(f"{name}={value!r}: expected {what}", -1)
    return n


def _threads(threads, name: str = "threads") -> int:
    return _count(name, threads,
                  f"0 (one per CPU, at most 16) or 1..{_MAX_THREADS}", _MAX_THREADS)


def _names(names) -> Optional[list]:
    """names= as a list of str, read once (it may be a generator)."""
    if names is None:
        return None
    if isinstance(names, (str, bytes, bytearray)):
        raise ArgumentTypeError(f"names={names!r}: expected an iterable of tensor names, not "
                                f"one {type(names).__name__} (names=[{names!r}] for one tensor)",
                                -1)
    try:
        out = list(names)
    except TypeError:
        raise ArgumentTypeError(f"names={names!r}: expected an iterable of tensor names",
                                -1) from None
    for i, n in enumerate(out):
        if not isinstance(n, str):
            raise ArgumentTypeError(f"names: item {i} is {n!r}: expected a tensor name (str)", -1)
    return out


_LOAD_OPTIONS = ("io", "threads", "staging_bytes", "chunk_bytes", "gds", "align", "names",
                 "torch_allocator", "unified", "readahead_bytes", "stream_bytes")
# How remote files are reached (fst.Checkpoint's keywords), where a path is a URL.
_OPEN_OPTIONS = ("endpoint", "region", "profile", "unsigned")


def _check_options(where: str, options: dict) -> None:
    """**options that are no load option would otherwise be dropped unseen."""
    for k in options:
        if k not in _LOAD_OPTIONS:
            raise TypeError(f"{where}() got an unexpected keyword argument {k!r}")


def _check_target(device: str, framework: str, unified: bool = False) -> None:
    """numpy arrays live in host memory: refuse a GPU target before any byte
    is read (and before any GPU memory is taken), unless the load is one
    into unified memory, which the CPU can read as it is."""
    if framework == "numpy" and device.startswith("cuda") and not unified:
        raise UsageError(f"device {device!r} with framework='numpy': numpy arrays live on the "
                         "CPU; load with device='cpu' or framework='pt' (a unified-memory load "
                         "on an integrated GPU gives numpy arrays too: docs/platforms.md)", -1)


def _unified(kw: dict) -> bool:
    """Whether a CUDA load with kw takes the unified-memory path: unified="on",
    or "auto" (the options' or FST_UNIFIED's) on an integrated GPU. Such a
    load leaves the torch allocator out, and may give numpy arrays."""
    from . import _fst
    u = kw.get("unified", 0)
    if u == 0:
        u = {"on": 1, "off": 2}.get(os.environ.get("FST_UNIFIED", ""), 0)
    if u != 0:
        return u == 1
    dev = kw["device"]
    if dev != "cuda" and not (dev.startswith("cuda:") and dev[5:].isdigit()):
        return False  # not a CUDA device; a bad name is refused by the load itself
    return _fst.unified_by_default(int(dev[5:]) if dev.startswith("cuda:") else 0)


def _load_kwargs(device, framework, io="auto", threads=0, staging_bytes=0, chunk_bytes=0,
                 gds="auto", align=0, names=None, torch_allocator=True, mmap_private=False,
                 unified="auto", readahead_bytes=0, stream_bytes=0):
    """The low-level load's keyword arguments, every one checked; the
    allocator is added by _prepare, once torch is known to be there."""
    dev = _device(device)
    kw = dict(device=dev, io=_choice("io", io, _IO), threads=_threads(threads),
              staging_bytes=_count("staging_bytes", staging_bytes,
                                   "a byte count >= 0 (0: libfst's default)"),
              chunk_bytes=_count("chunk_bytes", chunk_bytes,
                                 "a byte count >= 0 (0: libfst's default)"),
              gds=_choice("gds", gds, _GDS),
              align=_count("align", align, "a power of two, or 0 for 256", 2 ** 31))
    names = _names(names)
    if names is not None:
        kw["names"] = names
    if mmap_private:
        kw["mmap_private"] = True
    if unified != "auto":
        kw["unified"] = _choice("unified", unified, _UNIFIED)
    for name, value, off, default in (("readahead_bytes", readahead_bytes, _READAHEAD_OFF,
                                       "libfst's default, 1 GiB"),
                                      ("stream_bytes", stream_bytes, _STREAM_OFF,
                                       "libfst's default, one queue")):
        if isinstance(value, str) and value == "off":
            kw[name] = off
        else:
            v = _count(name, value, f"a byte count >= 0 (0: {default}), or 'off'", off - 1)
            if v:
                kw[name] = v
    kw["torch_allocator"] = bool(torch_allocator)
    _check_target(dev, framework, framework == "numpy" and dev.startswith("cuda") and _unified(kw))
    return kw
