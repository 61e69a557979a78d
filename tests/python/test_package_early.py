"""The fst package fails early and as Python expects (docs/python.md,
"Errors" and "Checked before anything is read"):

- a missing package (torch for framework='pt', ml_dtypes for BF16 and
  float8 tensors in numpy, counting only the tensors names= keeps) raises
  MissingDependencyError, an ImportError saying what to install, before any
  tensor data is read, from every entry point;
- a missing file is also a FileNotFoundError, an unreadable one a
  PermissionError, each with errno, strerror and filename (the failing
  shard of a directory); str() stays fst's message;
- bad argument types and values are refused before anything is opened:
  UsageError (a ValueError) for values, ArgumentTypeError (a UsageError and
  a TypeError) for types.

"Nothing was read" is proven with fault injection: in a child process
every Checkpoint is opened with faults off and then arms every data read
site (pread, io_uring, mmap), so a load that reads a byte of tensor data
raises FileError; a control load shows it does, from each entry point."""
import errno
import json
import os
import pickle
import sys
import types

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


# ---------------------------------------------------------------- the child

PRELUDE = """
import json, sys, types
{hide}
import fst

class Armed(fst.Checkpoint):
    # headers are read with faults off; every data read after them fails
    def __init__(self, path):
        fst._fst.fault_set(None)
        super().__init__(path)
        fst._fst.fault_set("read:1+,short_read:1+,uring_submit:1+,mmap:1+")

fst.Checkpoint = Armed
comm = types.SimpleNamespace(device=0, _comm=None)  # load_sharded fails before using it

def outcome(call):
    try:
        call()
    except Exception as e:
        return {{"class": type(e).__name__, "import": isinstance(e, ImportError),
                "missing": isinstance(e, getattr(fst, "MissingDependencyError", ())),
                "name": getattr(e, "name", None), "message": str(e)}}
    return {{"class": "loaded"}}

def loader(files, **kw):
    ld = fst.SafeTensorsFileLoader(fst.SingleGroup(), nogds=True, **kw)
    ld.add_filenames({{0: files}})
    return ld.copy_files_to_device()

results = {{}}
"""


def entry_points(path, framework, names=None):
    """Source of one call per entry point that loads `path` (a file, or a
    list of shard files for those that take several)."""
    one = path if isinstance(path, str) else path[0]
    many = [path] if isinstance(path, str) else path
    kw = f"framework={framework!r}" + ("" if names is None else f", names={names!r}")
    loader_kw = "" if framework == "pt" else f", framework={framework!r}"
    calls = {
        "load": f"fst.load({one!r}, {kw})",
        "load_file": f"fst.load_file({one!r}, {kw})",
        "safe_open": f"fst.safe_open({one!r}, {kw}).get_tensor('a')",
        "iter_tensors": f"next(fst.iter_tensors({many!r}, {kw}))",
        "SafeTensorsFileLoader": f"loader({many!r}{loader_kw})",
        "fastsafe_open": f"fst.fastsafe_open({many!r}, framework={framework!r}, nogds=True)",
    }
    if names is not None:  # the fastsafetensors API has no names=
        del calls["SafeTensorsFileLoader"], calls["fastsafe_open"]
    if framework == "pt":
        calls["load_sharded"] = f"fst.load_sharded({one!r}, comm)"
    return calls


def run_entries(run_python, calls, hide=""):
    code = PRELUDE.format(hide=hide) + "".join(
        f"results[{k!r}] = outcome(lambda: {v})\n" for k, v in calls.items()) + \
        "print(json.dumps(results))\n"
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


NO_TORCH = "sys.modules['torch'] = None  # import torch -> ImportError"
NO_ML_DTYPES = "sys.modules['ml_dtypes'] = None  # import ml_dtypes -> ImportError"


def test_the_harness_fails_any_data_read(fst_pkg, files, run_python):
    """Control: with every package there, each entry point's load reads
    data and so fails with FileError under the armed faults; the tests
    below getting anything else means nothing was read."""
    pytest.importorskip("ml_dtypes")
    calls = entry_points(files["mixed"], "numpy")
    calls.update(several_files(files))
    for entry, got in run_entries(run_python, calls).items():
        assert got["class"] == "FileError", (entry, got)


