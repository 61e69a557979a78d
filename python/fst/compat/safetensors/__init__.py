"""The `safetensors` package's API (release 0.8) over fst, name for name.

`import fst.compat.safetensors as safetensors` (and `.torch`, `.numpy` for
`safetensors.torch`, `safetensors.numpy`) gives the reference's functions
with its arguments, meanings and exception types; every load goes through
libfst. The differences that remain are deliberate: docs/python.md lists
them with their reasons.
"""
from __future__ import annotations

import ctypes
import operator
import os
import re
import sys
import threading
from typing import Dict, List, Optional

from ... import (
    Checkpoint,
    NoSuchTensorError,
    SafetensorError,
    UsageError,
    _backend,
    _backend_options,
    _is_url,
    _check_metadata,
    _check_options,
    _check_target,
    _convert,
    _device,
    _fst,
    _framework,
    _load_kwargs,
    _prepare,
    _write_order,
)

__all__ = ["SafetensorError", "TensorSpec", "__version__", "deserialize", "safe_open",
           "_safe_open_handle", "serialize", "serialize_file"]

# The safetensors release whose API this is, so that code checking
# safetensors.__version__ sees the API it gets; fst's own is fst.__version__.
__version__ = "0.8.0"

# TensorSpec's dtype names (torch's and numpy's) and the file's codes
_SPEC_DTYPES = {
    "bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16",
    "float32": "F32", "float64": "F64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2": "F8_E5M2",
    "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4",
    "complex64": "C64",
}
_SUB_BYTE = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def _usize(name: str, value) -> int:
    """An unsigned integer argument, refused as the reference refuses it:
    TypeError for a non-integer, OverflowError for a negative one."""
    if isinstance(value, float) or not hasattr(type(value), "__index__"):
        raise TypeError(f"'{type(value).__name__}' object cannot be interpreted as an integer")
    n = operator.index(value)
    if n < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return n


