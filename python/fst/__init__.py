"""fst: load safetensors checkpoints into CPU or GPU memory, byte-exact.

Zero-copy torch and numpy tensors over libfst (DLPack), with the reference
`safetensors` API (load_file, safe_open, save_file, save; all of it, module
by module, in fst.compat.safetensors), a streaming iterator, and the
fastsafetensors API (SafeTensorsFileLoader, fastsafe_open). See
docs/python.md.
"""
from __future__ import annotations

import errno as _errno
import operator
import os
import sys
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple, Union

from . import _fst

__all__ = [
    "SafetensorError", "UsageError", "ArgumentTypeError", "FormatError", "FileError",
    "NoSuchFileError", "FilePermissionError", "OutOfMemoryError", "DeviceError",
    "UnsupportedError", "MissingDependencyError", "CancelledError", "FileChangedError",
    "NoSuchTensorError",
    "load_file", "load", "safe_open", "save_file", "save", "iter_tensors", "Checkpoint",
    "SafeTensorsFileLoader", "SingleGroup", "fastsafe_open", "trim", "__version__",
    "Comm", "load_sharded",
]

__version__ = _fst.version()


class SafetensorError(Exception):
    """Any failure reported by fst; `code` is the FST_E* status."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class UsageError(SafetensorError, ValueError):
    """A bad argument (FST_EUSAGE)."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong type: a UsageError that is also the
    TypeError Python callers expect for one."""


class NoSuchTensorError(UsageError, KeyError):
    """A tensor name the checkpoint lacks: a UsageError (the reference
    raises its SafetensorError) that is also the KeyError a lookup by name
    raises."""

    def __str__(self):
        # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


class FormatError(SafetensorError, ValueError):
    """The input breaks a safetensors or index rule; the message names the
    file, the tensor and the rule (FST_EFORMAT)."""


class _OSFailure(SafetensorError, OSError):
    """What the fst errors that are OSErrors share: errno, strerror and
    filename as OSError has them, and str() the fst message, which names the
    file and what was being done (OSError's own str() would drop that)."""

    def __init__(self, message: str, code: int = 0, errno: Optional[int] = None,
                 filename: Optional[str] = None):
        super().__init__(message, code)
        if errno:
            self.errno = errno
            self.strerror = os.strerror(errno)
        self.filename = filename

    def __str__(self):
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):
        return type(self), (str(self), self.code, self.errno, self.filename)


class FileError(_OSFailure):
    """A file could not be opened or read (FST_EIO); errno and filename say
    which and why."""


class NoSuchFileError(FileError, FileNotFoundError):
    """A file that is not there (FST_EIO with ENOENT)."""


class FilePermissionError(FileError, PermissionError):
    """A file that may not be read (FST_EIO with EACCES or EPERM)."""


class OutOfMemoryError(SafetensorError, MemoryError):
    """Host memory could not be allocated or pinned (FST_ENOMEM)."""


class DeviceError(SafetensorError, RuntimeError):
    """The GPU driver or a GPU library failed (FST_EDEVICE)."""


class UnsupportedError(SafetensorError, RuntimeError):
    """The platform cannot do what was asked (FST_EUNSUPPORTED)."""


class MissingDependencyError(UnsupportedError, ImportError):
    """A package the load needs cannot be imported: torch for
    framework='pt', ml_dtypes for BF16 and float8 tensors in numpy. Raised
    from the headers, before any tensor data is read; `name` is the package
    to install."""

    def __init__(self, message: str, package: Optional[str] = None):
        super().__init__(message, -6)
        self.name = package  # ImportError's: the module that is missing
        self.msg = message

    def __reduce__(self):
        return type(self), (self.msg, self.name)


class CancelledError(SafetensorError):
    """The load was cancelled (FST_ECANCELED)."""


class FileChangedError(_OSFailure):
    """A file changed while it was being read (FST_ECHANGED)."""


_BY_CODE = {
    -1: UsageError, -2: FormatError, -3: FileError, -4: OutOfMemoryError,
    -5: DeviceError, -6: UnsupportedError, -7: CancelledError, -9: FileChangedError,
}
_BY_ERRNO = {_errno.ENOENT: NoSuchFileError, _errno.EACCES: FilePermissionError,
             _errno.EPERM: FilePermissionError}


def _error(message: str, code: int, sys_errno: int, filename: Optional[str]):
    """The exception for a libfst failure (the extension calls it)."""
    cls = _BY_CODE.get(code, SafetensorError)
    if cls is FileError:
        cls = _BY_ERRNO.get(sys_errno, FileError)
    if issubclass(cls, _OSFailure):
        return cls(message, code, sys_errno, filename)
    return cls(message, code)