def test_no_torch_is_reported_before_reading(fst_pkg, files, run_python):
    for entry, got in run_entries(run_python, entry_points(files["plain"], "pt"),
                                  NO_TORCH).items():
        assert got["class"] == "MissingDependencyError" and got["import"], (entry, got)
        assert got["name"] == "torch", (entry, got)
        assert "framework='pt' needs torch: pip install torch" in got["message"], (entry, got)


def test_no_torch_comes_before_a_missing_file(fst_pkg, tmp_path, run_python):
    """load needs torch whatever the file: it says so without opening it."""
    missing = str(tmp_path / "missing.safetensors")
    got = run_entries(run_python, {"load": f"fst.load({missing!r})"}, NO_TORCH)["load"]
    assert got["class"] == "MissingDependencyError", got


def shard_files(files):
    from pathlib import Path
    return sorted(str(p) for p in Path(files["shards"]).glob("*.safetensors"))


def several_files(files):
    """The entry points that take several files, over the two shards."""
    return {f"{k} (shards)": v for k, v in entry_points(shard_files(files), "numpy").items()
            if k in ("iter_tensors", "SafeTensorsFileLoader", "fastsafe_open")}


@pytest.mark.parametrize("case,tensor,dtype", [("mixed", "b", "BF16"),
                                               ("f8", "e4m3", "F8_E4M3")])
def test_no_ml_dtypes_is_reported_before_reading(fst_pkg, files, run_python, case, tensor,
                                                 dtype):
    calls = entry_points(files[case], "numpy")
    # the BF16 tensor is in the second shard: the first must not be read either
    calls.update(several_files(files))
    want_tensor = {k: ("b" if "(shards)" in k else tensor) for k in calls}
    want_dtype = {k: ("BF16" if "(shards)" in k else dtype) for k in calls}
    for entry, got in run_entries(run_python, calls, NO_ML_DTYPES).items():
        assert got["class"] == "MissingDependencyError" and got["import"], (entry, got)
        assert got["name"] == "ml_dtypes", (entry, got)
        want = (f"tensor {want_tensor[entry]!r} is {want_dtype[entry]}: numpy needs ml_dtypes "
                "for it: pip install ml_dtypes")
        assert want in got["message"], (entry, got)