class TensorSpec:
    """One tensor for serialize / serialize_file: its dtype (a torch or
    numpy name such as "float32", checked here), shape, and the address and
    length of its contiguous bytes, which must stay valid until the
    serialize call returns. F4 (float4_e2m1fn_x2, two values a byte) is
    given with its storage shape and recorded with the last dimension
    doubled, the number of values."""

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape, data_ptr: int, data_len: int) -> None:
        if not isinstance(dtype, str):
            raise TypeError(f"TensorSpec dtype={dtype!r}: expected a str")
        code = _SPEC_DTYPES.get(dtype)
        if code is None:
            raise UsageError(f"Unknown dtype {dtype!r}. Supported dtypes: "
                             + ", ".join(_SPEC_DTYPES), -1)
        dims = [_usize("shape", d) for d in shape]
        if code == "F4" and dims:
            dims[-1] *= 2
        object.__setattr__(self, "_dtype", code)
        object.__setattr__(self, "_shape", dims)
        object.__setattr__(self, "_data_ptr", _usize("data_ptr", data_ptr))
        object.__setattr__(self, "_data_len", _usize("data_len", data_len))

    def __setattr__(self, name, value):
        raise AttributeError(f"TensorSpec is immutable: cannot set {name!r}")

    @property
    def dtype(self) -> str:
        """The file's dtype code ("F32", "BF16", ...)."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        return self._data_ptr

    @property
    def data_len(self) -> int:
        return self._data_len

    def __repr__(self):
        return (f"TensorSpec(dtype='{self._dtype}', shape={self._shape}, "
                f"data_ptr={self._data_ptr}, data_len={self._data_len})")


def _spec_entries(tensor_dict) -> list:
    if not isinstance(tensor_dict, dict):
        raise TypeError(f"tensor_dict must be a dict of str to TensorSpec, not "
                        f"{type(tensor_dict).__name__}")
    entries = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str) or not isinstance(spec, TensorSpec):
            raise TypeError(f"tensor_dict[{name!r}] is a {type(spec).__name__}: expected a "
                            "TensorSpec (raw dicts are not taken since safetensors 0.8)")
        # the caller vouches for the address, as with the reference
        raw = (ctypes.c_ubyte * spec.data_len).from_address(spec.data_ptr) \
            if spec.data_len else b""
        entries.append((name, spec.dtype, spec.shape, raw))
    return _write_order(entries)


def serialize(tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None
              ) -> bytes:
    """The bytes of a safetensors file holding the tensors described, laid
    out as the reference lays them."""
    entries = _spec_entries(tensor_dict)
    return _fst.save(entries, _check_metadata(metadata), None)


def serialize_file(tensor_dict: Dict[str, TensorSpec], filename,
                   metadata: Optional[Dict[str, str]] = None) -> None:
    """serialize() into a file (written beside it, then renamed); the GIL
    is released while the bytes are written."""
    entries = _spec_entries(tensor_dict)
    _fst.save(entries, _check_metadata(metadata), os.fspath(filename))


def _from_bytes(data) -> Checkpoint:
    """A Checkpoint over the bytes of one file, validated by libfst."""
    ck = Checkpoint.__new__(Checkpoint)
    ck._ck = _fst.Checkpoint.from_bytes(data)
    ck.path = "<bytes>"
    return ck


def deserialize(bytes) -> list:  # noqa: A002 - the reference's parameter name
    """[(name, {"shape": [...], "dtype": "F32", "data": bytearray}), ...] of
    the file held in `bytes`, in data-offset order."""
    ck = _from_bytes(bytes)
    view = memoryview(bytes).cast("B")
    out = []
    for name in ck.keys():
        dtype, shape, nbytes, _, offset = ck._ck.info(name)
        out.append((name, {"shape": list(shape), "dtype": dtype,
                           "data": bytearray(view[offset:offset + nbytes])}))
    return out


def _load_bytes(data, framework: str) -> dict:
    """Every tensor of a file held in memory, through libfst's reader (its
    pread path copies from memory as from a file), on the CPU."""
    fw = _framework(framework)
    ck = _from_bytes(data)
    kw = _prepare(ck._ck.path(), [ck], fw, _load_kwargs("cpu", fw, io="pread"))
    buf = _fst.load(ck._ck, **kw)
    return {name: _convert(buf.tensor(name), fw) for name in buf.names()}


# ---- safe_open

_DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")


def _closed() -> UsageError:
    return UsageError("File is closed", -1)


def _no_tensor(name) -> NoSuchTensorError:
    return NoSuchTensorError(f"File does not contain tensor {name}", -1)


def _open_checkpoint(filename) -> Checkpoint:
    # looked up at each call, as fst's own entry points do, so that a
    # Checkpoint replaced on the package (tests arm faults that way) serves
    # safe_open too
    return sys.modules[__name__.split(".")[0]].Checkpoint(filename)


class _Opened:
    """What a safe_open and its slices share: the checkpoint's header, the
    load options, and the tensors once loaded. Loaded once, under a lock,
    when the first tensor is asked for, whichever thread asks; the
    checkpoint (its open files) is let go then, as the tensors need it no
    more: a program that keeps a safe_open per shard (transformers does)
    does not keep every shard's file open."""

    def __init__(self, ck: Checkpoint, framework: str, kw: dict):
        self.ck, self.framework, self.kw = ck, framework, kw
        self.keys, self.metadata = ck.keys(), ck.metadata()
        self._infos = None
        self._tensors = None
        self._lock = threading.Lock()

    def info(self, name: str):
        """(dtype, shape, ...) of a tensor, or None. A name that is no str,
        or no UTF-8 (a lone surrogate), fails as the reference's does, before
        the first load and after it alike."""
        if not isinstance(name, str):
            raise TypeError(f"argument 'name': '{type(name).__name__}' object is not an "
                            "instance of 'str'")
        ck = self.ck
        if ck is not None:
            return ck._ck.info(name)
        name.encode()
        return self._infos.get(name)

    def tensors(self) -> dict:
        t = self._tensors
        if t is None:
            with self._lock:
                if self._tensors is None:
                    ck = self.ck
                    kw = _prepare(ck._ck.path(), [ck], self.framework, self.kw)
                    buf = _fst.load(ck._ck, **kw)
                    self._tensors = {n: _convert(buf.tensor(n), self.framework)
                                     for n in buf.names()}
                    # the infos before the checkpoint goes: info() reads
                    # self.ck once, then whichever it found
                    self._infos = {n: ck._ck.info(n) for n in self.keys}
                    self.ck = None
                t = self._tensors
        return t


