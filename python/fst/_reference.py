"""The reference safetensors API's functions as fst has them (load_file,
save_file, save; safe_open is fst.compat.safetensors'), with the
reference's backend= mapped onto fst's read paths."""
from __future__ import annotations

import os
from typing import Dict, Optional

from . import _fst
from ._args import _check_options, _device, _framework, _load_kwargs
from ._errors import ArgumentTypeError, UsageError
from ._load import _load_prepared, _open, _prepare, _remote
from ._tensors import _need_torch
from ._write import _check_metadata, _entries

_BACKENDS = ("mmap", "pread")


def _backend(backend) -> Optional[str]:
    if backend is None:
        return None
    if not isinstance(backend, str):
        raise ArgumentTypeError(f"backend={backend!r}: expected 'mmap' or 'pread'", -1)
    if backend not in _BACKENDS:
        raise UsageError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")',
                         -1)
    return backend


def _is_url(path) -> bool:
    return isinstance(path, str) and "://" in path


def _backend_options(backend, device, options: dict, url: bool = False) -> dict:
    """The load options a reference backend stands for. "mmap" on the CPU is
    fst's io=mmap over private copy-on-write mappings: tensors over the page
    cache that may be written, as the reference's are (fst's read-only
    io=mmap views would kill the process on a write). On a GPU the bytes
    must be copied anyway, so "mmap" is fst's own GPU path; "pread" is
    io=pread everywhere. A URL has neither: its bytes are fetched (io=auto)."""
    backend = _backend(backend)
    if backend is None or url or options.get("io") is not None:
        return options  # fst's own io=, when given, says more than a backend
    if backend == "pread":
        return {**options, "io": "pread"}
    if _device(device) == "cpu":
        return {**options, "io": "mmap", "mmap_private": True}
    return dict(options)


def load_file(filename, device="cpu", framework="pt", *, backend=None,
              **options) -> Dict[str, object]:
    """Like safetensors.torch.load_file (framework='pt') or
    safetensors.numpy.load_file (framework='numpy'); backend='mmap' or
    'pread' as there, or fst's load options (io=...); for a URL the open
    options too (endpoint=...), and its tensors are fetched whatever the
    backend (there is no mapping of a remote file)."""
    remote = _remote(options)
    _check_options("load_file", options)
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, **_backend_options(backend, device, options,
                                                     _is_url(filename)))
    if fw == "pt":
        _need_torch()
    ck = _open(filename, remote)
    return _load_prepared(ck, fw, _prepare(ck._ck.path(), [ck], fw, kw))


def save_file(tensors: Dict[str, object], filename, metadata: Optional[Dict[str, str]] = None):
    """Like safetensors' save_file, for torch tensors and numpy arrays: the
    same bytes as the reference writer, and the reference's refusals for
    torch tensors (sparse, sharing memory, not contiguous)."""
    metadata = _check_metadata(metadata)
    _fst.save(_entries(tensors), metadata, os.fspath(filename))


def save(tensors: Dict[str, object], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """Like safetensors' save: the bytes save_file would write."""
    metadata = _check_metadata(metadata)
    return _fst.save(_entries(tensors), metadata, None)
