"""fst: load safetensors checkpoints into CPU or GPU memory, byte-exact.

Zero-copy torch and numpy tensors over libfst (DLPack), with the reference
`safetensors` API (load_file, safe_open, save_file, save; all of it, module
by module, in fst.compat.safetensors), a streaming iterator, and the
fastsafetensors API (SafeTensorsFileLoader, fastsafe_open). See
docs/python.md.

The package's modules, each one concern (the names are fst's, from here):
_errors (the exceptions), _args (the load options, checked), _tensors
(libfst's tensors as torch tensors and numpy arrays), _load (Checkpoint,
load, iter_tensors), _write (tensors as the writer's entries), _reference
(load_file, save_file, save), _dist (Comm, node_comm, load_sharded); the extension
_fst; the faces of other loaders' APIs in compat/, engine plugins in
integrations/.
"""
from __future__ import annotations

# operator, os, sys and these typing names have always been in fst's
# namespace: dir(fst) keeps them.
import operator  # noqa: F401
import os  # noqa: F401
import sys  # noqa: F401
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple, Union  # noqa: F401

from . import _fst
from ._errors import (
    ArgumentTypeError, CancelledError, DeviceError, FileChangedError, FileError,
    FilePermissionError, FormatError, MissingDependencyError, NoSuchFileError, NoSuchTensorError,
    OutOfMemoryError, SafetensorError, UnsupportedError, UsageError)
from ._load import Checkpoint, iter_tensors, load, trim
from ._reference import load_file, save, save_file
from ._dist import Comm, load_sharded, node_comm

# The private helpers that fst.compat and fst.integrations take from fst's
# namespace (they call fst.load, fst.iter_tensors and these through it).
from ._args import (  # noqa: F401
    _check_options, _check_target, _count, _device, _framework, _load_kwargs, _threads)
from ._tensors import _check_dtypes, _convert, _need_torch, _torch_dtypes  # noqa: F401
from ._load import _prepare  # noqa: F401
from ._reference import _backend, _backend_options, _is_url  # noqa: F401
from ._write import _check_metadata, _write_order  # noqa: F401

__all__ = [
    "SafetensorError", "UsageError", "ArgumentTypeError", "FormatError", "FileError",
    "NoSuchFileError", "FilePermissionError", "OutOfMemoryError", "DeviceError",
    "UnsupportedError", "MissingDependencyError", "CancelledError", "FileChangedError",
    "NoSuchTensorError",
    "load_file", "load", "safe_open", "save_file", "save", "iter_tensors", "Checkpoint",
    "SafeTensorsFileLoader", "SingleGroup", "fastsafe_open", "trim", "__version__",
    "Comm", "load_sharded", "node_comm",
]

__version__ = _fst.version()

# The reference's safe_open is fst's: one object, defined with the rest of
# the reference API (imported last: it builds on the names above).
from .compat.safetensors import safe_open  # noqa: E402

# ---- the fastsafetensors API: switching is an import change. Imported on
# first use (PEP 562): fst.compat.fastsafetensors and what it brings in were
# most of `import fst`'s time, which a server that never touches that face
# pays at start-up and the CLI's Python callers on every run.
_FASTSAFE = ("FilesBufferOnDevice", "SafeTensorsFileLoader", "SingleGroup", "fastsafe_open")


def __getattr__(name):
    if name in _FASTSAFE:
        from .compat import fastsafetensors
        value = getattr(fastsafetensors, name)
        globals()[name] = value  # later look-ups go straight to the module's dict
        return value
    raise AttributeError(f"module 'fst' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_FASTSAFE))