_fst._set_errors(SafetensorError, _error)

_IO = {"auto": 0, "pread": 1, "uring": 2, "mmap": 3}
_GDS = {"auto": 0, "on": 1, "off": 2}
_DL_INT, _DL_UINT = 0, 1
_MAX_THREADS = 64  # libfst's limit (MAX_THREADS in src/engine.c)


def trim() -> None:
    """Free the pinned staging memory kept between loads."""
    _fst.trim()


# ---- arguments: checked before anything is opened or read

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
    return "cuda:0" if s == "cuda" else s


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
                 "torch_allocator")


def _check_options(where: str, options: dict) -> None:
    """**options that are no load option would otherwise be dropped unseen."""
    for k in options:
        if k not in _LOAD_OPTIONS:
            raise TypeError(f"{where}() got an unexpected keyword argument {k!r}")


# ---- dtypes: DLPack carries the common ones; the rest are views

# numpy has no dtype of its own for these: ml_dtypes gives them
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
              "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}
_TORCH_UNSIGNED = ("U16", "U32", "U64")  # torch >= 2.3


def _torch_dtypes():
    import torch
    names = {
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _no_torch_dtype(name: str, dtype: str, torch) -> UnsupportedError:
    return UnsupportedError(f"tensor {name!r}: {dtype} has no torch dtype in torch "
                            f"{getattr(torch, '__version__', '?')} (torch >= 2.3 has it)", -6)


def _no_ml_dtypes(name: str, dtype: str) -> MissingDependencyError:
    return MissingDependencyError(f"tensor {name!r} is {dtype}: numpy needs ml_dtypes for it: "
                                  "pip install ml_dtypes (or load with framework='pt')",
                                  "ml_dtypes")


def _to_torch(t: "_fst.Tensor"):
    import torch
    dtype = t.dtype
    if dtype in _TORCH_UNSIGNED:
        wanted = _torch_dtypes().get(dtype)
        if wanted is None:
            raise _no_torch_dtype(t.name, dtype, torch)
        bits = int(dtype[1:])
        return torch.from_dlpack(t.reinterpret(_DL_INT, bits)).view(wanted)
    if dtype.startswith("F8_"):
        raw = torch.from_dlpack(t)  # uint8, same shape
        wanted = _torch_dtypes().get(dtype)
        return raw.view(wanted) if wanted is not None else raw
    raw = torch.from_dlpack(t)
    # F4 rows of whole bytes are torch's float4_e2m1fn_x2 (two values a byte,
    # the last dimension in bytes), as the reference gives them; otherwise F4
    # and F6 stay uint8: the last dimension in bytes, or flat (docs/python.md)
    if dtype == "F4" and t.shape and t.shape[-1] % 2 == 0:
        f4 = getattr(torch, "float4_e2m1fn_x2", None)
        if f4 is not None:
            return raw.view(f4)
    return raw


def _to_numpy(t: "_fst.Tensor"):
    import numpy as np
    if not t.device.startswith("cpu"):
        raise UsageError(f"tensor {t.name!r} is on {t.device}: numpy arrays live on the CPU; "
                         "load with device='cpu' or framework='pt'", -1)
    dtype = t.dtype
    if dtype in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise _no_ml_dtypes(t.name, dtype) from None
        bits = 16 if dtype == "BF16" else 8
        return np.from_dlpack(t.reinterpret(_DL_UINT, bits)).view(getattr(ml_dtypes,
                                                                          _ML_DTYPES[dtype]))
    return np.from_dlpack(t)


def _check_target(device: str, framework: str) -> None:
    """numpy arrays live in host memory: refuse a GPU target before any byte
    is read (and before any GPU memory is taken)."""
    if framework == "numpy" and device.startswith("cuda"):
        raise UsageError(f"device {device!r} with framework='numpy': numpy arrays live on the "
                         "CPU; load with device='cpu' or framework='pt'", -1)


def _need_torch():
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError(f"framework='pt' needs torch: pip install torch "
                                     f"(import torch: {e})", "torch") from e
    return torch


def _check_dtypes(framework: str, cks: Sequence["Checkpoint"], names: Optional[list]) -> None:
    """From the headers alone, refuse a load whose tensors could not be
    handed out, so that it fails before reading them rather than after:
    BF16 and float8 in numpy need ml_dtypes, unsigned ints in torch need
    torch >= 2.3. Only the tensors that will be loaded count (names=)."""
    if framework == "pt":
        torch = _need_torch()
        missing = {d for d in _TORCH_UNSIGNED if not hasattr(torch, "uint" + d[1:])}
        if not missing:
            return
    else:
        try:
            import ml_dtypes  # noqa: F401
            return
        except ImportError:
            missing = set(_ML_DTYPES)
    wanted = None if names is None else set(names)
    for ck in cks:
        for name in ck.keys():
            if wanted is not None and name not in wanted:
                continue
            dtype = ck._ck.info(name)[0]
            if dtype in missing:
                if framework == "pt":
                    raise _no_torch_dtype(name, dtype, torch)
                raise _no_ml_dtypes(name, dtype)


def _convert(t: "_fst.Tensor", framework: str):
    return _to_torch(t) if framework == "pt" else _to_numpy(t)


def _torch_allocator(device: str):
    """Device memory from torch's caching allocator, so torch.cuda memory
    accounting sees it."""
    import torch

    def alloc(size, align, device_type, device_id):
        return torch.cuda.caching_allocator_alloc(size, device=device_id)

    def free(ptr, size, device_type, device_id):
        torch.cuda.caching_allocator_delete(ptr)

    return (alloc, free)


def _load_kwargs(device, framework, io="auto", threads=0, staging_bytes=0, chunk_bytes=0,
                 gds="auto", align=0, names=None, torch_allocator=True, mmap_private=False):
    """The low-level load's keyword arguments, every one checked; the
    allocator is added by _prepare, once torch is known to be there."""
    dev = _device(device)
    _check_target(dev, framework)
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
    kw["torch_allocator"] = bool(torch_allocator)
    return kw


# ---- the reference's backend=: which of fst's read paths serves it

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


def _backend_options(backend, device, options: dict) -> dict:
    """The load options a reference backend stands for. "mmap" on the CPU is
    fst's io=mmap over private copy-on-write mappings: tensors over the page
    cache that may be written, as the reference's are (fst's read-only
    io=mmap views would kill the process on a write). On a GPU the bytes
    must be copied anyway, so "mmap" is fst's own GPU path; "pread" is
    io=pread everywhere."""
    backend = _backend(backend)
    if backend is None or options.get("io") is not None:
        return options  # fst's own io=, when given, says more than a backend
    if backend == "pread":
        return {**options, "io": "pread"}
    if _device(device) == "cpu":
        return {**options, "io": "mmap", "mmap_private": True}
    return dict(options)


def _prepare(where: str, cks: Sequence["Checkpoint"], framework: str, kw: dict) -> dict:
    """What every load does after opening its checkpoints and before reading
    any tensor data: the names exist, the framework can take the tensors.
    Returns kw for the low-level load."""
    names = kw.get("names")
    if names is not None:
        # a typo should fail here, not later as a missing key
        unknown = [n for n in names if all(ck._ck.info(n) is None for ck in cks)]
        if unknown:
            raise UsageError(f"{where}: no tensor named {unknown[0]!r}"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
                             -1)
    _check_dtypes(framework, cks, names)
    kw = dict(kw)
    if kw.pop("torch_allocator") and framework == "pt" and kw["device"].startswith("cuda"):
        kw["allocator"] = _torch_allocator(kw["device"])
    return kw


class Checkpoint:
    """An opened checkpoint (file, directory or index): names, dtypes, shapes
    and metadata, validated, without reading any tensor data."""

    def __init__(self, path: Union[str, os.PathLike]):
        self._ck = _fst.Checkpoint(os.fspath(path))
        self.path = os.fspath(path)

    def keys(self):
        return self._ck.keys()

    def files(self):
        return self._ck.files()

    def metadata(self, file_index: int = 0) -> Optional[Dict[str, str]]:
        return self._ck.metadata(file_index)

    def info(self, name: str):
        """(dtype, shape, nbytes) of a tensor."""
        i = self._ck.info(name)
        if i is None:
            raise KeyError(name)
        return i[0], i[1], i[2]


def _open(path) -> Checkpoint:
    return path if isinstance(path, Checkpoint) else Checkpoint(path)


def load(path, device="cpu", *, framework="pt", io="auto", threads=0, staging_bytes=0,
         chunk_bytes=0, gds="auto", align=0, names: Optional[Iterable[str]] = None,
         torch_allocator=True) -> Dict[str, object]:
    """Load every tensor (or those in `names`) of a checkpoint: a dict of
    name -> torch tensor or numpy array, zero-copy over one allocation."""
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, io, threads, staging_bytes, chunk_bytes, gds, align, names,
                      torch_allocator)
    if fw == "pt":
        _need_torch()  # before the file: without torch nothing of it can be used
    ck = _open(path)
    return _load_prepared(ck, fw, _prepare(ck.path, [ck], fw, kw))


