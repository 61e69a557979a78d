"""safetensors.torch over fst: load_file, load, save_file, save, save_model,
load_model, storage_ptr, storage_size, with the reference's arguments and
errors; also the names clients import from the reference module
(safe_open, serialize, serialize_file, deserialize, TensorSpec and the
dtype tables _TYPES and _SIZE with _getdtype). Needs torch, as the
reference module does."""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Dict, List, Optional, Set, Tuple, Union

import torch

from ... import load_file as _fst_load_file
from ... import save as _fst_save
from ... import save_file as _fst_save_file
from ..._write import _NP_TO_ST
from . import TensorSpec, _load_bytes, deserialize, safe_open, serialize, serialize_file

__all__ = ["storage_ptr", "storage_size", "save_model", "load_model", "save", "save_file",
           "load_file", "load", "safe_open", "serialize", "serialize_file", "deserialize",
           "TensorSpec"]


def _dtype_tables():
    """(_TYPES, _SIZE) with the reference's entries: file dtype names to the
    torch dtypes this torch has (clients index it and invert it; F8_E8M0 and
    F4 are not in it), and bytes a value for each torch dtype, F8_E8M0 and
    F4 included. Both from the writer's table of dtype names."""
    have = [(getattr(torch, name), code) for name, code in _NP_TO_ST.items()
            if hasattr(torch, name)]
    types = {code: t for t, code in have if code not in ("F8_E8M0", "F4")}
    return types, {t: t.itemsize for t, _ in have}


_TYPES, _SIZE = _dtype_tables()


def _getdtype(dtype_str: str) -> torch.dtype:
    """The torch dtype of a file dtype name (KeyError for one it lacks)."""
    return _TYPES[dtype_str]


def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the storage under the tensor; 0 where there is none
    (meta tensors)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - storages that cannot say
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """Bytes of the storage under the tensor."""
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # noqa: BLE001
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte the tensor's elements reach, strides
    included."""
    if not tensor.nelement():
        return tensor.data_ptr()
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * tensor.element_size()


def _is_complete(tensor: torch.Tensor) -> bool:
    """The tensor covers its whole storage, densely."""
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.nelement() * tensor.element_size() == storage_size(tensor))


def _filter_shared_not_shared(groups: List[Set[str]], state_dict) -> List[Set[str]]:
    """Split groups of one storage into runs of names whose bytes overlap the
    name before them, in address order (as the reference splits them, so
    save_model keeps the same names)."""
    out = []
    for names in groups:
        if len(names) < 2:
            out.append(names)
            continue
        areas = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        _, reach, first = areas[0]
        out.append({first})
        for start, stop, name in areas[1:]:
            if start >= reach:
                out.append({name})
            else:
                out[-1].add(name)
            reach = stop
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Names grouped by the memory they share (tensors on the meta device or
    without storage share nothing)."""
    by_storage = defaultdict(set)
    for name, t in state_dict.items():
        if t.device.type != "meta" and storage_ptr(t) != 0 and storage_size(t) != 0:
            # the device is part of the key: two GPUs can hand out one address
            by_storage[(t.device, storage_ptr(t), storage_size(t))].add(name)
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)


def _remove_duplicate_names(state_dict: Dict[str, torch.Tensor], *,
                            preferred_names: Optional[List[str]] = None,
                            discard_names: Optional[List[str]] = None
                            ) -> Dict[str, List[str]]:
    """For each group of names sharing memory, the one to keep (one that
    covers the whole storage: preferred_names first, then those not in
    discard_names, then by name) and the others, to drop."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    drop = defaultdict(list)
    for names in _find_shared_tensors(state_dict):
        complete = {n for n in names if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {names}. None is covering the "
                "entire storage. Refusing to save/load the model since you could be storing "
                "much more memory than needed. See "
                "https://huggingface.co/docs/safetensors/torch_shared_tensors")
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for n in sorted(names):
            if n != keep:
                drop[keep].append(n)
    return drop


def _check_torch_dict(tensors) -> None:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received "
                             f"{type(v)}")


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file of the tensors (dense and contiguous,
    sharing no memory), laid out as the reference lays them."""
    _check_torch_dict(tensors)
    return _fst_save(tensors, metadata)


def save_file(tensors: Dict[str, torch.Tensor], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """save() into a file, written beside it and renamed."""
    _check_torch_dict(tensors)
    _fst_save_file(tensors, filename, metadata)


def load_file(filename: Union[str, os.PathLike], device: Union[str, int] = "cpu", *,
              backend: str = "mmap") -> Dict[str, torch.Tensor]:
    """Every tensor of the file on `device`, loaded by libfst."""
    return _fst_load_file(filename, device, "pt", backend=backend)


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """Every tensor of a file held in memory, on the CPU."""
    return _load_bytes(data, "pt")


def save_model(model: torch.nn.Module, filename: str, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True):
    """Save a model's state dict, keeping one name of each group of tensors
    that share memory; the metadata records each dropped name's kept one."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)  # what the caller put there stays
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), read the docs for "
                         "potential caveats.") from None


def load_model(model: torch.nn.Module, filename: Union[str, os.PathLike], strict: bool = True,
               device: Union[str, int] = "cpu", *, backend: str = "mmap"
               ) -> Tuple[List[str], List[str]]:
    """Load a file into a model whose tensors may share memory: names the
    model shares and the file holds once are not missing. Returns (missing,
    unexpected); with strict, either raises RuntimeError."""
    state_dict = load_file(filename, device=device, backend=backend)
    dropped = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
