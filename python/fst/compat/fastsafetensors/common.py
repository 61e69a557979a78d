"""fastsafetensors.common: SingleGroup, the header model (SafeTensorsMetadata,
TensorFrame) and the platform queries."""
import json
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import fst

from . import cpp
from .st_types import DTYPE_SIZES, DType

# The largest header fastsafetensors reads; a bigger length is a corrupt file.
_MAX_HEADER = 100_000_000


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


def set_debug() -> None:
    logging.basicConfig(format="[%(levelname)s] %(message)s", level=logging.DEBUG, force=True)


def is_debug(logger: logging.Logger) -> bool:
    return logger.isEnabledFor(logging.DEBUG)


def is_gpu_found() -> bool:
    """Whether a CUDA GPU can be loaded to. fst has no HIP path."""
    return cpp.is_cuda_found()


def get_device_numa_node(device: Optional[int]) -> Optional[int]:
    """The NUMA node of CUDA device `device`, from its PCI address; None when
    unknown (no GPU, not Linux)."""
    if device is None or not sys.platform.startswith("linux"):
        return None
    bus = cpp.get_device_pci_bus(device)
    if not bus:
        return None
    path = f"/sys/class/pci_bus/{':'.join(bus.split(':')[:2]).lower()}/device/numa_node"
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def resolve_runtime_lib_name(framework=None) -> str:
    """fst opens the CUDA driver itself when a load needs it: there is no
    runtime library to choose, so this is always "" (the default)."""
    return ""


# the name before fastsafetensors 0.5
resolve_cudart_lib_name = resolve_runtime_lib_name