def test_no_ml_dtypes_counts_only_the_names_loaded(fst_pkg, files, run_python):
    """names= picking the BF16 tensor fails before reading; names= leaving it
    out, and checkpoints without such dtypes (F8_E8M0 is uint8), load."""
    picked = entry_points(files["mixed"], "numpy", names=["a", "b"])
    for entry, got in run_entries(run_python, picked, NO_ML_DTYPES).items():
        assert got["class"] == "MissingDependencyError", (entry, got)
        assert "tensor 'b' is BF16" in got["message"], (entry, got)
    r = run_python(f"""
        import sys
        {NO_ML_DTYPES}
        import fst
        got = fst.load({files["mixed"]!r}, framework="numpy", names=["a"])
        print(sorted(got), got["a"].tolist())
        print(sorted(dict(fst.iter_tensors({files["mixed"]!r}, framework="numpy", names=["a"]))))
        print(sorted(fst.load_file({files["plain"]!r}, framework="numpy")))
        got = fst.load_file({files["e8m0"]!r}, framework="numpy")
        print(sorted(got), got["e8m0"].dtype)
        with fst.safe_open({files["mixed"]!r}, framework="numpy") as f:
            print(f.keys(), f.get_slice("b").get_dtype())  # no load, no ml_dtypes needed
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["['a'] [0.0, 1.0, 2.0, 3.0]", "['a']", "['a']",
                                     "['a', 'e8m0'] uint8", "['a', 'b'] BF16"], r.stdout


def test_old_torch_without_unsigned_dtypes(fst_pkg, files, run_python, tmp_path):
    """A torch without torch.uint16 (before 2.3) cannot take a U16 tensor:
    UnsupportedError naming it, before reading. A stand-in torch module
    without those dtypes plays the old torch."""
    (tmp_path / "torch.py").write_text("__version__ = '2.0.0-stand-in'\n")
    hide = f"sys.path.insert(0, {str(tmp_path)!r})"
    # The fastsafetensors API uses torch.device and torch.distributed, which
    # the stand-in lacks: it plays an old torch only for fst's own calls.
    calls = {k: v for k, v in entry_points(files["u16"], "pt").items()
             if k not in ("load_sharded", "SafeTensorsFileLoader", "fastsafe_open")}
    for entry, got in run_entries(run_python, calls, hide).items():
        assert got["class"] == "UnsupportedError", (entry, got)
        assert "tensor 'u16': U16 has no torch dtype in torch 2.0.0-stand-in" in got["message"]


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


def test_errors_pickle(fst_pkg, tmp_path):
    missing = str(tmp_path / "nope.safetensors")
    with pytest.raises(fst_pkg.NoSuchFileError) as ei:
        fst_pkg.Checkpoint(missing)
    back = pickle.loads(pickle.dumps(ei.value))
    assert type(back) is fst_pkg.NoSuchFileError and str(back) == str(ei.value)
    assert (back.errno, back.filename, back.code) == (errno.ENOENT, missing, -3)
    e = fst_pkg.MissingDependencyError("tensor 'b' is BF16: ...", "ml_dtypes")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is fst_pkg.MissingDependencyError and str(back) == str(e)
    assert (back.name, back.code) == ("ml_dtypes", -6)


def test_error_classes(fst_pkg):
    E = fst_pkg
    assert issubclass(E.NoSuchFileError, (E.FileError, FileNotFoundError))
    assert issubclass(E.FilePermissionError, (E.FileError, PermissionError))
    assert issubclass(E.MissingDependencyError, ImportError)
    assert issubclass(E.MissingDependencyError, E.UnsupportedError)
    assert issubclass(E.ArgumentTypeError, TypeError) and issubclass(E.ArgumentTypeError,
                                                                      E.UsageError)
    for name in ("NoSuchFileError", "FilePermissionError", "MissingDependencyError",
                 "ArgumentTypeError"):
        assert name in E.__all__


# ---------------------------------------------------------------- arguments

THREADS = r"expected 0 \(one per CPU, at most 16\) or 1\.\.64"

BAD_VALUES = [
    (dict(threads=-1), r"^threads=-1: " + THREADS),
    (dict(threads=65), r"^threads=65: " + THREADS),
    (dict(staging_bytes=-1), r"^staging_bytes=-1: expected a byte count >= 0"),
    (dict(chunk_bytes=-4096), r"^chunk_bytes=-4096: expected a byte count >= 0"),
    (dict(align=-8), r"^align=-8: expected a power of two"),
    (dict(device=-1), r"^device=-1: expected 'cpu', 'cuda', 'cuda:N', an int N"),
]

BAD_TYPES = [
    (dict(threads=True), r"^threads=True: expected an int"),
    (dict(threads="4"), r"^threads='4': expected an int"),
    (dict(threads=1.5), r"^threads=1.5: expected an int"),
    (dict(staging_bytes="1MiB"), r"^staging_bytes='1MiB': expected an int"),
    (dict(align=256.0), r"^align=256.0: expected an int"),
    (dict(names="xyz"), r"^names='xyz': expected an iterable of tensor names, not one str"),
    (dict(names=b"a"), r"^names=b'a': expected an iterable of tensor names, not one bytes"),
    (dict(names=5), r"^names=5: expected an iterable of tensor names"),
    (dict(names=["a", 7]), r"^names: item 1 is 7: expected a tensor name \(str\)"),
    (dict(framework=3), r"^framework=3: expected 'pt' or 'numpy'"),
    (dict(device=1.5), r"^device=1.5: expected 'cpu', 'cuda', 'cuda:N', an int N or a "
                       r"torch.device"),
    (dict(device=True), r"^device=True: expected"),
    (dict(device=[0]), r"^device=\[0\]: expected"),
    (dict(io=1), r"^io=1: expected one of \['auto', 'mmap', 'pread', 'uring'\]"),
    (dict(gds=None), r"^gds=None: expected one of \['auto', 'off', 'on'\]"),
]


def argument_calls(fst, path, kw):
    kw = {"framework": "numpy", **kw}
    rest = {k: v for k, v in kw.items() if k != "device"}
    return {
        "load": lambda: fst.load(path, **kw),
        "load_file": lambda: fst.load_file(path, kw.get("device", "cpu"), **rest),
        "iter_tensors": lambda: next(fst.iter_tensors(path, **kw)),
        "safe_open": lambda: fst.safe_open(path, **kw).get_tensor("a"),
    }


@pytest.mark.parametrize("kw,pattern", BAD_VALUES)
def test_bad_argument_values(fst_pkg, tmp_path, files, kw, pattern):
    """UsageError (a ValueError, not a TypeError) naming the argument; checked
    before the file is opened, so a missing file does not hide it."""
    missing = str(tmp_path / "missing.safetensors")
    for path in (files["plain"], missing):
        for entry, call in argument_calls(fst_pkg, path, kw).items():
            if entry == "safe_open" and path == missing:
                continue  # opens the file at construction, checks options at the load
            with pytest.raises(fst_pkg.UsageError, match=pattern) as ei:
                call()
            assert not isinstance(ei.value, TypeError), entry
            assert isinstance(ei.value, ValueError) and ei.value.code == -1, entry


@pytest.mark.parametrize("kw,pattern", BAD_TYPES)
def test_bad_argument_types(fst_pkg, tmp_path, files, kw, pattern):
    """ArgumentTypeError: a TypeError, and a UsageError (code -1)."""
    missing = str(tmp_path / "missing.safetensors")
    for path in (files["plain"], missing):
        for entry, call in argument_calls(fst_pkg, path, kw).items():
            if entry == "safe_open" and path == missing:
                continue
            with pytest.raises(TypeError, match=pattern) as ei:
                call()
            assert type(ei.value) is fst_pkg.ArgumentTypeError, (entry, type(ei.value))
            assert isinstance(ei.value, fst_pkg.UsageError) and ei.value.code == -1, entry


def test_threads_up_to_the_library_limit(fst_pkg, files):
    """64 is libfst's own limit: the check refuses nothing the library takes."""
    got = fst_pkg.load(files["plain"], framework="numpy", threads=64)
    assert got["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    got = fst_pkg.load(files["plain"], framework="numpy", threads=np.int64(2), align=np.uint32(64))
    assert got["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_unknown_options(fst_pkg, files):
    """A misspelt option is a TypeError, as a keyword argument of load is,
    not ignored."""
    with pytest.raises(TypeError, match="iter_tensors.. got an unexpected keyword argument "
                                        "'thread'"):
        next(fst_pkg.iter_tensors(files["plain"], framework="numpy", thread=2))
    with pytest.raises(TypeError, match="safe_open.. got an unexpected keyword argument 'ioo'"):
        fst_pkg.safe_open(files["plain"], framework="numpy", ioo="pread")


def test_iter_tensors_names(fst_pkg, files, monkeypatch):
    """A name no checkpoint has is a UsageError, as in load; a generator
    of names is read once, also when a progress bar counts the bytes."""
    with pytest.raises(fst_pkg.UsageError, match="no tensor named 'zz'"):
        next(fst_pkg.iter_tensors(shard_files(files), framework="numpy", names=["a", "zz"]))
    bars = []

    class Bar:
        def __init__(self, total=None, **kw):
            self.total = total
            bars.append(self)

        def update(self, n):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=Bar))
    got = dict(fst_pkg.iter_tensors(files["mixed"], framework="numpy", progress=True,
                                    names=(n for n in ["a"])))
    assert sorted(got) == ["a"] and bars[-1].total == 16


def test_fastsafetensors_arguments(fst_pkg, files):
    """The loader checks its arguments when made, naming fastsafetensors'
    parameter."""
    with pytest.raises(fst_pkg.UsageError, match=r"^max_threads=-1: " + THREADS):
        fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), max_threads=-1, framework="numpy")
    with pytest.raises(fst_pkg.UsageError, match=r"^bbuf_size_kb=-1: expected a size in KiB"):
        fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), bbuf_size_kb=-1, framework="numpy")
    with pytest.raises(TypeError, match=r"^framework=1: expected 'pt' or 'numpy'"):
        fst_pkg.fastsafe_open([files["plain"]], framework=1, nogds=True)


