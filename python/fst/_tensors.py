"""From libfst's tensors to torch tensors and numpy arrays, zero-copy over
DLPack: DLPack carries the common dtypes, the rest are views (float8,
unsigned ints in torch, BF16 and float8 in numpy through ml_dtypes); and the
checks, from the headers alone, that a framework can take a load's
tensors."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from . import _fst
from ._errors import MissingDependencyError, UnsupportedError, UsageError

if TYPE_CHECKING:
    from ._load import Checkpoint

_DL_INT, _DL_UINT = 0, 1


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


def _from_dlpack(torch, t: "_fst.Tensor"):
    # Through the capsule, the old-style import every torch takes. Given the
    # object, torch first looks up the device's current stream for each
    # tensor (a device name parsed, a Stream object made) and tries
    # __dlpack__'s keywords one set after another; fst ignores the stream, as
    # a tensor is handed out only once its bytes have landed. A load hands
    # out every tensor of a model, so those microseconds add up.
    return torch.from_dlpack(t.__dlpack__())


def _to_torch(t: "_fst.Tensor"):
    import torch
    dtype = t.dtype
    if dtype in _TORCH_UNSIGNED:
        wanted = _torch_dtypes().get(dtype)
        if wanted is None:
            raise _no_torch_dtype(t.name, dtype, torch)
        bits = int(dtype[1:])
        return _from_dlpack(torch, t.reinterpret(_DL_INT, bits)).view(wanted)
    if dtype.startswith("F8_"):
        raw = _from_dlpack(torch, t)  # uint8, same shape
        wanted = _torch_dtypes().get(dtype)
        return raw.view(wanted) if wanted is not None else raw
    return _f4_view(torch, _from_dlpack(torch, t), dtype, t.shape)


def _f4_view(torch, raw, dtype: str, shape):
    """raw, a sub-byte tensor's bytes as fst gives them, typed as torch
    types it: F4 rows of whole bytes are torch's float4_e2m1fn_x2 (two values
    a byte, the last dimension in bytes), as the reference gives them;
    otherwise F4 and F6 stay uint8: the last dimension in bytes, or flat
    (docs/python.md). shape: the file's."""
    if dtype == "F4" and shape and shape[-1] % 2 == 0:
        f4 = getattr(torch, "float4_e2m1fn_x2", None)
        if f4 is not None:
            return raw.view(f4)
    return raw


def _to_numpy(t: "_fst.Tensor"):
    import numpy as np
    if not t.device.startswith("cpu"):
        try:
            t = t.host_view()  # unified memory: the same bytes, as the CPU sees them
        except UsageError:
            raise UsageError(f"tensor {t.name!r} is on {t.device}: numpy arrays live on the "
                             "CPU; load with device='cpu' or framework='pt'", -1) from None
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