class SingleGroup:
    """A process group of one."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _bits(dtype: DType) -> int:
    return int(DTYPE_SIZES[dtype] * 8)


@dataclass
class TensorFrame:
    """One header entry: dtype, shape, data offsets, and the element strides
    and offsets of a (possibly sliced) view of it."""

    dtype: DType
    shape: List[int]
    data_offsets: List[int]
    strides: List[int]
    offsets: List[int]
    sliced: bool

    @classmethod
    def from_buffer(cls, entry: Dict[str, Any]) -> "TensorFrame":
        shape = entry["shape"]
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            raise ValueError(f"shape must contain nonnegative integers: {shape!r}")
        strides, step = [], 1
        for d in reversed(shape):
            strides.append(step)
            step *= d
        strides.reverse()
        return cls(DType(entry["dtype"]), list(shape), list(entry["data_offsets"]), strides,
                   [0] * len(shape), False)

    def __repr__(self) -> str:
        return str({"dtype": self.dtype, "shape": self.shape, "data_offsets": self.data_offsets})

    def __getitem__(self, index) -> "TensorFrame":
        """The frame of frame[index] with Python's rules for ints and slices;
        an empty selection has shape []."""
        if isinstance(index, (int, slice)):
            index = (index,)
        if not isinstance(index, tuple):
            raise TypeError(f"TensorFrame index {index!r}: expected ints and slices")
        if len(index) > len(self.shape):
            raise IndexError(f"index {index} has more dimensions than shape {self.shape}")
        shape, strides, offsets = [], [], []
        for dim, sel in enumerate(index):
            size = self.shape[dim]
            if isinstance(sel, int):
                if not -size <= sel < size:
                    raise IndexError(f"index {sel} at dim={dim} is out of range for shape "
                                     f"{self.shape}")
                start, step, count = sel % size, 1, 1
            elif isinstance(sel, slice):
                if sel.step == 0:
                    raise ValueError("slice step cannot be zero")
                start, stop, step = sel.indices(size)
                count = len(range(start, stop, step))
                if count == 0:
                    return TensorFrame(self.dtype, [], self.data_offsets, [], [], False)
            else:
                raise TypeError(f"TensorFrame index {sel!r} at dim={dim}: expected an int or "
                                "a slice")
            shape.append(count)
            strides.append(self.strides[dim] * step)
            offsets.append(self.offsets[dim] + start)
        shape += self.shape[len(index):]
        strides += self.strides[len(index):]
        offsets += self.offsets[len(index):]
        return TensorFrame(self.dtype, shape, self.data_offsets, strides, offsets, True)


def _read_exact(fd: int, n: int, filename: str) -> bytes:
    parts, left = [], n
    while left:
        b = os.read(fd, left)
        if not b:
            raise fst.FormatError(f"{filename}: UnexpectedEOF: the header needs {n} bytes, the "
                                  f"file has {n - left}", -2)
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def _check_length(n: int, size: int, filename: str) -> None:
    if n > _MAX_HEADER:
        raise fst.FormatError(f"{filename}: HeaderTooLarge: header length {n} (at most "
                              f"{_MAX_HEADER})", -2)
    if n > size - 8:
        raise fst.FormatError(f"{filename}: InvalidHeaderLength: header length {n} in a file of "
                              f"{size} bytes", -2)


class SafeTensorsMetadata:
    """A parsed safetensors header: `tensors` (name -> TensorFrame, in data
    offset order), `metadata` (its __metadata__, "" when it has none),
    `header_length` (the 8 length bytes included), `size_bytes`, `src`."""

    def __init__(self, string: str, header_length: int, size_bytes: int, framework,
                 src: str = "", keep_orig_dict: bool = False):
        self.src = src
        self.framework = framework
        try:
            ser = json.loads(string, object_pairs_hook=OrderedDict)
        except ValueError as e:
            raise fst.FormatError(f"{src}: header is not valid JSON: {e}", -2) from None
        if not isinstance(ser, dict):
            raise fst.FormatError(f"{src}: header is not a JSON object", -2)
        self.metadata = ser.pop("__metadata__", "")
        if keep_orig_dict:
            self.ser = ser
        self.header_length = header_length
        self.size_bytes = size_bytes
        self.aligned = header_length % framework.get_device_ptr_align() == 0 if framework else False
        self.tensors: Dict[str, TensorFrame] = {}
        end = 0
        for name, entry in sorted(ser.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            try:
                t = TensorFrame.from_buffer(entry)
            except (KeyError, TypeError, ValueError) as e:
                raise fst.FormatError(f"{src}: tensor {name!r}: {e}", -2) from None
            s, e = t.data_offsets
            if s != end or e < s:
                raise fst.FormatError(f"{src}: tensor {name!r}: InvalidOffset: data_offsets "
                                      f"[{s}, {e}], expected to start at {end}", -2)
            numel = 1
            for d in t.shape:
                numel *= d
            bits = numel * _bits(t.dtype)
            if bits % 8 or e - s != bits // 8:
                raise fst.FormatError(f"{src}: tensor {name!r}: TensorInvalidInfo: {e - s} bytes "
                                      f"for {t.dtype.value} {t.shape}", -2)
            self.tensors[name] = t
            end = e
        if header_length + end > size_bytes:
            raise fst.FormatError(f"{src}: MetadataIncompleteBuffer: the tensors end at "
                                  f"{header_length + end}, the file has {size_bytes} bytes", -2)

    @classmethod
    def from_buffer(cls, buf: int, buffer_len: int, filename: str, framework):
        """The header of a file image in host memory at address `buf`."""
        if buffer_len < 8:
            raise fst.FormatError(f"{filename}: HeaderTooSmall: {buffer_len} bytes", -2)
        n = int.from_bytes(cpp.read_buffer(buf, 8), "little")
        _check_length(n, buffer_len, filename)
        return cls(cpp.read_buffer(buf + 8, n).decode("utf-8"), n + 8, buffer_len, framework,
                   filename)

    @classmethod
    def from_fd(cls, fd: int, filename: str, framework, keep_orig_dict: bool = False):
        size = os.fstat(fd).st_size
        if size < 8:
            raise fst.FormatError(f"{filename}: HeaderTooSmall: {size} bytes", -2)
        n = int.from_bytes(_read_exact(fd, 8, filename), "little")
        _check_length(n, size, filename)
        text = _read_exact(fd, n, filename).decode("utf-8")
        return cls(text, n + 8, size, framework, filename, keep_orig_dict)

    @classmethod
    def from_file(cls, filename: str, framework):
        """The header of `filename`, validated by fst first (every rule,
        with fst's error naming the file, tensor and rule), so that every
        rank refuses a broken file in add_filenames before any rank loads.
        The file is not kept open: a loader may register thousands."""
        filename = os.fspath(filename)
        fst.Checkpoint(filename)
        fd = os.open(filename, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            return cls.from_fd(fd, filename, framework)
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return str({"__metadata__": self.metadata, "tensors": self.tensors})
