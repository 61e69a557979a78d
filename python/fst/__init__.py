"""fst: load safetensors checkpoints into CPU or GPU memory, byte-exact.

Zero-copy torch and numpy tensors over libfst (DLPack), with the reference
`safetensors` API (load_file, safe_open, save_file), a streaming iterator,
and the fastsafetensors API (SafeTensorsFileLoader, fastsafe_open). See
docs/python.md.
"""
from __future__ import annotations

import errno as _errno
import os
import sys
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple, Union

from . import _fst

__all__ = [
    "SafetensorError", "UsageError", "FormatError", "FileError", "NoSuchFileError",
    "FilePermissionError", "OutOfMemoryError", "DeviceError", "UnsupportedError",
    "CancelledError", "FileChangedError",
    "load_file", "load", "safe_open", "save_file", "save", "iter_tensors", "Checkpoint",
    "SafeTensorsFileLoader", "SingleGroup", "fastsafe_open", "trim", "__version__",
    "Comm", "load_sharded",
]

__version__ = _fst.version()


class SafetensorError(Exception):
    """Any failure reported by libfst; `code` is the FST_E* status."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class UsageError(SafetensorError, ValueError):
    """A bad argument (FST_EUSAGE)."""


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


def trim() -> None:
    """Free the pinned staging memory kept between loads."""
    _fst.trim()


def _device(device) -> str:
    if device is None:
        return "cpu"
    if isinstance(device, int):
        return f"cuda:{device}"
    s = str(device)
    return "cuda:0" if s == "cuda" else s


def _framework(framework: str) -> str:
    f = (framework or "pt").lower()
    if f in ("pt", "torch", "pytorch"):
        return "pt"
    if f in ("np", "numpy"):
        return "numpy"
    raise UsageError(f"framework {framework!r}: expected 'pt' or 'numpy'", -1)


# ---- dtypes: DLPack carries the common ones; the rest are views


def _torch_dtypes():
    import torch
    names = {
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _to_torch(t: "_fst.Tensor"):
    import torch
    dtype = t.dtype
    if dtype in ("U16", "U32", "U64"):
        wanted = _torch_dtypes().get(dtype)
        if wanted is None:
            raise UnsupportedError(
                f"tensor {t.name!r}: {dtype} has no torch dtype in torch {torch.__version__}", -6)
        bits = int(dtype[1:])
        return torch.from_dlpack(t.reinterpret(_DL_INT, bits)).view(wanted)
    if dtype.startswith("F8_"):
        raw = torch.from_dlpack(t)  # uint8, same shape
        wanted = _torch_dtypes().get(dtype)
        return raw.view(wanted) if wanted is not None else raw
    # F4 and F6 come as uint8 with the last dimension in bytes (docs/python.md)
    return torch.from_dlpack(t)


def _to_numpy(t: "_fst.Tensor"):
    import numpy as np
    if not t.device.startswith("cpu"):
        raise UsageError(f"tensor {t.name!r} is on {t.device}: numpy arrays live on the CPU; "
                         "load with device='cpu' or framework='pt'", -1)
    dtype = t.dtype
    if dtype == "BF16" or dtype in ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"):
        try:
            import ml_dtypes
        except ImportError:
            raise UnsupportedError(
                f"tensor {t.name!r}: numpy has no {dtype} dtype; install ml_dtypes or use "
                "framework='pt'", -6) from None
        name = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}[dtype]
        bits = 16 if dtype == "BF16" else 8
        return np.from_dlpack(t.reinterpret(_DL_UINT, bits)).view(getattr(ml_dtypes, name))
    return np.from_dlpack(t)


def _check_target(device: str, framework: str) -> None:
    """numpy arrays live in host memory: refuse a GPU target before any byte
    is read (and before any GPU memory is taken)."""
    if framework == "numpy" and device.startswith("cuda"):
        raise UsageError(f"device {device!r} with framework='numpy': numpy arrays live on the "
                         "CPU; load with device='cpu' or framework='pt'", -1)


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


def _load_kwargs(device, framework, io, threads, staging_bytes, chunk_bytes, gds, align,
                 names, torch_allocator):
    dev = _device(device)
    _check_target(dev, framework)
    if io not in _IO:
        raise UsageError(f"io={io!r}: expected one of {sorted(_IO)}", -1)
    if gds not in _GDS:
        raise UsageError(f"gds={gds!r}: expected one of {sorted(_GDS)}", -1)
    kw = dict(device=dev, io=_IO[io], threads=int(threads or 0),
              staging_bytes=int(staging_bytes or 0), chunk_bytes=int(chunk_bytes or 0),
              gds=_GDS[gds], align=int(align or 0))
    if names is not None:
        kw["names"] = list(names)
    if torch_allocator and framework == "pt" and dev.startswith("cuda"):
        kw["allocator"] = _torch_allocator(dev)
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


def load(path, device="cpu", *, framework="pt", io="auto", threads=0, staging_bytes=0,
         chunk_bytes=0, gds="auto", align=0, names: Optional[Iterable[str]] = None,
         torch_allocator=True) -> Dict[str, object]:
    """Load every tensor (or those in `names`) of a checkpoint: a dict of
    name -> torch tensor or numpy array, zero-copy over one allocation."""
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, io, threads, staging_bytes, chunk_bytes, gds, align, names,
                      torch_allocator)
    ck = path if isinstance(path, Checkpoint) else Checkpoint(path)
    if names is not None:
        # a typo should fail here, not later as a missing key
        unknown = [n for n in kw["names"] if ck._ck.info(n) is None]
        if unknown:
            raise UsageError(f"{ck.path}: no tensor named {unknown[0]!r}"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""), -1)
    buf = _fst.load(ck._ck, **kw)
    return {name: _convert(buf.tensor(name), fw) for name in buf.names()}


def load_file(filename, device="cpu", framework="pt", **options) -> Dict[str, object]:
    """Like safetensors.torch.load_file (framework='pt') or
    safetensors.numpy.load_file (framework='numpy')."""
    return load(filename, device, framework=framework, **options)


class _Slice:
    def __init__(self, owner: "safe_open", name: str):
        self._owner, self._name = owner, name

    def get_shape(self):
        return list(self._owner._ck.info(self._name)[1])

    def get_dtype(self):
        return self._owner._ck.info(self._name)[0]

    def __getitem__(self, index):
        return self._owner.get_tensor(self._name)[index]


class safe_open:
    """Like safetensors.safe_open: keys(), get_tensor(), get_slice(),
    metadata(). The first get_tensor loads the whole checkpoint with the
    fast path onto `device`; later calls return views of it."""

    def __init__(self, filename, framework="pt", device="cpu", **options):
        self._fw = _framework(framework)
        self._device = _device(device)
        _check_target(self._device, self._fw)
        self._ck = Checkpoint(filename)
        self._options = options
        self._tensors = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._tensors = None
        return False

    def keys(self):
        return sorted(self._ck.keys())

    def offset_keys(self):
        return self._ck.keys()

    def metadata(self):
        return self._ck.metadata()

    def get_tensor(self, name: str):
        if self._ck._ck.info(name) is None:
            raise KeyError(name)
        if self._tensors is None:
            self._tensors = load(self._ck, self._device, framework=self._fw, **self._options)
        return self._tensors[name]

    def get_slice(self, name: str) -> _Slice:
        if self._ck._ck.info(name) is None:
            raise KeyError(name)
        return _Slice(self, name)


def iter_tensors(paths: Union[str, os.PathLike, Sequence], device="cpu", framework="pt",
                 progress=False, **options) -> Iterator[Tuple[str, object]]:
    """Yield (name, tensor) as tensors become ready, checkpoint after
    checkpoint; with progress=True and tqdm installed, show a bar."""
    fw = _framework(framework)
    _check_target(_device(device), fw)
    if isinstance(paths, (str, os.PathLike, Checkpoint)):
        paths = [paths]
    cks = [p if isinstance(p, Checkpoint) else Checkpoint(p) for p in paths]
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            wanted = options.get("names")
            wanted = None if wanted is None else set(wanted)
            total = 0
            for ck in cks:
                total += sum(ck.info(n)[2] for n in ck.keys() if wanted is None or n in wanted)
            bar = tqdm(total=total, unit="B", unit_scale=True, desc="fst")
        except ImportError:
            bar = None
    try:
        for ck in cks:
            kw = _load_kwargs(device, fw, options.get("io", "auto"), options.get("threads", 0),
                              options.get("staging_bytes", 0), options.get("chunk_bytes", 0),
                              options.get("gds", "auto"), options.get("align", 0),
                              options.get("names"), options.get("torch_allocator", True))
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
    "float8_e8m0fnu": "F8_E8M0",
}


def _entry(name, value):
    """(name, dtype, shape, bytes-like) for a torch tensor or numpy array."""
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch
        t = value.detach().to("cpu").contiguous()
        key = str(t.dtype).replace("torch.", "")
        if key not in _NP_TO_ST:
            raise UsageError(f"tensor {name!r}: dtype {t.dtype} cannot be saved", -1)
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        return name, _NP_TO_ST[key], tuple(t.shape), raw
    import numpy as np
    # np.asarray keeps 0-d arrays 0-d (np.ascontiguousarray would make them
    # shape (1,)); the file is little-endian whatever the array's byte order.
    a = np.asarray(value)
    key = a.dtype.name
    if key not in _NP_TO_ST:
        raise UsageError(f"tensor {name!r}: dtype {a.dtype} cannot be saved", -1)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("<"))
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a).reshape(a.shape)
    return name, _NP_TO_ST[key], tuple(a.shape), a.reshape(-1).view(np.uint8)


def save_file(tensors: Dict[str, object], filename, metadata: Optional[Dict[str, str]] = None):
    """Like safetensors' save_file: torch tensors or numpy arrays, laid out as
    the reference writer lays them (larger element sizes first, then name)."""
    entries = [_entry(k, v) for k, v in tensors.items()]
    size = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4,
            "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
    entries.sort(key=lambda e: (-size.get(e[1], 1), e[0]))
    _fst.save(entries, metadata, os.fspath(filename))


save = save_file


# ---- the fastsafetensors API: switching is an import change


class SingleGroup:
    """A process group of one (fastsafetensors.SingleGroup)."""

    def rank(self):
        return 0

    def size(self):
        return 1


def _group(pg):
    if pg is None:
        return 0, 1
    if isinstance(pg, type):  # SingleGroup passed as the class, as old examples do
        pg = pg()
    if hasattr(pg, "rank") and hasattr(pg, "size"):
        return pg.rank(), pg.size()
    return 0, 1


def _convert_to(t, device=None, dtype=None):
    """fastsafetensors' optional device/dtype conversion of a returned tensor."""
    if device is None and dtype is None:
        return t
    if hasattr(t, "to"):  # torch
        return t.to(device=None if device is None else _device(device), dtype=dtype)
    if device is not None and _device(device) != "cpu":
        raise UsageError(f"device {device!r}: numpy arrays live on the CPU", -1)
    return t if dtype is None else t.astype(dtype)