class safe_open:
    """Like safetensors.safe_open(filename, framework, device="cpu", *,
    backend="mmap"): keys(), offset_keys(), metadata(), get_tensor(),
    get_tensors(), get_slice(), and a context manager whose exit closes it.

    The first tensor asked for loads the whole checkpoint with libfst onto
    `device` (backend "mmap" on the CPU: copy-on-write views of the file;
    "pread" or a GPU: one allocation, filled by fst's readers); later calls
    return views of it. Beyond the reference: directories and index files,
    and fst's load options as keywords (io=, threads=, ...). Every argument
    is checked here, before the file is opened."""

    def __init__(self, filename, framework="pt", device="cpu", *, backend="mmap", **options):
        _check_options("safe_open", options)
        fw = _framework(framework)
        dev = _device(device)
        if not _DEVICE_RE.fullmatch(dev):
            raise UsageError(f'device "{dev}": expected cpu, cuda or cuda:N', -1)
        _check_target(dev, fw)
        self._backend = _backend(backend)
        url = _is_url(filename)
        if url:
            self._backend = None  # a URL's bytes are fetched, never mapped
        kw = _load_kwargs(dev, fw, **_backend_options(self._backend, dev, options, url))
        # torch slices of an mmap'd file are torch's own indexing of the
        # tensor, in the reference too; everything else goes through its
        # stricter indexer
        self._torch_indexing = fw == "pt" and self._backend == "mmap"
        self._state = _Opened(_open_checkpoint(filename), fw, kw)

    def _opened(self) -> _Opened:
        if self._state is None:
            raise _closed()
        return self._state

    def __enter__(self):
        return self

    def __exit__(self, exc_type=None, exc_value=None, traceback=None):
        # tensors and slices handed out stay valid; this object is done
        self._state = None

    def keys(self) -> List[str]:
        return sorted(self._opened().keys)

    def offset_keys(self) -> List[str]:
        return list(self._opened().keys)

    def metadata(self) -> Optional[Dict[str, str]]:
        m = self._opened().metadata
        return dict(m) if m is not None else None

    def get_tensor(self, name: str):
        st = self._opened()
        if st.info(name) is None:
            raise _no_tensor(name)
        return st.tensors()[name]

    def get_tensors(self) -> dict:
        """Every tensor, by name, in data-offset order."""
        st = self._opened()
        got = st.tensors()
        return {n: got[n] for n in st.keys if n in got}

    def get_slice(self, name: str) -> "_Slice":
        st = self._opened()
        if st.info(name) is None:
            raise _no_tensor(name)
        return _Slice(st, name, self._torch_indexing)


class _safe_open_handle(safe_open):
    """safe_open over an open file object (anything with fileno() and a
    name, as the reference asks): the file it names is opened."""

    def __init__(self, f, framework="pt", device="cpu", *, backend="mmap"):
        getattr(f, "fileno")  # AttributeError without one, as in the reference
        super().__init__(os.fspath(f.name), framework, device, backend=backend)


# ---- slices