def test_load_sharded_arguments(fst_pkg, files):
    """load_sharded's tensors land on comm's GPU: numpy cannot take them, so
    framework='numpy' is refused before anything is read; so are bad dims
    and options. (A stand-in comm: these fail before it is used.)"""
    comm = types.SimpleNamespace(device=1, _comm=None)
    with pytest.raises(fst_pkg.UsageError, match=r"'cuda:1' with framework='numpy'"):
        fst_pkg.load_sharded(files["plain"], comm, framework="numpy")
    with pytest.raises(fst_pkg.UsageError, match=r"^threads=-1: " + THREADS):
        fst_pkg.load_sharded(files["plain"], comm, threads=-1)
    with pytest.raises(TypeError, match=r"^dims\['a'\]='0': expected a dimension"):
        fst_pkg.load_sharded(files["plain"], comm, {"a": "0"})
    with pytest.raises(TypeError, match=r"^dims=\[0\]: expected a dict"):
        fst_pkg.load_sharded(files["plain"], comm, [0])
    # -1 is not "the last dimension" here, and no dimension passes as another
    for bad in (-1, -2, 2**31, 2**40):
        with pytest.raises(fst_pkg.UsageError,
                           match=rf"^dims\['a'\]={bad}: expected a dimension >= 0"):
            fst_pkg.load_sharded(files["plain"], comm, {"a": bad})


