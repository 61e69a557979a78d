"""fastsafetensors.frameworks: the wrapped tensor (TensorBase), the process
group (ProcessGroupBase) and the per-framework operations (FrameworkOpBase)
the loader works through, for torch ("pytorch") and numpy."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import fst

from ..st_types import DTYPE_SIZES, Device, DType


@dataclass
class TensorBase(ABC):
    """A framework tensor with the device and dtype the loader gave it.
    `dtype` is a DType, or the framework's own dtype after a conversion to
    one that safetensors has no name for."""

    device: Device
    dtype: Any

    @abstractmethod
    def get_raw(self) -> Any:
        """The framework's tensor."""

    @abstractmethod
    def get_shape(self) -> List[int]:
        """The safetensors shape, counting sub-byte elements (F4: twice the
        last dimension of the packed tensor)."""

    @abstractmethod
    def get_nbytes(self) -> int: ...

    @abstractmethod
    def contiguous(self) -> "TensorBase": ...

    @abstractmethod
    def to(self, device: Optional[Device] = None, dtype: Any = DType.AUTO) -> "TensorBase": ...

    @abstractmethod
    def clone(self) -> "TensorBase": ...

    @abstractmethod
    def detach(self) -> "TensorBase": ...

    @abstractmethod
    def view(self, dtype: DType) -> "TensorBase": ...

    @abstractmethod
    def __getitem__(self, index) -> "TensorBase": ...

    @abstractmethod
    def reshape(self, shape: List[int]) -> "TensorBase": ...

    @abstractmethod
    def data_ptr(self) -> int: ...

    @abstractmethod
    def byte_view(self):
        """The bytes as a flat torch.uint8 tensor (a view where possible):
        what the collectives move, whatever the element type."""

    def copy_to_buffer(self, buf: memoryview) -> None:
        """Copy the bytes, in C order, into `buf`."""
        flat = self.byte_view().cpu()
        memoryview(buf).cast("B")[: flat.numel()] = flat.numpy().tobytes()


class ProcessGroupBase(ABC):
    """What the loader needs of a group: its size and this process's rank,
    and whether its ranks exchange tensors (`collective`)."""

    collective = False

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def rank(self) -> int: ...

    def broadcast(self, dst: TensorBase, rank: int) -> None:
        raise fst.UnsupportedError(f"{type(self).__name__} has no collectives", -6)

    def scatter(self, dst: TensorBase, scatter_list: List[TensorBase], src: int) -> None:
        raise fst.UnsupportedError(f"{type(self).__name__} has no collectives", -6)

    def send(self, t: TensorBase, dst_rank: int, tag: int) -> None:
        raise fst.UnsupportedError(f"{type(self).__name__} has no collectives", -6)

    def recv(self, t: TensorBase, src_rank: int, tag: int) -> None:
        raise fst.UnsupportedError(f"{type(self).__name__} has no collectives", -6)


class LocalGroup(ProcessGroupBase):
    """A group whose ranks do not exchange tensors: SingleGroup, None, or an
    object with rank() and size() that is no torch.distributed group. With
    more than one rank every rank reads every file itself (docs/python.md)."""

    def __init__(self, rank: int = 0, size: int = 1, real_pg: Any = None):
        self._rank, self._size, self.real_pg = int(rank), int(size), real_pg

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def local_group(pg) -> Optional[LocalGroup]:
    """LocalGroup for a pg that is not a torch.distributed group, None for
    one that is (or for what is no group at all)."""
    from ..common import SingleGroup
    if pg is None:
        return LocalGroup()
    if isinstance(pg, type) and issubclass(pg, SingleGroup):
        return LocalGroup()  # old examples pass the class itself
    if isinstance(pg, (SingleGroup, LocalGroup)):
        return LocalGroup(pg.rank(), pg.size())
    if type(pg).__module__.startswith("torch"):
        return None
    if callable(getattr(pg, "rank", None)) and callable(getattr(pg, "size", None)):
        return LocalGroup(pg.rank(), pg.size(), pg)
    return None


