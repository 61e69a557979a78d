"""fastsafetensors.copier.unified: see fastsafetensors.copier."""
from .._placeholders import placeholder

UnifiedMemCopier = placeholder("fastsafetensors.copier.unified.UnifiedMemCopier")


def is_unified_memory_system(framework=None) -> bool:
    """fastsafetensors picks a copier for CPU-GPU shared memory with this;
    fst has no such copier to pick, so the answer is always False."""
    return False
