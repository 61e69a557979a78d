"""The process-wide calls of fastsafetensors' extension module
(fastsafetensors.cpp) that code outside it makes. fst has no such
extension: it opens the CUDA driver, reads and stages by itself, so these
answer for fst. The readers, device buffers and cuFile calls of
fastsafetensors.cpp are not here (docs/python.md)."""
import ctypes
import logging
from dataclasses import dataclass

from ._placeholders import placeholder

_log = logging.getLogger("fst.compat.fastsafetensors")


def set_debug_log(flag: bool) -> None:
    """fastsafetensors' C++ debug log. fst logs through FST_LOG; here the
    flag sets this package's Python logger to DEBUG."""
    _log.setLevel(logging.DEBUG if flag else logging.NOTSET)


def load_library_functions(cudart_lib_name: str = "") -> None:
    """fastsafetensors opens libcudart here. fst opens libcuda when a load
    first needs a GPU, so there is nothing to do."""


def set_gil_release(flag: bool) -> None:
    """fst releases the GIL while it reads, always."""


def is_cuda_found() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def is_hip_found() -> bool:
    return False  # fst loads to CUDA devices only


def get_device_pci_bus(device: int) -> str:
    """"domain:bus:device.function" of CUDA device `device`, "" without one."""
    if not is_cuda_found():
        return ""
    import torch
    try:
        p = torch.cuda.get_device_properties(device)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:
        return ""


def read_buffer(address: int, length: int) -> bytes:
    """`length` bytes of host memory at `address`."""
    return ctypes.string_at(address, length)


@dataclass
class cpp_metrics:
    bounce_buffer_bytes: int = 0


def get_cpp_metrics() -> cpp_metrics:
    """fastsafetensors counts the bounce buffers its live readers hold. fst
    keeps its staging inside libfst and every load of this package has
    finished or been cancelled when its call returns, so no staging is
    held for a reader here: the count is 0. (libfst may cache up to 1 GiB
    of pinned staging for the next GPU load; fst.trim() frees it.)"""
    return cpp_metrics(0)


# fastsafetensors' raw device buffers and readers, named in its callers'
# signatures; fst has no such objects (see _placeholders)
gds_device_buffer = placeholder("fastsafetensors.cpp.gds_device_buffer")
nogds_file_reader = placeholder("fastsafetensors.cpp.nogds_file_reader")
gds_file_reader = placeholder("fastsafetensors.cpp.gds_file_reader")