def _load_prepared(ck: Checkpoint, framework: str, kw: dict) -> Dict[str, object]:
    buf = _fst.load(ck._ck, **kw)
    return {name: _convert(buf.tensor(name), framework) for name in buf.names()}


def load_file(filename, device="cpu", framework="pt", *, backend=None,
              **options) -> Dict[str, object]:
    """Like safetensors.torch.load_file (framework='pt') or
    safetensors.numpy.load_file (framework='numpy'); backend='mmap' or
    'pread' as there, or fst's load options (io=...)."""
    _check_options("load_file", options)
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, **_backend_options(backend, device, options))
    if fw == "pt":
        _need_torch()
    ck = _open(filename)
    return _load_prepared(ck, fw, _prepare(ck.path, [ck], fw, kw))


def iter_tensors(paths: Union[str, os.PathLike, Sequence], device="cpu", framework="pt",
                 progress=False, **options) -> Iterator[Tuple[str, object]]:
    """Yield (name, tensor) as tensors become ready, checkpoint after
    checkpoint; with progress=True and tqdm installed, show a bar. Every
    path is opened and every check made when the iteration starts, before
    the first tensor is read."""
    _check_options("iter_tensors", options)
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, **options)
    if fw == "pt":
        _need_torch()
    if isinstance(paths, (str, bytes, os.PathLike, Checkpoint)):
        paths = [paths]
    cks = [_open(p) for p in paths]
    kw = _prepare(", ".join(ck.path for ck in cks) or "iter_tensors", cks, fw, kw)
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            wanted = kw.get("names")
            wanted = None if wanted is None else set(wanted)
            total = 0
            for ck in cks:
                total += sum(ck.info(n)[2] for n in ck.keys() if wanted is None or n in wanted)
            bar = tqdm(total=total, unit="B", unit_scale=True, desc="fst")
        except ImportError:
            bar = None
    try:
        for ck in cks:
            loader = _fst.start(ck._ck, **kw)
            try:
                while True:
                    t = loader.next()
                    if t is None:
                        break
                    if bar is not None:
                        bar.update(t.nbytes)
                    yield t.name, _convert(t, fw)
                loader.finish()
            finally:
                loader = None
    finally:
        if bar is not None:
            bar.close()