class _Slice:
    """A tensor not yet cut: get_shape(), get_dtype() and [index]."""

    def __init__(self, state: _Opened, name: str, torch_indexing: bool):
        self._state, self._name, self._torch = state, name, torch_indexing
        info = state.info(name)
        self._dtype, self._shape = info[0], list(info[1])

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, index):
        # sub-byte dtypes always by the file's shape (get_shape's units): the
        # loaded tensor counts F4 in bytes of two values
        if self._torch and self._dtype not in _SUB_BYTE:
            return self._state.tensors()[self._name][index]
        picks = _parse_index(index, self._shape)
        shape = _check_picks(picks, self._shape, self._dtype)
        t = self._state.tensors()[self._name]
        if self._dtype in _SUB_BYTE:
            return _cut_bytes(t, picks, self._shape, self._dtype, shape, self._state.framework)
        key = tuple(p if isinstance(p, int) else slice(*p) for p in picks) + (Ellipsis,)
        part = t[key]
        # a fresh tensor, as the reference's cuts are, not a view of the load
        return part.clone() if hasattr(part, "clone") else part.copy()


def _index_item(value):
    """An int index for the reference's indexer (i32), or None."""
    if isinstance(value, float) or not hasattr(type(value), "__index__"):
        return None
    n = operator.index(value)
    return n if -2 ** 31 <= n < 2 ** 31 else None


def _parse_index(index, shape: list) -> list:
    """The reference's reading of a slice index: ints (negative ones count
    from the end), slices with bounds >= 0 and a step > 0, one Ellipsis; a
    tuple of those, or [] (nothing of dimension 0). Returns a list of ints
    and (start, stop, step) triples, start/stop None when absent."""
    if isinstance(index, tuple):
        items = list(index)
    elif isinstance(index, list):
        if index:
            raise UsageError("Non empty lists are not implemented", -1)
        return [(0, 0, 1)]
    else:
        items = [index]
    ellipses = sum(1 for it in items if it is Ellipsis)
    if ellipses > 1:
        raise UsageError("Only one ellipsis (...) is allowed in slice index", -1)
    expand = max(0, len(shape) - (len(items) - ellipses))
    picks, dim = [], 0
    for it in items:
        if it is Ellipsis:
            picks.extend([(None, None, 1)] * expand)
            dim += expand
        elif isinstance(it, slice):
            start = None if it.start is None else _usize("start", it.start)
            stop = None if it.stop is None else _usize("stop", it.stop)
            step = 1
            if it.step is not None:
                if isinstance(it.step, float) or not hasattr(type(it.step), "__index__"):
                    raise TypeError(f"'{type(it.step).__name__}' object cannot be interpreted "
                                    "as an integer")
                step = operator.index(it.step)
                if step <= 0:
                    raise UsageError(f"Slice step must be a positive integer, got {step}", -1)
            picks.append((start, stop, step))
            dim += 1
        else:
            i = _index_item(it)
            if i is None:
                raise UsageError(f"Unsupported slice index at position {dim}: expected slice, "
                                 "int, or ellipsis", -1)
            size = shape[dim] if dim < len(shape) else 0
            if i < 0:
                if i + size < 0:
                    raise UsageError(f"Invalid index {i} for dimension {dim} of size {size}", -1)
                i += size
            picks.append(i)
            dim += 1
    return picks


def _show(picks: list) -> str:
    def one(p):
        if isinstance(p, int):
            return str(p)
        start, stop, step = p
        s = f"{'' if start is None else start}:{'' if stop is None else stop}"
        return s + (f":{step}" if step != 1 else "")
    return "[" + ", ".join(one(p) for p in picks) + "]"


def _bounds(p, size: int):
    if isinstance(p, int):
        return p, p + 1, 1
    start, stop, step = p
    return (0 if start is None else start), (size if stop is None else stop), step