class FrameworkOpBase(ABC):
    """The operations on one framework's tensors."""

    #: fst.load's framework argument
    fst_framework = "pt"

    def __init__(self) -> None:
        self.mem_used = 0

    @abstractmethod
    def get_name(self) -> str: ...

    @abstractmethod
    def native_dtype(self, dtype: Any) -> Any:
        """The framework dtype of a DType (or a framework dtype as is)."""

    @abstractmethod
    def fst_dtype_of(self, dtype: Any) -> Optional[DType]:
        """The DType of a framework dtype, None if safetensors has none."""

    @abstractmethod
    def wrap(self, raw: Any, dtype: Any, device: Device) -> TensorBase: ...

    @abstractmethod
    def from_fst(self, raw: Any, dtype: DType, st_shape: List[int], device: Device) -> TensorBase:
        """Wrap a tensor as fst.load gave it, in this framework's native
        form of its safetensors dtype."""

    @abstractmethod
    def from_bytes(self, flat, dtype: Any, st_shape: List[int], device: Device) -> TensorBase:
        """A tensor over the flat torch.uint8 bytes `flat`."""

    @abstractmethod
    def get_empty_tensor(self, shape: List[int], dtype: Any, device: Device) -> TensorBase: ...

    @abstractmethod
    def concat_tensors(self, tensors: List[TensorBase], dim: int) -> TensorBase: ...

    @abstractmethod
    def get_process_group(self, pg: Any) -> ProcessGroupBase: ...

    @abstractmethod
    def is_equal(self, wrapped: TensorBase, real: Any) -> bool: ...

    def get_device(self, device: Any, pg: Any = None) -> Device:
        from .._support import to_device
        return to_device(device) or Device()

    def set_device(self, device: Device) -> None:
        pass

    def copy_tensor(self, dst: TensorBase, src: TensorBase) -> None:
        dst.byte_view().copy_(src.contiguous().byte_view())

    def wrap_tensor(self, tensor: Any) -> TensorBase:
        raise NotImplementedError(f"{self.get_name()}: wrap_tensor")

    def get_dtype_size(self, dtype: DType) -> float:
        return float(DTYPE_SIZES[dtype])

    def get_cuda_ver(self) -> str:
        return "0.0"

    def get_device_ptr_align(self) -> int:
        return 16  # what fastsafetensors checks headers against; fst aligns to 256

    def as_workaround_dtype(self, dtype: DType) -> DType:
        return dtype

    def get_storage_shape(self, dtype: DType, shape: List[int],
                          strides: List[int]) -> Tuple[List[int], List[int]]:
        """(shape, strides) of the bytes of a tensor in a file buffer:
        packed sub-byte types become one flat byte dimension."""
        size = self.get_dtype_size(dtype)
        if size < 1:
            self.get_native_shape(dtype, shape)  # refuses a row that splits bytes
            return [int(_numel(shape) * size)], [1]
        return list(shape), list(strides)

    def get_native_shape(self, dtype: DType, st_shape: List[int]) -> List[int]:
        """The framework's shape for a safetensors shape: F4 packs two values
        a byte, so its last dimension halves (and must be even)."""
        if dtype != DType.F4:
            return list(st_shape)
        if not st_shape or st_shape[-1] % 2:
            raise ValueError(f"F4 shape {list(st_shape)}: the last dimension must be even to "
                             "pack two values a byte")
        if len(st_shape) == 1:
            return [st_shape[0] // 2]
        return list(st_shape[:-1]) + [st_shape[-1] // 2]

    def loaded_shape(self, dtype: Any, st_shape: List[int]) -> List[int]:
        """The shape the loader hands out: get_native_shape's, and for an F4
        tensor whose rows split bytes (an odd last dimension), which
        fastsafetensors refuses, one flat dimension of its bytes, as fst
        gives it."""
        if dtype == DType.F4 and (not st_shape or st_shape[-1] % 2):
            return [(_numel(st_shape) + 1) // 2]
        if dtype == DType.F6_E2M3 or dtype == DType.F6_E3M2:
            if st_shape and st_shape[-1] % 4 == 0:
                return list(st_shape[:-1]) + [st_shape[-1] * 3 // 4]
            return [(_numel(st_shape) * 6 + 7) // 8]
        return self.get_native_shape(dtype, st_shape) if isinstance(dtype, DType) else list(st_shape)

    def get_native_slices(self, dtype: DType, st_shape: List[int], slices: Tuple) -> Tuple:
        """Slices of the packed tensor for slices of the safetensors shape:
        F4 bounds on the last dimension halve, and must be even."""
        if dtype != DType.F4 or not st_shape or len(slices) < len(st_shape):
            return slices
        out = list(slices)
        last, size = out[-1], st_shape[-1]
        if isinstance(last, slice):
            if last.step not in (None, 1):
                raise ValueError(f"F4 slice {last}: packed values take step 1 only")
            start = min(max(0 if last.start is None else last.start, 0), size)
            stop = min(max(size if last.stop is None else last.stop, 0), size)
            if start % 2 or stop % 2:
                raise ValueError(f"F4 slice {last} of {size} values: bounds must be even, a "
                                 "byte holds two values")
            out[-1] = slice(start // 2, stop // 2, last.step)
        elif isinstance(last, int):
            if last % 2:
                raise ValueError(f"F4 index {last}: must be even, a byte holds two values")
            out[-1] = last // 2
        return tuple(out)

    def nbytes(self, dtype: Any, st_shape: List[int]) -> int:
        """Bytes of a tensor of `dtype` and safetensors shape `st_shape`."""
        if isinstance(dtype, DType):
            return _numel(st_shape) * int(DTYPE_SIZES[dtype] * 8) // 8
        return _numel(st_shape) * self.itemsize(dtype)

    def itemsize(self, dtype: Any) -> int:
        """Bytes per element of a framework dtype."""
        raise NotImplementedError(f"{self.get_name()}: itemsize")

    def synchronize(self, device: Device) -> None:
        pass

    def get_global_rank(self) -> int:
        try:
            import torch.distributed as dist
        except ImportError:
            return 0
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def get_device_name(self, index: int) -> str:
        return ""

    def support_fp8(self) -> bool:
        return False

    def get_mem_used(self) -> int:
        """Bytes of fst loads that open FilesBufferOnDevice objects hold
        (their own references: tensors handed out keep their memory alive
        after close, as in fastsafetensors)."""
        return self.mem_used


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def get_framework_op(name: str) -> FrameworkOpBase:
    # a framework that is no str is fst's type error, named like fst.load's
    key = name.lower() if isinstance(name, str) else fst._framework(name)
    if key in ("pt", "pytorch", "torch"):
        from ._torch import get_framework_op as op
    elif key in ("np", "numpy"):
        from ._numpy import get_framework_op as op
    else:
        raise fst.UsageError(f"Unknown framework name: {name!r}: fst's fastsafetensors API "
                             "takes 'pytorch' ('pt', 'torch') or 'numpy'", -1)
    return op()
