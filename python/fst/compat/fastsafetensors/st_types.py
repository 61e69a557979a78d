"""fastsafetensors.st_types: the Device and DType argument types."""
from dataclasses import dataclass
from enum import Enum
from typing import Optional


class DeviceType(Enum):
    CPU = "cpu"
    CUDA = "cuda"
    GPU = "gpu"  # paddle's name for a CUDA device; kept so such strings parse


@dataclass(frozen=True)
class Device:
    type: DeviceType = DeviceType.CPU
    index: Optional[int] = None

    def as_str(self) -> str:
        return self.type.value if self.index is None else f"{self.type.value}:{self.index}"

    @classmethod
    def from_str(cls, s: str) -> "Device":
        kind, sep, index = s.partition(":")
        try:
            dev_type = DeviceType(kind.lower())
        except ValueError:
            raise ValueError(f"Unknown device type: {kind}") from None
        if not sep:
            return cls(dev_type, None)
        try:
            return cls(dev_type, int(index))
        except ValueError:
            raise ValueError(f"Invalid index: {index}") from None


class DType(Enum):
    BOOL = "BOOL"
    I8 = "I8"
    I16 = "I16"
    I32 = "I32"
    I64 = "I64"
    U8 = "U8"
    U16 = "U16"
    U32 = "U32"
    U64 = "U64"
    F16 = "F16"
    F32 = "F32"
    F64 = "F64"
    BF16 = "BF16"
    F8_E5M2 = "F8_E5M2"
    F8_E4M3 = "F8_E4M3"
    F8_E8M0 = "F8_E8M0"
    F4 = "F4"
    # Beyond fastsafetensors' list: safetensors dtypes fst loads, so that a
    # file holding them can be described instead of refused.
    F8_E4M3FNUZ = "F8_E4M3FNUZ"
    F8_E5M2FNUZ = "F8_E5M2FNUZ"
    F6_E2M3 = "F6_E2M3"
    F6_E3M2 = "F6_E3M2"
    C64 = "C64"
    AUTO = "AUTO"


# Bytes per element as the safetensors shape counts elements: sub-byte
# types are fractions (two F4 values share a byte).
DTYPE_SIZES = {
    DType.BOOL: 1, DType.U8: 1, DType.I8: 1,
    DType.F8_E5M2: 1, DType.F8_E4M3: 1, DType.F8_E8M0: 1,
    DType.F8_E4M3FNUZ: 1, DType.F8_E5M2FNUZ: 1,
    DType.I16: 2, DType.U16: 2, DType.F16: 2, DType.BF16: 2,
    DType.I32: 4, DType.U32: 4, DType.F32: 4,
    DType.I64: 8, DType.U64: 8, DType.F64: 8, DType.C64: 8,
    DType.F4: 0.5, DType.F6_E2M3: 0.75, DType.F6_E3M2: 0.75,
}
