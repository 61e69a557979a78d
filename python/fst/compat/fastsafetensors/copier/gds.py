"""fastsafetensors.copier.gds: see fastsafetensors.copier."""
from .._placeholders import placeholder

GdsFileCopier = placeholder("fastsafetensors.copier.gds.GdsFileCopier")
