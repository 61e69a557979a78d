"""What the fastsafetensors face shares: fst's error classes, argument
normalisation and the mapping of fastsafetensors' options to fst's.

fst (the package) is imported when this module is, so fst/__init__.py may
import this package only after it has defined its error classes."""
import os
from typing import Any, Dict, Optional

import fst

from .st_types import Device, DeviceType, DType


class UnknownTensorError(fst.UsageError, KeyError):
    """A tensor name the files do not hold. fastsafetensors raises
    ValueError for it and fst's earlier face raised KeyError: this is both,
    so code written against either catches it."""

    __str__ = Exception.__str__  # KeyError's would quote the message


def unknown(where: str, name: str) -> UnknownTensorError:
    return UnknownTensorError(f"{where}: key {name} was not found in files", -1)


def usage(message: str) -> "fst.UsageError":
    return fst.UsageError(message, -1)


def to_device(device: Any) -> Optional[Device]:
    """Device from what callers pass: a Device, a string ("cuda:1"), an int
    (a CUDA index), a torch.device, or None."""
    if device is None or isinstance(device, Device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        return Device(DeviceType.CUDA, device)
    if hasattr(device, "type") and hasattr(device, "index") and not isinstance(device, str):
        return Device(DeviceType(device.type), device.index)  # torch.device
    if isinstance(device, str):
        return Device.from_str(device)
    raise usage(f"device {device!r}: expected a Device, a string such as 'cuda:0', or an int")


def fst_device(device: Device) -> str:
    """fst's device string. A bare "cuda" is the current CUDA device, as
    torch takes it, rather than device 0."""
    if device.type == DeviceType.CPU:
        return "cpu"
    index = device.index
    if index is None:
        try:
            import torch
            index = torch.cuda.current_device()
        except Exception:
            index = 0
    return f"cuda:{index}"


def to_dtype(dtype: Any, framework=None):
    """DType.AUTO, a DType, or a framework dtype (torch.float16,
    numpy.float16) passed through; DType names ("F16") are taken too."""
    if dtype is None:
        return DType.AUTO
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        try:
            return DType(dtype.upper())
        except ValueError:
            pass
    if framework is not None:
        known = framework.fst_dtype_of(dtype)
        if known is not None:
            return known
    return dtype


# fastsafetensors' own defaults for its copier (SafeTensorsFileLoader's
# bbuf_size_kb and max_threads): left at these, fst's measured defaults run
BBUF_SIZE_KB_DEFAULT = 16 * 1024
MAX_THREADS_DEFAULT = 16


def load_options(bbuf_size_kb: int, max_threads: int, nogds: bool) -> Dict[str, Any]:
    """fst.load options for fastsafetensors' reader options. bbuf_size_kb is
    a bounce buffer per reader thread there, so the staging budget is that
    times the threads. Left at fastsafetensors' defaults (what vLLM passes)
    they mean fst's own defaults (0): 256 MiB of staging pinned at each load
    costs a GPU load 10% on an H200 (bench/results/h200-2026-12-01-engines).
    GDS stays "auto" unless nogds: fst falls back to staged reads where
    GPUDirect Storage is missing, it never fails for it."""
    threads = fst._threads(max_threads, "max_threads")
    kb = fst._count("bbuf_size_kb", bbuf_size_kb, "a size in KiB, 0 or more")
    chosen = (kb, threads) != (BBUF_SIZE_KB_DEFAULT, MAX_THREADS_DEFAULT)
    return dict(threads=threads if chosen else 0,
                staging_bytes=kb * 1024 * max(threads, 1) if chosen else 0,
                gds="off" if nogds else "auto")


def fspath(f) -> str:
    return os.fspath(f)