def _check_picks(picks: list, shape: list, dtype: str) -> list:
    """The reference's checks of a parsed index against the shape, last
    dimension first (so an error names the last bad one), every dimension's
    bounds before any start after its stop (where the reference fails
    later, from a negative size); returns the shape of the cut."""
    def fail(why):
        return UsageError(f"Error during slicing {_show(picks)} with shape {shape}: {why}", -1)
    if len(picks) > len(shape):
        raise fail("more slicing indexes than dimensions in tensor")
    given = [(i, _bounds(picks[i], shape[i])) for i in reversed(range(len(picks)))]
    for i, (start, stop, _) in given:
        size = shape[i]
        if start >= size or stop > size:
            asked = start if start >= size else stop - 1
            raise fail(f"index {asked} out of bounds for tensor dimension #{i} of size {size}")
    for i, (start, stop, _) in given:
        if start > stop:
            # the reference fails here with a SystemError from a negative size
            raise fail(f"slice start {start} is after its stop {stop} in dimension #{i}")
    out = [len(range(*b)) for i, b in reversed(given) if not isinstance(picks[i], int)]
    out += shape[len(picks):]
    bits = _SUB_BYTE.get(dtype)
    if bits:
        _byte_ranges(picks, shape, bits, fail)  # refuses cuts inside a byte
    return out


def _byte_ranges(picks: list, shape: list, bits: int, fail) -> list:
    """(start, stop) byte ranges of a cut of a sub-byte tensor, in order; a
    cut that starts or ends inside a byte is refused, as the reference
    refuses it."""
    ranges = None  # None: nothing cut yet, the whole span so far
    span = bits
    for i in reversed(range(len(shape))):
        size = shape[i]
        if i < len(picks):
            start, stop, step = _bounds(picks[i], size)
            whole = start == 0 and stop == size and step == 1
            if ranges is None and not whole:
                if step == 1:
                    if start * span % 8 or stop * span % 8:
                        raise fail("The slice is slicing for subbytes dtypes, and the slice "
                                   "does not end up at a byte boundary, this is invalid.")
                    ranges = [(start * span // 8, stop * span // 8)]
                else:
                    ranges = []
                    for n in range(start, stop, step):
                        if n * span % 8 or span % 8:
                            raise fail("The slice is slicing for subbytes dtypes, and the slice "
                                       "does not end up at a byte boundary, this is invalid.")
                        ranges.append((n * span // 8, (n + 1) * span // 8))
            elif ranges is not None:
                new = []
                for n in range(start, stop, step):
                    if n * span % 8:
                        raise fail("The slice is slicing for subbytes dtypes, and the slice "
                                   "does not end up at a byte boundary, this is invalid.")
                    off = n * span // 8
                    new.extend((a + off, b + off) for a, b in ranges)
                ranges = new
        span *= size
    if ranges is None:
        total = 1
        for d in shape:
            total *= d
        ranges = [(0, total * bits // 8)]
    return ranges


def _cut_bytes(t, picks, shape, dtype, newshape, framework):
    """A cut of an F4 / F6 tensor, gathered byte range by byte range, in the
    form fst gives such tensors (docs/python.md, dtypes)."""
    ranges = _byte_ranges(picks, shape, _SUB_BYTE[dtype], None)
    bits = _SUB_BYTE[dtype]
    last = newshape[-1] if newshape else 1
    if newshape and last * bits % 8 == 0:
        form = tuple(newshape[:-1]) + (last * bits // 8,)
    else:
        n = 1
        for d in newshape:
            n *= d
        form = (n * bits // 8,)
    if framework == "pt":
        import torch
        flat = t.reshape(-1).view(torch.uint8)
        parts = [flat[a:b] for a, b in ranges]
        out = torch.cat(parts) if parts else flat[:0].clone()
        out = out.reshape(form)
        f4 = getattr(torch, "float4_e2m1fn_x2", None)
        if dtype == "F4" and f4 is not None and newshape and newshape[-1] % 2 == 0:
            out = out.view(f4)
        return out
    import numpy as np
    flat = np.asarray(t).reshape(-1).view(np.uint8)
    parts = [flat[a:b] for a, b in ranges]
    out = np.concatenate(parts) if parts else flat[:0].copy()
    return out.reshape(form)