def test_load_sharded_refuses_a_comm_never_made(fst_pkg, files):
    """A Comm object whose communicator was never made (its __init__ did not
    run) is refused before any NCCL call, not taken for "no communicator"."""
    bare = fst_pkg._fst.Comm.__new__(fst_pkg._fst.Comm)
    ck = fst_pkg._fst.Checkpoint(files["plain"])
    table = [-1] * len(ck.keys())
    with pytest.raises(ValueError, match=r"^comm is a Comm without a communicator"):
        fst_pkg._fst.load_sharded(ck, bare, table)


def test_load_sharded_node_arguments(fst_pkg, tmp_path):
    """node= is checked against comm as libfst checks it, before the file is
    opened (a missing file does not hide it): a Comm, whose size divides
    comm's, whose rank is comm's rank modulo its size, on comm's GPU.
    (Stand-in Comms: these fail before either is used.)"""
    missing = str(tmp_path / "missing.safetensors")
    comm = types.SimpleNamespace(device=0, rank=5, world=8, _comm=None)

    def node(rank=1, world=4, device=0):
        return types.SimpleNamespace(device=device, rank=rank, world=world, _comm=None)

    for bad in (5, "node", types.SimpleNamespace(rank=1, world=4, device=0),
                node(world=4.0)):
        with pytest.raises(TypeError, match=r"^node=.*: expected an fst.Comm over this rank's "
                                            r"node's ranks \(fst.node_comm\(\)\), or None") as ei:
            fst_pkg.load_sharded(missing, comm, node=bad)
        assert type(ei.value) is fst_pkg.ArgumentTypeError and ei.value.code == -1
    cases = [
        (node(world=3), r"^node=: a node Comm of 3 ranks does not divide the group of 8 ranks"),
        (node(world=16), r"^node=: a node Comm of 16 ranks does not divide the group of 8"),
        (node(rank=2), r"^node=: rank 5 of the group is rank 2 of the node Comm, not 1: a "
                       r"node's ranks must be consecutive ranks of the group"),
        (node(device=1), r"^node=: the node Comm is on cuda:1, comm on cuda:0"),
    ]
    for bad, pattern in cases:
        with pytest.raises(fst_pkg.UsageError, match=pattern) as ei:
            fst_pkg.load_sharded(missing, comm, node=bad)
        assert not isinstance(ei.value, TypeError) and ei.value.code == -1
    # the checks that pass go on: to torch (where it is missing), then the file
    for good in (None, node(), node(rank=5, world=8), node(rank=0, world=1)):
        with pytest.raises((fst_pkg.NoSuchFileError, fst_pkg.MissingDependencyError)):
            fst_pkg.load_sharded(missing, comm, node=good)