class FilesBufferOnDevice:
    """The loaded files (fastsafetensors' copy_files_to_device result)."""

    def __init__(self, tensors: Dict[str, object], filenames: Dict[str, str], pg,
                 key_to_rank_lidx: Optional[Dict[str, Tuple[int, int]]] = None,
                 shapes: Optional[Dict[str, list]] = None):
        self._tensors = tensors
        self._filenames = filenames
        self._rank, self._world = _group(pg)
        # name -> (rank, index of the file in that rank's list), as
        # fastsafetensors keeps it (vLLM iterates fb.key_to_rank_lidx)
        self.key_to_rank_lidx = dict(key_to_rank_lidx or {k: (0, 0) for k in tensors})
        self._shapes = shapes or {}

    def get_keys(self):
        return list(self._tensors)

    def get_filename(self, tensor_name):
        """The file holding the tensor; "" for an unknown name, as in
        fastsafetensors."""
        return self._filenames.get(tensor_name, "")

    def get_shape(self, tensor_name):
        if tensor_name not in self._tensors:
            raise ValueError(f"get_shape: key {tensor_name} was not found in files")
        return list(self._shapes.get(tensor_name, self._tensors[tensor_name].shape))

    def get_tensor(self, tensor_name, device=None, dtype=None):
        return _convert_to(self._tensors[tensor_name], device, dtype)

    def get_sharded(self, tensor_name, dim=-1, device=None, dtype=None):
        """This rank's block of the tensor along dim: block size
        ceil(size / world), as fastsafetensors cuts it (the last rank's
        block may be shorter, or empty). dim=-1 means the whole tensor on
        every rank (fastsafetensors' broadcast), other negative dims count
        from the end. Works for torch tensors and numpy arrays."""
        t = self._tensors[tensor_name]
        if self._world == 1 or dim == -1 or t.ndim == 0:
            return _convert_to(t, device, dtype)
        d = dim % t.ndim
        size = t.shape[d]
        block = (size + self._world - 1) // self._world
        start = min(self._rank * block, size)
        index = (slice(None),) * d + (slice(start, min(start + block, size)),)
        return _convert_to(t[index], device, dtype)

    def close(self):
        self._tensors = {}


