"""fst's errors are also the Python built-ins a caller catches (docs/python.md,
"Errors"): a missing file is a FileNotFoundError, an unreadable one a
PermissionError, each with errno, strerror and filename (the failing shard
of a directory, the shard being read during a load); str() stays fst's
message."""
import errno
import os
import pickle

import numpy as np
import pytest

from fsttest import write_safetensors

F32 = ("a", "F32", (4,), np.arange(4, dtype=np.float32).tobytes())
BF16 = ("b", "BF16", (2,), bytes(4))
E4M3 = ("e4m3", "F8_E4M3", (3,), bytes(3))
E8M0 = ("e8m0", "F8_E8M0", (2,), bytes(2))
U16 = ("u16", "U16", (3,), np.array([1, 2, 3], np.uint16).tobytes())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("early")
    out = {
        "mixed": write_safetensors(d / "mixed.safetensors", [F32, BF16]),
        "plain": write_safetensors(d / "plain.safetensors", [F32]),
        "f8": write_safetensors(d / "f8.safetensors", [F32, E4M3]),
        "e8m0": write_safetensors(d / "e8m0.safetensors", [F32, E8M0]),
        "u16": write_safetensors(d / "u16.safetensors", [F32, U16]),
    }
    # a BF16 tensor in the second of two shards only
    shards = d / "shards"
    shards.mkdir()
    write_safetensors(shards / "1.safetensors", [F32])
    write_safetensors(shards / "2.safetensors", [BF16])
    out["shards"] = shards
    return {k: str(v) for k, v in out.items()}


def shard_files(files):
    from pathlib import Path
    return sorted(str(p) for p in Path(files["shards"]).glob("*.safetensors"))


# ---------------------------------------------------------------- errors

def entry_points_local(fst):
    return {
        "load_file": lambda p: fst.load_file(p, framework="numpy"),
        "load": lambda p: fst.load(p, framework="numpy", names=["a"]),
        "safe_open": lambda p: fst.safe_open(p, framework="numpy"),
        "iter_tensors": lambda p: list(fst.iter_tensors(p, framework="numpy")),
        "Checkpoint": lambda p: fst.Checkpoint(p),
        "fastsafe_open": lambda p: fst.fastsafe_open(p, framework="numpy", nogds=True),
        "low_level": lambda p: fst._fst.Checkpoint(str(p)),
    }


def check_os_error(e, fst, cls, builtin, err, filename):
    assert type(e) is cls, type(e)
    assert isinstance(e, builtin) and isinstance(e, fst.FileError), type(e).__mro__
    assert isinstance(e, OSError) and isinstance(e, fst.SafetensorError) and e.code == -3
    assert e.errno == err and e.strerror == os.strerror(err), (e.errno, e.strerror)
    assert e.filename == filename, (e.filename, filename)
    assert str(e).startswith(filename + ": ") and os.strerror(err) in str(e), str(e)


def test_missing_file_is_file_not_found(fst_pkg, tmp_path):
    missing = tmp_path / "nope.safetensors"
    for entry, call in entry_points_local(fst_pkg).items():
        with pytest.raises(FileNotFoundError) as ei:
            call(missing)
        check_os_error(ei.value, fst_pkg, fst_pkg.NoSuchFileError, FileNotFoundError,
                       errno.ENOENT, str(missing))