@pytest.mark.parametrize("kw,cls,pattern", [
    (dict(ranks_per_node=0), "UsageError", r"^ranks_per_node=0: expected an int >= 1, or None "
                                           r"for LOCAL_WORLD_SIZE"),
    (dict(ranks_per_node=-2), "UsageError", r"^ranks_per_node=-2: expected an int >= 1"),
    (dict(ranks_per_node="2"), "ArgumentTypeError", r"^ranks_per_node='2': expected an int"),
    (dict(ranks_per_node=2.0), "ArgumentTypeError", r"^ranks_per_node=2.0: expected an int"),
    (dict(ranks_per_node=True), "ArgumentTypeError", r"^ranks_per_node=True: expected an int"),
    (dict(ranks_per_node=2, timeout_ms=-1), "UsageError", r"^timeout_ms=-1: expected"),
    (dict(ranks_per_node=2, timeout_ms="5s"), "ArgumentTypeError", r"^timeout_ms='5s': "),
    (dict(), "UsageError", r"^ranks_per_node=None and LOCAL_WORLD_SIZE is not set"),
    (dict(env="two"), "UsageError", r"^LOCAL_WORLD_SIZE='two': expected a number of ranks"),
    (dict(env="0"), "UsageError", r"^LOCAL_WORLD_SIZE='0': expected a number of ranks >= 1"),
])
def test_node_comm_arguments(fst_pkg, monkeypatch, kw, cls, pattern):
    """node_comm's arguments are checked before torch.distributed is touched
    (here torch is hidden: the checks fail first)."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    if "env" in kw:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", kw.pop("env"))
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(fst_pkg.UsageError, match=pattern) as ei:
        fst_pkg.node_comm(**kw)
    assert type(ei.value).__name__ == cls and ei.value.code == -1


class FakeDist(types.ModuleType):
    """torch.distributed as node_comm uses it, for a process of rank `rank`
    in a job whose processes pass `groups` (one list of ranks per process;
    None: the world) and `sizes` (their ranks_per_node)."""

    def __init__(self, world, rank, groups=None, sizes=None):
        super().__init__("torch.distributed")
        self.world, self.rank = world, rank
        self.groups = groups or [list(range(world))] * world
        self.sizes = sizes
        self.made = []

    def get_world_size(self, group=None):
        return self.world if group is None else len(group)

    def get_rank(self, group=None):
        return self.rank if group is None else group.index(self.rank)

    def get_process_group_ranks(self, group):
        return list(group)

    def all_gather_object(self, out, obj):
        ranks, n, said = obj
        for r in range(self.world):
            k = self.sizes[r] if self.sizes else n
            out[r] = (self.groups[r], k, said if k == n else f"ranks_per_node={k}")

    def new_group(self, ranks):
        self.made.append(list(ranks))
        return ("group", tuple(ranks))


@pytest.fixture
def fake_dist(fst_pkg, monkeypatch):
    """make(world, rank, ...) -> FakeDist installed as torch.distributed, with
    fst's Comm replaced by a recorder of its arguments."""
    import fst._dist as d

    class Recorder:
        def __init__(self, group=None, device=None, timeout_ms=0):
            self.group, self.device, self.timeout_ms = group, device, timeout_ms

    monkeypatch.setattr(d, "Comm", Recorder)

    def make(world, rank, groups=None, sizes=None):
        fake = FakeDist(world, rank, groups, sizes)
        torch = types.ModuleType("torch")
        torch.distributed = fake
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", fake)
        return fake

    return make


def test_node_comm_makes_every_node_group_in_order(fst_pkg, fake_dist, monkeypatch):
    """Every process makes every node's group, in one order (as
    dist.new_group requires), and its Comm over its own node's."""
    dist = fake_dist(8, 5)
    c = fst_pkg.node_comm(4, device=3, timeout_ms=1500)
    assert dist.made == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (c.group, c.device, c.timeout_ms) == (("group", (4, 5, 6, 7)), 3, 1500)
    # ranks_per_node from LOCAL_WORLD_SIZE, as torchrun sets it
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    dist = fake_dist(8, 0)
    c = fst_pkg.node_comm()
    assert dist.made == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert c.group == ("group", (0, 1))
    # one node of the whole world
    dist = fake_dist(4, 3)
    assert fst_pkg.node_comm(4).group == ("group", (0, 1, 2, 3)) and len(dist.made) == 1


