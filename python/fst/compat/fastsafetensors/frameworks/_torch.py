"""fastsafetensors.frameworks._torch: torch tensors and torch.distributed
groups. Collectives move bytes (torch.uint8 views), so every dtype travels
alike over gloo and NCCL: F4 and F8_E8M0, which NCCL has no type for, and
float8 on GPUs older than sm90, which fastsafetensors casts to bfloat16."""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import fst

# fst's MissingDependencyError (an ImportError) names the package to install
torch = fst._need_torch()
try:
    import torch.distributed as dist
except ImportError:  # a torch built without it: single-process groups only
    dist = None

from ..st_types import Device, DeviceType, DType
from . import FrameworkOpBase, LocalGroup, ProcessGroupBase, TensorBase, local_group

# torch's dtype for each DType this torch has (older ones lack the unsigned
# and float8/float4 types; loads of those are refused, naming the tensor)
dtype_convert: Dict[DType, Any] = {}
for _d, _name in ((DType.BOOL, "bool"), (DType.U8, "uint8"), (DType.I8, "int8"),
                  (DType.I16, "int16"), (DType.I32, "int32"), (DType.I64, "int64"),
                  (DType.F16, "float16"), (DType.BF16, "bfloat16"), (DType.F32, "float32"),
                  (DType.F64, "float64"), (DType.C64, "complex64"),
                  (DType.F8_E5M2, "float8_e5m2"), (DType.F8_E4M3, "float8_e4m3fn"),
                  (DType.F8_E8M0, "float8_e8m0fnu"), (DType.F4, "float4_e2m1fn_x2"),
                  (DType.F8_E4M3FNUZ, "float8_e4m3fnuz"), (DType.F8_E5M2FNUZ, "float8_e5m2fnuz"),
                  (DType.U16, "uint16"), (DType.U32, "uint32"), (DType.U64, "uint64")):
    if hasattr(torch, _name):
        dtype_convert[_d] = getattr(torch, _name)

_fst_dtypes = {v: k for k, v in dtype_convert.items()}


def fst_dtype(dtype: "torch.dtype") -> DType:
    """The DType of a torch dtype."""
    return _fst_dtypes[dtype]


def _native(dtype: Any):
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in dtype_convert:
        return dtype_convert[dtype]
    # fst gives what torch has no type for (F6, float8 in an old torch) as bytes
    return torch.uint8


def _bytes(t: "torch.Tensor") -> "torch.Tensor":
    return t.contiguous().reshape(-1).view(torch.uint8)


@dataclass
class TorchTensor(TensorBase):
    real_tensor: "torch.Tensor"

    def get_raw(self) -> "torch.Tensor":
        return self.real_tensor

    def get_shape(self) -> List[int]:
        shape = list(self.real_tensor.shape)
        if self.dtype == DType.F4 and shape:
            shape[-1] *= 2
        return shape

    def get_nbytes(self) -> int:
        return self.real_tensor.nbytes

    def contiguous(self) -> "TorchTensor":
        return TorchTensor(self.device, self.dtype, self.real_tensor.contiguous())

    def to(self, device: Optional[Device] = None, dtype: Any = DType.AUTO) -> "TorchTensor":
        to_dev = None if device is None or device == self.device else device.as_str()
        to_dtype = None
        if dtype is not None and dtype != DType.AUTO and dtype != self.dtype:
            to_dtype = _native(dtype)
        if to_dev is None and to_dtype is None:
            return self
        out = self.real_tensor.to(device=to_dev, dtype=to_dtype)
        return TorchTensor(device if to_dev is not None else self.device,
                           dtype if to_dtype is not None else self.dtype, out)

    def clone(self) -> "TorchTensor":
        return TorchTensor(self.device, self.dtype, self.real_tensor.clone())

    def detach(self) -> "TorchTensor":
        return TorchTensor(self.device, self.dtype, self.real_tensor.detach())

    def view(self, dtype: DType) -> "TorchTensor":
        return TorchTensor(self.device, dtype, self.real_tensor.view(_native(dtype)))

    def __getitem__(self, index) -> "TorchTensor":
        return TorchTensor(self.device, self.dtype, self.real_tensor[index])

    def reshape(self, shape: List[int]) -> "TorchTensor":
        return TorchTensor(self.device, self.dtype, self.real_tensor.reshape(shape))

    def data_ptr(self) -> int:
        return self.real_tensor.data_ptr()

    def byte_view(self) -> "torch.Tensor":
        return _bytes(self.real_tensor)