class SafeTensorsFileLoader:
    """fastsafetensors.SafeTensorsFileLoader with the same parameter
    meanings: nogds=True never touches cuFile, max_threads reader threads,
    bbuf_size_kb the host staging budget. Every rank loads every file added
    (see docs/python.md: the NCCL distribution is not there yet)."""

    def __init__(self, pg=None, device="cpu", bbuf_size_kb=163840, max_threads=16,
                 nogds=False, set_numa=True, disable_cache=True, debug_log=False,
                 framework="pytorch", **ignored):
        self.pg = pg if pg is not None else SingleGroup()
        self._device = _device(device)
        self._options = dict(threads=max_threads, staging_bytes=int(bbuf_size_kb) * 1024,
                             gds="off" if nogds else "auto")
        self._framework = _framework(framework)
        _check_target(self._device, self._framework)
        self._files: Dict[int, list] = {}

    def add_filenames(self, filenames: Dict[int, Sequence[str]]):
        for rank, files in sorted(filenames.items(), key=lambda kv: kv[0]):
            if isinstance(files, (str, os.PathLike)):
                files = [files]
            self._files.setdefault(rank, []).extend(os.fspath(f) for f in files)

    def reset(self):
        """Forget the files added, to reuse the loader for others."""
        self._files = {}

    def _checkpoints(self):
        for rank, files in sorted(self._files.items(), key=lambda kv: kv[0]):
            for lidx, f in enumerate(files):
                yield rank, lidx, f, Checkpoint(f)

    def get_keys(self):
        keys = []
        for _, _, _, ck in self._checkpoints():
            keys.extend(ck.keys())
        return keys

    def get_shape(self, tensor_name):
        for _, _, _, ck in self._checkpoints():
            i = ck._ck.info(tensor_name)
            if i is not None:
                return list(i[1])
        raise KeyError(tensor_name)

    def copy_files_to_device(self, dtype=None, use_buf_register=True,
                             max_copy_block_size=0) -> FilesBufferOnDevice:
        tensors, owners, where, shapes = {}, {}, {}, {}
        for rank, lidx, f, ck in self._checkpoints():
            for k in ck.keys():
                if k in where:
                    raise UsageError(f"FilesBufferOnDevice: key {k} must be unique among files "
                                     f"({owners[k]} and {f})", -1)
                where[k], owners[k] = (rank, lidx), f
                shapes[k] = list(ck.info(k)[1])
            loaded = load(ck, self._device, framework=self._framework, **self._options)
            for k, v in loaded.items():
                tensors[k] = _convert_to(v, None, dtype)
        return FilesBufferOnDevice(tensors, owners, self.pg, where, shapes)

    def close(self):
        self._files = {}