# ---- writing

_NP_TO_ST = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32", "int64": "I64",
    "uint64": "U64", "float64": "F64", "complex64": "C64", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4",
}

# The reference writer lays tensors out by this rank, highest first, then by
# name: its dtype enum's order. Same-sized types are not interchangeable
# (F32 before I32 whatever the names), so a sort by element size alone would
# give other bytes than the reference for the same tensors.
_WRITE_RANK = {d: i for i, d in enumerate(
    ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
     "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
     "F64", "I64", "U64"))}


def _write_order(entries: list) -> list:
    """entries of (name, dtype, ...) in the reference writer's order."""
    return sorted(entries, key=lambda e: (-_WRITE_RANK.get(e[1], -1), e[0]))


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch")


def _torch_entry(name, t):
    """(name, dtype, shape, bytes-like) of a torch tensor the caller has
    checked: dense and contiguous. F4 (float4_e2m1fn_x2, two values a byte)
    is written with its logical shape, the last dimension doubled."""
    import torch
    key = str(t.dtype).replace("torch.", "")
    if key not in _NP_TO_ST:
        raise UsageError(f"tensor {name!r}: dtype {t.dtype} cannot be saved", -1)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")  # a meta tensor fails here, as in the reference
    t = t.contiguous()
    shape = tuple(t.shape)
    if key == "float4_e2m1fn_x2" and shape:
        shape = shape[:-1] + (shape[-1] * 2,)
    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return name, _NP_TO_ST[key], shape, raw


def _numpy_entry(name, value):
    import numpy as np
    # np.asarray keeps 0-d arrays 0-d (np.ascontiguousarray would make them
    # shape (1,)); the file is little-endian whatever the array's byte order,
    # and any strides are written as the values they show (the reference
    # writes the memory under a strided array as if it were contiguous).
    a = np.asarray(value)
    key = a.dtype.name
    if key not in _NP_TO_ST or key == "float4_e2m1fn_x2":
        raise UsageError(f"tensor {name!r}: dtype {a.dtype} cannot be saved", -1)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("<"))
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a).reshape(a.shape)
    return name, _NP_TO_ST[key], tuple(a.shape), a.reshape(-1).view(np.uint8)


# ---- what the reference refuses to save from torch: sparse, shared, strided