class TorchProcessGroup(ProcessGroupBase):
    """A torch.distributed group (None: a group of one). Ranks are the
    group's own; the collectives carry bytes."""

    def __init__(self, real_pg: Optional["dist.ProcessGroup"] = None):
        self.real_pg = real_pg
        self.collective = real_pg is not None and real_pg.size() > 1

    def size(self) -> int:
        return self.real_pg.size() if self.real_pg is not None else 1

    def rank(self) -> int:
        return self.real_pg.rank() if self.real_pg is not None else 0

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.real_pg, rank)

    # byte-level collectives, what the loader uses
    def broadcast_bytes(self, flat: "torch.Tensor", src: int) -> None:
        if flat.numel():
            dist.broadcast(flat, src=self._global(src), group=self.real_pg)

    def scatter_bytes(self, out: "torch.Tensor", chunks: Optional[List["torch.Tensor"]],
                      src: int) -> None:
        """Every chunk, and `out`, of one size (the loader pads shards)."""
        if out.numel():
            dist.scatter(out, scatter_list=chunks if self.rank() == src else None,
                         src=self._global(src), group=self.real_pg)

    def send_bytes(self, flat: "torch.Tensor", dst: int, tag: int = 0) -> None:
        if flat.numel():
            dist.send(flat, dst=self._global(dst), group=self.real_pg, tag=tag)

    def recv_bytes(self, flat: "torch.Tensor", src: int, tag: int = 0) -> None:
        if flat.numel():
            dist.recv(flat, src=self._global(src), group=self.real_pg, tag=tag)

    def all_gather_object(self, obj: Any) -> List[Any]:
        out = [None] * self.size()
        dist.all_gather_object(out, obj, group=self.real_pg)
        return out

    # fastsafetensors' TensorBase-level collectives
    def broadcast(self, dst: TensorBase, rank: int) -> None:
        flat = dst.byte_view()
        self.broadcast_bytes(flat, rank)
        if flat.data_ptr() != dst.data_ptr() and dst.get_nbytes():
            dst.byte_view().copy_(flat)  # dst was not contiguous

    def scatter(self, dst: TensorBase, scatter_list: List[TensorBase], src: int) -> None:
        sizes = self.all_gather_object(dst.get_nbytes())
        pad = max(sizes)
        out = torch.empty(pad, dtype=torch.uint8, device=dst.real_tensor.device)
        chunks = None
        if self.rank() == src:
            chunks = []
            for t in scatter_list:
                c = torch.zeros(pad, dtype=torch.uint8, device=out.device)
                b = t.byte_view()
                c[: b.numel()].copy_(b)
                chunks.append(c)
        self.scatter_bytes(out, chunks, src)
        dst.real_tensor.copy_(out[: dst.get_nbytes()].view(dst.real_tensor.dtype)
                              .reshape(dst.real_tensor.shape))

    def send(self, t: TensorBase, dst_rank: int, tag: int) -> None:
        self.send_bytes(t.byte_view(), dst_rank, tag)

    def recv(self, t: TensorBase, src_rank: int, tag: int) -> None:
        flat = torch.empty(t.get_nbytes(), dtype=torch.uint8, device=t.real_tensor.device)
        self.recv_bytes(flat, src_rank, tag)
        t.real_tensor.copy_(flat.view(t.real_tensor.dtype).reshape(t.real_tensor.shape))