class fastsafe_open:
    """fastsafetensors.fastsafe_open: a context manager over one file, a
    list of files or a {rank: files} map, with keys(), get_tensor() and
    metadata() ({filename: metadata}); the buffer's other methods
    (get_sharded, get_filename, ...) are reachable on it too."""

    def __init__(self, filenames, framework="pt", pg=None, device="cpu", nogds=False,
                 debug_log=False, max_copy_block_size=0, *, max_threads=16,
                 bbuf_size_kb=163840, **ignored):
        if isinstance(filenames, (str, os.PathLike)):
            filenames = {0: [filenames]}
        elif not isinstance(filenames, dict):
            filenames = {0: list(filenames)}
        self.loader = SafeTensorsFileLoader(pg, device, bbuf_size_kb, max_threads, nogds,
                                            framework=framework)
        self.loader.add_filenames(filenames)
        self.fb = self.loader.copy_files_to_device()

    def metadata(self) -> Dict[str, Optional[Dict[str, str]]]:
        return {f: ck.metadata() for _, _, f, ck in self.loader._checkpoints()}

    def keys(self):
        return list(self.fb.key_to_rank_lidx)

    def get_keys(self):
        return self.keys()

    def get_tensor(self, name):
        return self.fb.get_tensor(name)

    def __getattr__(self, attr):
        fb = self.__dict__.get("fb")
        if fb is None:
            raise AttributeError(attr)
        return getattr(fb, attr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fb.close()
        self.loader.close()
        return False


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
    ck = path if isinstance(path, Checkpoint) else Checkpoint(path)
    dims = dims or {}
    table = [(-1 if dims.get(n) is None else int(dims[n])) for n in ck.keys()]
    if io not in _IO:
        raise UsageError(f"io={io!r}: expected one of {sorted(_IO)}", -1)
    buf = _fst.load_sharded(ck._ck, comm._comm, table, io=_IO[io], threads=int(threads or 0),
                            staging_bytes=int(staging_bytes or 0))
    if stats is not None:
        stats["describe"] = buf.describe()  # says the bytes this rank read
        stats["bytes"] = buf.nbytes()
    return {name: _convert(buf.tensor(name), fw) for name in buf.names()}
