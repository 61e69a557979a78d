"""Other loaders' Python APIs over fst, name for name, so that code written
for them runs with an import changed. See docs/python.md.

- fst.compat.safetensors: the reference safetensors 0.8 API (with its torch
  and numpy submodules).
- fst.compat.fastsafetensors: fastsafetensors 0.5's modules and classes
  (SafeTensorsFileLoader, ParallelLoader, fastsafe_open, ...).
"""