class TorchOp(FrameworkOpBase):
    fst_framework = "pt"

    def get_name(self) -> str:
        return "pytorch"

    def native_dtype(self, dtype: Any):
        return _native(dtype)

    def fst_dtype_of(self, dtype: Any) -> Optional[DType]:
        return _fst_dtypes.get(dtype) if isinstance(dtype, torch.dtype) else None

    def itemsize(self, dtype: Any) -> int:
        return torch.empty((), dtype=_native(dtype)).element_size()

    def get_device(self, device: Any, pg: Any = None) -> Device:
        if isinstance(device, Device):
            return device
        d = torch.device(device)
        return Device(DeviceType(d.type), d.index)

    def set_device(self, device: Device) -> None:
        if device.type != DeviceType.CPU:
            torch.cuda.set_device(device.as_str() if device.index is not None else
                                  torch.cuda.current_device())

    def wrap(self, raw, dtype, device: Device) -> TorchTensor:
        return TorchTensor(device, dtype, raw)

    def from_fst(self, raw, dtype: DType, st_shape, device: Device) -> TorchTensor:
        # fst gives F4 as its bytes; torch's packed type has the same shape
        if dtype == DType.F4 and DType.F4 in dtype_convert:
            raw = raw.view(dtype_convert[DType.F4])
        return TorchTensor(device, dtype, raw)

    def from_bytes(self, flat, dtype, st_shape, device: Device) -> TorchTensor:
        native = _native(dtype)
        shape = self.loaded_shape(dtype, st_shape)
        if flat.numel() == 0:
            return TorchTensor(device, dtype, torch.empty(shape, dtype=native, device=flat.device))
        return TorchTensor(device, dtype, flat.view(native).reshape(shape))

    def get_empty_tensor(self, shape: List[int], dtype: Any, device: Device) -> TorchTensor:
        dev = device.as_str() if device.type != DeviceType.GPU else f"cuda:{device.index or 0}"
        return TorchTensor(device, dtype, torch.empty(self.loaded_shape(dtype, shape),
                                                      dtype=_native(dtype), device=dev))

    def concat_tensors(self, tensors: List[TensorBase], dim: int) -> TorchTensor:
        first = tensors[0]
        raws = [t.real_tensor for t in tensors]
        if first.real_tensor.element_size() == 1 and first.real_tensor.dtype not in (
                torch.uint8, torch.int8, torch.bool):
            # torch.cat has no kernel for the packed and exponent-only types
            out = torch.cat([r.view(torch.uint8) for r in raws], dim=dim)
            return TorchTensor(first.device, first.dtype, out.view(first.real_tensor.dtype))
        return TorchTensor(first.device, first.dtype, torch.cat(raws, dim=dim))

    def copy_tensor(self, dst: TensorBase, src: TensorBase) -> None:
        dst.real_tensor.copy_(src.real_tensor)

    def wrap_tensor(self, tensor: "torch.Tensor") -> TorchTensor:
        return TorchTensor(Device(DeviceType(tensor.device.type), tensor.device.index),
                           _fst_dtypes.get(tensor.dtype, tensor.dtype), tensor)

    def get_cuda_ver(self) -> str:
        if not torch.cuda.is_available():
            return "0.0"
        if getattr(torch.version, "hip", None):
            return f"hip-{torch.version.hip}"
        return f"cuda-{torch.version.cuda}"

    def as_workaround_dtype(self, dtype: DType) -> DType:
        # the types DLPack and older torch lack travel as bytes
        return {DType.F8_E5M2: DType.I8, DType.F8_E4M3: DType.I8, DType.F8_E8M0: DType.U8,
                DType.F4: DType.U8}.get(dtype, dtype)

    def synchronize(self, device: Device) -> None:
        if device.type != DeviceType.CPU and torch.cuda.is_available():
            torch.cuda.synchronize()

    def get_device_name(self, index: int) -> str:
        try:
            return torch.cuda.get_device_name(index) if torch.cuda.is_available() else ""
        except Exception:
            return ""

    def get_process_group(self, pg: Any) -> ProcessGroupBase:
        if isinstance(pg, (TorchProcessGroup, LocalGroup)):
            return pg
        local = local_group(pg)
        if local is not None:
            return local
        if isinstance(pg, dist.ProcessGroup):
            return TorchProcessGroup(pg)
        raise fst.UsageError(f"pg {pg!r}: expected a torch.distributed.ProcessGroup, "
                             "SingleGroup, None, or an object with rank() and size()", -1)

    def is_equal(self, wrapped: TensorBase, real: Any) -> bool:
        if not isinstance(real, torch.Tensor):
            raise fst.UsageError(f"is_equal: {type(real).__name__} is not a torch.Tensor", -1)
        a = wrapped.real_tensor
        b = real.to(a.device)
        if a.dtype == b.dtype:
            # bitwise, so that NaN payloads, -0.0 and types without an eq kernel compare
            return tuple(a.shape) == tuple(b.shape) and torch.equal(_bytes(a), _bytes(b))
        return bool(torch.all(a.eq(b)))

    def randn(self, s: tuple, device: Device, dtype: Any) -> TorchTensor:
        return TorchTensor(device, dtype, torch.randn(s, device=device.as_str(),
                                                      dtype=_native(dtype)))

    def support_fp8(self) -> bool:
        return DType.F8_E5M2 in dtype_convert


_op: Optional[TorchOp] = None


def get_framework_op() -> TorchOp:
    global _op
    if _op is None:
        _op = TorchOp()
    return _op
