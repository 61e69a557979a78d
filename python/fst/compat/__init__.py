"""Other loaders' Python APIs over fst, so that code written for them runs
with an import changed. See docs/python.md.

- fst.compat.fastsafetensors: fastsafetensors 0.5's modules and classes
  (SafeTensorsFileLoader, ParallelLoader, fastsafe_open, ...).
"""