def test_node_comm_over_subgroups(fst_pkg, fake_dist):
    """With group=, each process's own group is split, and every node of
    every process's group is made on every process, in one order: here two
    tensor-parallel groups of 4, {0, 1, 6, 7} and {2, 3, 4, 5}."""
    a, b = [0, 1, 6, 7], [2, 3, 4, 5]
    groups = [a, a, b, b, b, b, a, a]
    for rank, want in ((3, (2, 3)), (6, (6, 7)), (4, (4, 5))):
        dist = fake_dist(8, rank, groups)
        c = fst_pkg.node_comm(2, group=groups[rank])
        assert dist.made == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert c.group == ("group", want)


def test_comm_id_failure_on_rank_0_fails_every_rank(fst_pkg, monkeypatch):
    """fst.Comm: rank 0 makes the NCCL id and broadcasts it. Where it cannot
    (no NCCL on its host), it broadcasts its error instead, so every rank
    raises: rank 0 its own error, the others the same class naming rank 0
    and the cause, none waiting for an id that will not come. Each rank is
    played in turn here, the broadcast carrying what rank 0 sent."""
    import fst._dist as d
    sent = []

    class Dist(types.ModuleType):
        def __init__(self, rank):
            super().__init__("torch.distributed")
            self.rank = rank

        def get_rank(self, group=None):
            return self.rank

        def get_world_size(self, group=None):
            return 2

        def get_global_rank(self, group, rank):
            return rank

        def broadcast_object_list(self, box, src=0, group=None):
            if self.rank == src:
                sent.append(pickle.loads(pickle.dumps(box)))
            else:
                box[:] = sent[-1]

    def play(rank, native):
        dist = Dist(rank)
        torch = types.ModuleType("torch")
        torch.distributed = dist
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", dist)
        monkeypatch.setattr(d, "_fst", native)
        return fst_pkg.Comm(device=0, timeout_ms=7)

    no_nccl = fst_pkg.UnsupportedError("no NCCL: cannot load libnccl.so.2 (not found)", -6)

    def fail():
        raise no_nccl

    made = []
    native = types.SimpleNamespace(comm_unique_id=fail, Comm=lambda *a: made.append(a))
    with pytest.raises(fst_pkg.UnsupportedError) as ei:
        play(0, native)
    assert ei.value is no_nccl
    assert len(sent) == 1, "rank 0 raised without telling the others"
    with pytest.raises(fst_pkg.UnsupportedError) as ei:
        play(1, native)
    assert str(ei.value) == ("rank 0 of the group could not make the NCCL id: no NCCL: cannot "
                             "load libnccl.so.2 (not found)") and ei.value.code == -6
    assert made == []
    # an id made goes to every rank, to its communicator
    native.comm_unique_id = lambda: b"id" * 64
    for rank in (0, 1):
        c = play(rank, native)
        assert (c.rank, c.world, c.device) == (rank, 2, 0)
    assert made == [(2, 0, b"id" * 64, 0, 7), (2, 1, b"id" * 64, 0, 7)]


def test_node_comm_size_must_divide(fst_pkg, fake_dist, monkeypatch):
    """A node size that does not divide a group's is a UsageError on every
    process, after they shared their sizes (none is left waiting), and no
    group is made; LOCAL_WORLD_SIZE is named where it was the source."""
    dist = fake_dist(6, 1)
    with pytest.raises(fst_pkg.UsageError, match=r"^node_comm: ranks_per_node=4 does not divide "
                                                 r"the group of 6 ranks: a node is that many "
                                                 r"consecutive ranks of the group"):
        fst_pkg.node_comm(4)
    assert dist.made == []
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    fake_dist(6, 1)
    with pytest.raises(fst_pkg.UsageError, match=r"^node_comm: LOCAL_WORLD_SIZE=4 does not "
                                                 r"divide the group of 6 ranks"):
        fst_pkg.node_comm()
    # another process's size fails this one too
    dist = fake_dist(4, 0, sizes=[2, 2, 3, 2])
    with pytest.raises(fst_pkg.UsageError, match=r"ranks_per_node=3 does not divide the group "
                                                 r"of 4 ranks"):
        fst_pkg.node_comm(2)
    assert dist.made == []
