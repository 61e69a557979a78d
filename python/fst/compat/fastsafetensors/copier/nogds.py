"""fastsafetensors.copier.nogds: see fastsafetensors.copier."""
from .._placeholders import placeholder

NoGdsFileCopier = placeholder("fastsafetensors.copier.nogds.NoGdsFileCopier")
