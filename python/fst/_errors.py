"""fst's exceptions, and the one function the extension calls to make one
for a libfst failure (its class from the FST_E* status and the errno)."""
from __future__ import annotations

import errno as _errno
import os
from typing import Optional

from . import _fst


class SafetensorError(Exception):
    """Any failure reported by fst; `code` is the FST_E* status."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class UsageError(SafetensorError, ValueError):
    """A bad argument (FST_EUSAGE)."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong type: a UsageError that is also the
    TypeError Python callers expect for one."""


class NoSuchTensorError(UsageError, KeyError):
    """A tensor name the checkpoint lacks: a UsageError (the reference
    raises its SafetensorError) that is also the KeyError a lookup by name
    raises."""

    def __str__(self):
        # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


class FormatError(SafetensorError, ValueError):
    """The input breaks a safetensors or index rule; the message names the
    file, the tensor and the rule (FST_EFORMAT)."""


class _OSFailure(SafetensorError, OSError):
    """What the fst errors that are OSErrors share: errno, strerror and
    filename as OSError has them, and str() the fst message, which names the
    file and what was being done (OSError's own str() would drop that)."""

    def __init__(self, message: str, code: int = 0, errno: Optional[int] = None,
                 filename: Optional[str] = None):
        super().__init__(message, code)
        if errno:
            self.errno = errno
            self.strerror = os.strerror(errno)
        self.filename = filename

    def __str__(self):
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):
        return type(self), (str(self), self.code, self.errno, self.filename)


class FileError(_OSFailure):
    """A file could not be opened or read (FST_EIO); errno and filename say
    which and why."""


class NoSuchFileError(FileError, FileNotFoundError):
    """A file that is not there (FST_EIO with ENOENT)."""


class FilePermissionError(FileError, PermissionError):
    """A file that may not be read (FST_EIO with EACCES or EPERM)."""


class OutOfMemoryError(SafetensorError, MemoryError):
    """Host memory could not be allocated or pinned (FST_ENOMEM)."""


class DeviceError(SafetensorError, RuntimeError):
    """The GPU driver or a GPU library failed (FST_EDEVICE)."""


class UnsupportedError(SafetensorError, RuntimeError):
    """The platform cannot do what was asked (FST_EUNSUPPORTED)."""


class MissingDependencyError(UnsupportedError, ImportError):
    """A package the load needs cannot be imported: torch for
    framework='pt', ml_dtypes for BF16 and float8 tensors in numpy. Raised
    from the headers, before any tensor data is read; `name` is the package
    to install."""

    def __init__(self, message: str, package: Optional[str] = None):
        super().__init__(message, -6)
        self.name = package  # ImportError's: the module that is missing
        self.msg = message

    def __reduce__(self):
        return type(self), (self.msg, self.name)


class CancelledError(SafetensorError):
    """The load was cancelled (FST_ECANCELED)."""


class FileChangedError(_OSFailure):
    """A file changed while it was being read (FST_ECHANGED)."""


_BY_CODE = {
    -1: UsageError, -2: FormatError, -3: FileError, -4: OutOfMemoryError,
    -5: DeviceError, -6: UnsupportedError, -7: CancelledError, -9: FileChangedError,
}
_BY_ERRNO = {_errno.ENOENT: NoSuchFileError, _errno.EACCES: FilePermissionError,
             _errno.EPERM: FilePermissionError}


def _error(message: str, code: int, sys_errno: int, filename: Optional[str]):
    """The exception for a libfst failure (the extension calls it)."""
    cls = _BY_CODE.get(code, SafetensorError)
    if cls is FileError:
        cls = _BY_ERRNO.get(sys_errno, FileError)
    if issubclass(cls, _OSFailure):
        return cls(message, code, sys_errno, filename)
    return cls(message, code)


def _rank_status(error: Optional[BaseException]):
    """What a rank tells the others of its failure (None: it succeeded), for
    _raise_agreed; a failure that is not fst's counts as a device one."""
    if error is None:
        return None
    # a missing package's name goes with it: the others raise the same
    # MissingDependencyError, whose name says what to install
    package = error.name if isinstance(error, MissingDependencyError) else None
    return type(error).__name__, str(error), getattr(error, "code", -5), package


def _raise_agreed(error: Optional[BaseException], statuses, what: str) -> None:
    """After the ranks gathered every rank's _rank_status: this rank's own
    error if it failed, else the first failed rank's, as the same fst class,
    "rank R <what>: <its message>"; nothing where every rank succeeded."""
    if error is not None:
        raise error
    for rank, status in enumerate(statuses):
        if status is not None:
            name, message, code, package = status
            cls = globals().get(name)
            if not (isinstance(cls, type) and issubclass(cls, SafetensorError)):
                cls = SafetensorError
            if issubclass(cls, MissingDependencyError):
                raise cls(f"rank {rank} {what}: {message}", package)
            raise cls(f"rank {rank} {what}: {message}", code)


_fst._set_errors(SafetensorError, _error)
