"""safetensors.numpy over fst: load_file, load, save_file, save, with the
reference's arguments."""
from __future__ import annotations

import os
from typing import Dict, Optional, Union

import numpy as np

from ... import load_file as _fst_load_file
from ... import save as _fst_save
from ... import save_file as _fst_save_file
from . import _load_bytes

__all__ = ["save", "save_file", "load", "load_file"]


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
