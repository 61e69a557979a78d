"""fastsafetensors' Python API over fst: code written for fastsafetensors
0.5 runs with `fastsafetensors` replaced by `fst.compat.fastsafetensors` in
its imports, module for module:

    from fst.compat.fastsafetensors import SafeTensorsFileLoader, SingleGroup
    from fst.compat.fastsafetensors.parallel_loader import ParallelLoader
    from fst.compat.fastsafetensors.st_types import Device, DType

Loading is fst's (fst.load, fst.iter_tensors); with a torch.distributed
group each file is read by the rank it is registered to and the others get
its tensors over the group, as in fastsafetensors. The differences are
listed in docs/python.md ("The fastsafetensors API")."""
from .common import SafeTensorsMetadata, SingleGroup, TensorFrame, get_device_numa_node
from .file_buffer import FilesBufferOnDevice
from .loader import SafeTensorsFileLoader, fastsafe_open
from .parallel_loader import ParallelLoader

# the fastsafetensors release whose API this follows
__version__ = "0.5.0"

__all__ = [
    "SafeTensorsMetadata", "SingleGroup", "TensorFrame", "get_device_numa_node",
    "FilesBufferOnDevice", "SafeTensorsFileLoader", "fastsafe_open", "ParallelLoader",
]
