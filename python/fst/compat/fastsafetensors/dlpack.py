"""fastsafetensors.dlpack builds DLPack capsules over raw device pointers
of its own buffers. fst hands out tensors over its own allocations, so
there are no raw buffers to wrap; the name is here so that imports of it
work, and using it says why it cannot."""
from ._placeholders import placeholder

from_cuda_buffer = placeholder("fastsafetensors.dlpack.from_cuda_buffer")
