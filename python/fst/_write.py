"""What save_file and save hand the writer: torch tensors and numpy arrays
as (name, dtype, shape, bytes) entries in the reference writer's order,
after the reference's refusals."""
from __future__ import annotations

import sys
from typing import Dict, Optional

from ._errors import UsageError

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
    """A torch tensor, subclasses defined outside torch included (vLLM's
    parameters, a user's): where a tensor exists, torch is imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_entry(name, t):
    """(name, dtype, shape, bytes-like) of a torch tensor the caller has
    checked: dense and contiguous. F4 (float4_e2m1fn_x2, two values a byte)
    is written with its logical shape, the last dimension doubled."""
    import torch
    key = str(t.dtype).replace("torch.", "")
    if key not in _NP_TO_ST:
        raise UsageError(f"tensor {name!r}: dtype {t.dtype} cannot be saved", -1)
    # a conjugate or negative view's bytes are not its values until resolved
    # (the reference writes them unresolved: the wrong values)
    t = t.detach().resolve_conj().resolve_neg()
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
