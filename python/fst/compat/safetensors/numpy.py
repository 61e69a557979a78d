"""safetensors.numpy over fst: load_file, load, save_file, save, with the
reference's arguments; also the names clients import from the reference
module (safe_open, serialize, serialize_file, deserialize, TensorSpec, and
the dtype table _TYPES with _getdtype)."""
from __future__ import annotations

import os
from typing import Dict, Optional, Union

import numpy as np

from ... import load_file as _fst_load_file
from ... import save as _fst_save
from ... import save_file as _fst_save_file
from . import TensorSpec, _load_bytes, deserialize, safe_open, serialize, serialize_file

__all__ = ["save", "save_file", "load", "load_file", "safe_open", "serialize", "serialize_file",
           "deserialize", "TensorSpec"]

# file dtype names to numpy's, the reference's entries (numpy has no BF16 or
# float8 of its own)
_TYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
          "U64": np.uint64, "I32": np.int32, "U32": np.uint32, "I16": np.int16,
          "U16": np.uint16, "I8": np.int8, "U8": np.uint8, "BOOL": bool,
          "C64": np.complex64}


def _getdtype(dtype_str: str):
    """The numpy dtype of a file dtype name (KeyError for one it lacks)."""
    return _TYPES[dtype_str]


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file of the arrays, laid out as the
    reference lays them (little-endian, any strides taken as the values)."""
    return _fst_save(tensor_dict, metadata)


def save_file(tensor_dict: Dict[str, np.ndarray], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """save() into a file, written beside it and renamed."""
    _fst_save_file(tensor_dict, filename, metadata)


def load(data: bytes) -> Dict[str, np.ndarray]:
    """Every tensor of a file held in memory."""
    return _load_bytes(data, "numpy")


def load_file(filename: Union[str, os.PathLike], *, backend: str = "mmap"
              ) -> Dict[str, np.ndarray]:
    """Every tensor of the file, loaded by libfst."""
    return _fst_load_file(filename, "cpu", "numpy", backend=backend)