def test_missing_shard_names_the_shard(fst_pkg, tmp_path, files):
    """A directory whose shard (a dangling link: listed, not openable) or
    index cannot be opened: filename is that file, not the directory."""
    d = tmp_path / "dangling"
    d.mkdir()
    write_safetensors(d / "1.safetensors", [F32])
    (d / "2.safetensors").symlink_to(tmp_path / "gone.safetensors")
    for entry, call in entry_points_local(fst_pkg).items():
        if entry == "fastsafe_open":
            continue  # takes files, not directories
        with pytest.raises(FileNotFoundError) as ei:
            call(d)
        check_os_error(ei.value, fst_pkg, fst_pkg.NoSuchFileError, FileNotFoundError,
                       errno.ENOENT, str(d / "2.safetensors"))
    idx = tmp_path / "index"
    idx.mkdir()
    write_safetensors(idx / "1.safetensors", [F32])
    (idx / "model.safetensors.index.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(FileNotFoundError) as ei:
        fst_pkg.load(idx, framework="numpy")
    check_os_error(ei.value, fst_pkg, fst_pkg.NoSuchFileError, FileNotFoundError, errno.ENOENT,
                   str(idx / "model.safetensors.index.json"))


@pytest.fixture
def faults(fst_pkg):
    """faults(spec): arm fst's fault injection in this process; disarmed
    after the test."""
    yield fst_pkg._fst.fault_set
    fst_pkg._fst.fault_set(None)


def test_permission_denied_is_permission_error(fst_pkg, tmp_path, files, faults):
    """open(2) failing with EACCES (injected, so that root sees it too)."""
    for entry, call in entry_points_local(fst_pkg).items():
        faults("open:1:EACCES")
        with pytest.raises(PermissionError) as ei:
            call(files["plain"])
        faults(None)
        check_os_error(ei.value, fst_pkg, fst_pkg.FilePermissionError, PermissionError,
                       errno.EACCES, files["plain"])


def test_permission_denied_chmod(fst_pkg, tmp_path, files):
    if os.geteuid() == 0:
        pytest.skip("root reads any file (the injected EACCES test covers root)")
    p = tmp_path / "locked.safetensors"
    p.write_bytes(open(files["plain"], "rb").read())
    p.chmod(0)
    try:
        with pytest.raises(PermissionError) as ei:
            fst_pkg.load_file(p, framework="numpy")
    finally:
        p.chmod(0o600)
    check_os_error(ei.value, fst_pkg, fst_pkg.FilePermissionError, PermissionError,
                   errno.EACCES, str(p))


@pytest.mark.parametrize("io", ["pread", "uring", "auto"])
def test_read_error_carries_errno_and_the_shard(fst_pkg, files, faults, io):
    """A read failing mid-load (after the headers) is a FileError with the
    read's errno and the shard it was reading, from load and iter_tensors."""
    ck = fst_pkg.Checkpoint(files["shards"])
    want = shard_files(files)[0]  # read first, so it fails first
    site = {"pread": "read:1+:EIO", "uring": "uring_complete:1+:EIO",
            "auto": "read:1+:EIO,uring_complete:1+:EIO,mmap:1+:EIO"}[io]
    calls = {"load": lambda: fst_pkg.load(ck, framework="numpy", io=io, names=["a"]),
             "iter_tensors": lambda: list(fst_pkg.iter_tensors(ck, framework="numpy", io=io,
                                                               names=["a"]))}
    for entry, call in calls.items():
        faults(site)
        with pytest.raises(fst_pkg.FileError) as ei:
            call()
        faults(None)
        e = ei.value
        assert type(e) is fst_pkg.FileError, (entry, type(e))
        assert e.errno == errno.EIO and e.strerror == os.strerror(errno.EIO), (entry, e.errno)
        assert e.filename == want and str(e).startswith(want + ": "), (entry, e.filename, str(e))


def test_file_changed_names_the_file(fst_pkg, files, faults):
    """A file that ends early while read is a FileChangedError (an OSError)
    whose filename is that file; libfst gives no errno for it."""
    ck = fst_pkg.Checkpoint(files["plain"])
    faults("short_read:1")
    with pytest.raises(fst_pkg.FileChangedError) as ei:
        fst_pkg.load(ck, framework="numpy", io="pread")
    e = ei.value
    assert isinstance(e, OSError) and e.code == -9 and e.errno is None
    assert e.filename == files["plain"] and str(e).startswith(files["plain"] + ": ")


def test_os_errors_pickle(fst_pkg, tmp_path):
    missing = str(tmp_path / "nope.safetensors")
    with pytest.raises(fst_pkg.NoSuchFileError) as ei:
        fst_pkg.Checkpoint(missing)
    back = pickle.loads(pickle.dumps(ei.value))
    assert type(back) is fst_pkg.NoSuchFileError and str(back) == str(ei.value)
    assert (back.errno, back.filename, back.code) == (errno.ENOENT, missing, -3)


def test_error_classes(fst_pkg):
    E = fst_pkg
    assert issubclass(E.NoSuchFileError, (E.FileError, FileNotFoundError))
    assert issubclass(E.FilePermissionError, (E.FileError, PermissionError))
    for name in ("NoSuchFileError", "FilePermissionError"):
        assert name in E.__all__