def _torch_refusals(tensors: Dict[str, object]) -> None:
    """Raise what the reference raises for torch tensors it will not save:
    sparse ones (ValueError), ones sharing memory (RuntimeError: a file
    cannot share bytes, save_model is the way), non-contiguous ones
    (ValueError: .contiguous() first)."""
    from .compat.safetensors.torch import _find_shared_tensors
    import torch
    sparse = [k for k, v in tensors.items() if v.layout != torch.strided]
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not "
            "support. You can make it a dense tensor before saving with `.to_dense()` but be "
            "aware this might make a much larger file than needed.")
    shared = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and "
            f"potential differences when loading them again: {shared}. A potential way to "
            "correctly save your model is to use `save_model` (fst.compat.safetensors.torch). "
            "More information at https://huggingface.co/docs/safetensors/torch_shared_tensors")
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. "
                "It either means you are trying to save tensors which are reference of each "
                "other in which case it's recommended to save only the full tensors, and "
                "reslice at load time, or simply call `.contiguous()` on your tensor to pack it "
                "before saving.")


def _entries(tensors) -> list:
    """The writer's entries for a dict of torch tensors and numpy arrays, in
    the reference's order, after the reference's checks."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    torch_part = {k: v for k, v in tensors.items() if _is_torch(v)}
    if torch_part:
        _torch_refusals(torch_part)
    entries = [_torch_entry(k, v) if k in torch_part else _numpy_entry(k, v)
               for k, v in tensors.items()]
    return _write_order(entries)


def _check_metadata(metadata) -> Optional[dict]:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError(f"metadata must be a dict of str to str, not {metadata!r}")
    return metadata


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


# ---- tensor parallelism over NCCL


class Comm:
    """An NCCL communicator for tensor-parallel loads, made over an existing
    torch.distributed process group (any backend): rank 0 makes the NCCL id
    and the group carries it, so no second rendezvous is needed."""

    def __init__(self, group=None, device=None, timeout_ms: int = 0):
        import torch
        import torch.distributed as dist
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        box = [_fst.comm_unique_id() if self.rank == 0 else None]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        if device is None:
            device = torch.cuda.current_device()
        self.device = int(str(device).split(":")[-1]) if not isinstance(device, int) else device
        self._comm = _fst.Comm(self.world, self.rank, box[0], self.device, timeout_ms)


def load_sharded(path, comm: Comm, dims: Optional[Dict[str, Optional[int]]] = None,
                 framework="pt", io="auto", threads=0, staging_bytes=0,
                 stats: Optional[dict] = None) -> Dict[str, object]:
    """Load a checkpoint across the ranks of `comm`, each byte read from
    storage once in the group. dims maps a tensor name to the dimension to
    shard (rank r gets block r of ceil(size / world)), or None to replicate;
    names not in dims are replicated. Every rank must call it alike. A dict
    passed as stats receives "describe" (with the bytes this rank read from
    storage) and "bytes" (this rank's tensor bytes)."""
    fw = _framework(framework)
    # the tensors land on comm's GPU, where numpy cannot take them
    _check_target(f"cuda:{getattr(comm, 'device', 0)}", fw)
    io_code = _choice("io", io, _IO)
    nthreads = _threads(threads)
    staging = _count("staging_bytes", staging_bytes, "a byte count >= 0 (0: libfst's default)")
    dims = {} if dims is None else dims
    if not hasattr(dims, "get") or not hasattr(dims, "items"):
        raise ArgumentTypeError(f"dims={dims!r}: expected a dict of tensor name to a dimension "
                                "(int) or None", -1)
    for k, v in dims.items():
        if v is not None and not _is_int(v):
            raise ArgumentTypeError(f"dims[{k!r}]={v!r}: expected a dimension (int) or None", -1)
    _need_torch()  # before the file, as load does
    ck = _open(path)
    _check_dtypes(fw, [ck], None)
    table = [(-1 if dims.get(n) is None else operator.index(dims[n])) for n in ck.keys()]
    buf = _fst.load_sharded(ck._ck, comm._comm, table, io=io_code, threads=nthreads,
                            staging_bytes=staging)
    if stats is not None:
        stats["describe"] = buf.describe()  # says the bytes this rank read
        stats["bytes"] = buf.nbytes()
    return {name: _convert(buf.tensor(name), fw) for name in buf.names()}


# The reference's safe_open is fst's: one object, defined with the rest of
# the reference API (imported last: it builds on the functions above).
from .compat.safetensors import safe_open  # noqa: E402

# ---- the fastsafetensors API: switching is an import change. Last, since
# fst.compat.fastsafetensors builds on everything above.
from .compat.fastsafetensors import (  # noqa: E402
    FilesBufferOnDevice, SafeTensorsFileLoader, SingleGroup, fastsafe_open)
