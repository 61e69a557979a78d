"""numpy arrays through the fastsafetensors API (an fst extension:
fastsafetensors has torch and paddle). Arrays live on the CPU; with a
torch.distributed group they travel as torch byte views, so the group's
backend must take CPU tensors (gloo)."""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

import fst

from ..st_types import Device, DeviceType, DType
from . import FrameworkOpBase, LocalGroup, ProcessGroupBase, TensorBase, local_group

dtype_convert: Dict[DType, Any] = {
    DType.BOOL: np.dtype(np.bool_), DType.U8: np.dtype(np.uint8), DType.I8: np.dtype(np.int8),
    DType.I16: np.dtype(np.int16), DType.U16: np.dtype(np.uint16),
    DType.I32: np.dtype(np.int32), DType.U32: np.dtype(np.uint32),
    DType.I64: np.dtype(np.int64), DType.U64: np.dtype(np.uint64),
    DType.F16: np.dtype(np.float16), DType.F32: np.dtype(np.float32),
    DType.F64: np.dtype(np.float64), DType.C64: np.dtype(np.complex64),
}
try:
    import ml_dtypes
    for _d, _name in ((DType.BF16, "bfloat16"), (DType.F8_E4M3, "float8_e4m3fn"),
                      (DType.F8_E5M2, "float8_e5m2"), (DType.F8_E4M3FNUZ, "float8_e4m3fnuz"),
                      (DType.F8_E5M2FNUZ, "float8_e5m2fnuz")):
        dtype_convert[_d] = np.dtype(getattr(ml_dtypes, _name))
except ImportError:
    pass

_fst_dtypes = {v: k for k, v in dtype_convert.items()}


def _native(dtype: Any):
    if isinstance(dtype, DType):
        if dtype in dtype_convert:
            return dtype_convert[dtype]
        if dtype == DType.BF16:
            raise fst.UnsupportedError("numpy has no BF16 dtype; install ml_dtypes or use "
                                       "framework='pytorch'", -6)
        return np.dtype(np.uint8)  # F8_E8M0, F4, F6: their bytes, as fst gives them
    return np.dtype(dtype)


@dataclass
class NumpyTensor(TensorBase):
    real_tensor: np.ndarray

    def get_raw(self) -> np.ndarray:
        return self.real_tensor

    def get_shape(self) -> List[int]:
        return list(self.real_tensor.shape)

    def get_nbytes(self) -> int:
        return self.real_tensor.nbytes

    def contiguous(self) -> "NumpyTensor":
        return NumpyTensor(self.device, self.dtype, np.ascontiguousarray(self.real_tensor)
                           .reshape(self.real_tensor.shape))

    def to(self, device: Optional[Device] = None, dtype: Any = DType.AUTO) -> "NumpyTensor":
        if device is not None and device.type != DeviceType.CPU:
            raise fst.UsageError(f"device {device.as_str()!r}: numpy arrays live on the CPU", -1)
        if dtype is None or dtype == DType.AUTO or dtype == self.dtype:
            return self
        return NumpyTensor(self.device, dtype, self.real_tensor.astype(_native(dtype)))

    def clone(self) -> "NumpyTensor":
        return NumpyTensor(self.device, self.dtype, self.real_tensor.copy())

    def detach(self) -> "NumpyTensor":
        return self

    def view(self, dtype: DType) -> "NumpyTensor":
        return NumpyTensor(self.device, dtype, self.real_tensor.view(_native(dtype)))

    def __getitem__(self, index) -> "NumpyTensor":
        return NumpyTensor(self.device, self.dtype, self.real_tensor[index])

    def reshape(self, shape: List[int]) -> "NumpyTensor":
        return NumpyTensor(self.device, self.dtype, self.real_tensor.reshape(shape))

    def data_ptr(self) -> int:
        return self.real_tensor.__array_interface__["data"][0]

    def byte_view(self):
        import torch
        a = np.ascontiguousarray(self.real_tensor).reshape(-1).view(np.uint8)
        return torch.from_numpy(a)


class NumpyOp(FrameworkOpBase):
    fst_framework = "numpy"

    def get_name(self) -> str:
        return "numpy"

    def native_dtype(self, dtype: Any):
        return _native(dtype)

    def fst_dtype_of(self, dtype: Any) -> Optional[DType]:
        try:
            return _fst_dtypes.get(np.dtype(dtype))
        except TypeError:
            return None

    def itemsize(self, dtype: Any) -> int:
        return _native(dtype).itemsize

    def get_device(self, device: Any, pg: Any = None) -> Device:
        d = super().get_device(device, pg)
        if d.type != DeviceType.CPU:
            raise fst.UsageError(f"device {d.as_str()!r} with framework='numpy': numpy arrays "
                                 "live on the CPU; load with device='cpu' or framework='pytorch'",
                                 -1)
        return d

    def wrap(self, raw, dtype, device: Device) -> NumpyTensor:
        return NumpyTensor(device, dtype, raw)

    def from_fst(self, raw, dtype: DType, st_shape, device: Device) -> NumpyTensor:
        return NumpyTensor(device, dtype, raw)

    def from_bytes(self, flat, dtype, st_shape, device: Device) -> NumpyTensor:
        native = _native(dtype)
        shape = self.loaded_shape(dtype, st_shape)
        return NumpyTensor(device, dtype, flat.numpy().view(native).reshape(shape))

    def get_empty_tensor(self, shape: List[int], dtype: Any, device: Device) -> NumpyTensor:
        return NumpyTensor(device, dtype, np.empty(self.loaded_shape(dtype, shape),
                                                   dtype=_native(dtype)))

    def concat_tensors(self, tensors: List[TensorBase], dim: int) -> NumpyTensor:
        first = tensors[0]
        return NumpyTensor(first.device, first.dtype,
                           np.concatenate([t.real_tensor for t in tensors], axis=dim))

    def copy_tensor(self, dst: TensorBase, src: TensorBase) -> None:
        np.copyto(dst.real_tensor, src.real_tensor)

    def wrap_tensor(self, tensor: np.ndarray) -> NumpyTensor:
        return NumpyTensor(Device(), _fst_dtypes.get(tensor.dtype, tensor.dtype), tensor)

    def get_process_group(self, pg: Any) -> ProcessGroupBase:
        if isinstance(pg, LocalGroup):
            return pg
        local = local_group(pg)
        if local is not None:
            return local
        from ._torch import TorchOp
        return TorchOp().get_process_group(pg)

    def is_equal(self, wrapped: TensorBase, real: Any) -> bool:
        if not isinstance(real, np.ndarray):
            raise fst.UsageError(f"is_equal: {type(real).__name__} is not a numpy array", -1)
        a = wrapped.real_tensor
        if a.dtype == real.dtype:
            return a.shape == real.shape and a.tobytes() == np.ascontiguousarray(real).tobytes()
        return bool(np.all(a == real))

    def randn(self, s: tuple, device: Device, dtype: Any) -> NumpyTensor:
        return NumpyTensor(device, dtype, np.random.standard_normal(s).astype(_native(dtype)))

    def support_fp8(self) -> bool:
        return DType.F8_E5M2 in dtype_convert


_op: Optional[NumpyOp] = None


def get_framework_op() -> NumpyOp:
    global _op
    if _op is None:
        _op = NumpyOp()
    return _op
