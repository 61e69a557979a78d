"""Errors of the fst Python package: broken files raise FormatError (a
ValueError) whose message names the file and the rule, unreadable ones
FileError (an OSError), bad arguments UsageError (a ValueError); all are
fst.SafetensorError with the FST_E* code. Every entry point is tried: the
checks happen when a checkpoint is opened, before any tensor is read."""
import json
import os

import numpy as np
import pytest

from fsttest import write_raw, write_safetensors

F32x4 = ("a", "F32", (4,), bytes(16))
U8x3 = ("b", "U8", (3,), b"\x01\x02\x03")


def hdr(**tensors):
    return json.dumps({k: v for k, v in tensors.items()})


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_safetensors(tmp_path_factory.mktemp("good") / "good.safetensors", [F32x4, U8x3])


def make_bad(tmp_path, good):
    data = good.read_bytes()
    cases = {}

    def raw(name, blob):
        p = tmp_path / name
        p.write_bytes(blob)
        return p

    cases["truncated"] = (raw("truncated.safetensors", data[:-2]), r"truncated")
    cases["truncated_header"] = (raw("short_header.safetensors", data[:20]),
                                 r"header length \d+ runs past the end")
    cases["tiny"] = (raw("tiny.safetensors", data[:5]), r"header too small")
    cases["empty_file"] = (raw("empty.safetensors", b""), r"header too small")
    cases["overlap"] = (write_raw(tmp_path / "overlap.safetensors",
                                  hdr(a=t("F32", [2], 0, 8), b=t("F32", [2], 4, 12)), bytes(12)),
                        r'tensor "b".*overlap tensor "a"')
    cases["bad_json"] = (write_raw(tmp_path / "badjson.safetensors",
                                   '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]',
                                   bytes(8)), r"not valid JSON")
    cases["bad_dtype"] = (write_raw(tmp_path / "dtype.safetensors",
                                    hdr(a=t("F33", [2], 0, 8)), bytes(8)), r'unknown dtype "F33"')
    cases["bad_shape"] = (write_raw(tmp_path / "shape.safetensors",
                                    hdr(a=t("F32", [3], 0, 8)), bytes(8)),
                          r"data_offsets \[0, 8\] but shape \[3\] of F32 needs 12 bytes")
    cases["gap"] = (write_raw(tmp_path / "gap.safetensors", hdr(a=t("F32", [2], 8, 16)),
                              bytes(16)), r"gap")
    cases["trailing"] = (write_raw(tmp_path / "trail.safetensors", hdr(a=t("F32", [2], 0, 8)),
                                   bytes(9)), r"trailing bytes")
    cases["huge_header"] = (write_raw(tmp_path / "huge.safetensors", "{}", length=10 ** 12),
                            r"header too large")
    return cases


CASES = ["truncated", "truncated_header", "tiny", "empty_file", "overlap", "bad_json",
         "bad_dtype", "bad_shape", "gap", "trailing", "huge_header"]


def entry_points(fst):
    return {
        "load_file": lambda p: fst.load_file(p, framework="numpy"),
        "load": lambda p: fst.load(p, framework="numpy", names=["a"]),
        "safe_open": lambda p: fst.safe_open(p, framework="numpy"),
        "iter_tensors": lambda p: list(fst.iter_tensors(p, framework="numpy")),
        "Checkpoint": lambda p: fst.Checkpoint(p),
        "fastsafe_open": lambda p: fst.fastsafe_open(p, framework="numpy", nogds=True),
        "low_level": lambda p: fst._fst.Checkpoint(str(p)),
    }


@pytest.mark.parametrize("case", CASES)
def test_format_errors(fst_pkg, tmp_path, good, case):
    path, rule = make_bad(tmp_path, good)[case]
    for entry, call in entry_points(fst_pkg).items():
        with pytest.raises(fst_pkg.FormatError) as ei:
            call(path)
        e = ei.value
        assert isinstance(e, fst_pkg.SafetensorError) and isinstance(e, ValueError), entry
        assert e.code == -2, entry
        msg = str(e)
        assert msg.startswith(str(path) + ":"), (entry, msg)  # names the file
        assert __import__("re").search(rule, msg), (entry, rule, msg)  # and the rule


def test_missing_file(fst_pkg, tmp_path):
    missing = tmp_path / "nope.safetensors"
    for entry, call in entry_points(fst_pkg).items():
        with pytest.raises(fst_pkg.FileError) as ei:
            call(missing)
        assert isinstance(ei.value, OSError) and ei.value.code == -3, entry
        assert str(missing) in str(ei.value) and "No such file" in str(ei.value), entry


def test_directory_problems(fst_pkg, tmp_path, good):
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(fst_pkg.FormatError, match="no \\*.safetensors files"):
        fst_pkg.load(empty, framework="numpy")
    # the same tensor name in two files of a directory
    twice = tmp_path / "twice"
    twice.mkdir()
    for n in ("x", "y"):
        write_safetensors(twice / f"{n}.safetensors", [F32x4])
    with pytest.raises(fst_pkg.FormatError, match='tensor "a" is in two files'):
        fst_pkg.load(twice, framework="numpy")
    # an index naming a shard that is not there
    idx = tmp_path / "idx"
    idx.mkdir()
    write_safetensors(idx / "model-1.safetensors", [F32x4])
    (idx / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
    with pytest.raises(fst_pkg.SafetensorError) as ei:
        fst_pkg.load(idx, framework="numpy")
    assert "model-2.safetensors" in str(ei.value)


@pytest.mark.parametrize("kw,pattern", [
    (dict(io="fast"), r"io='fast': expected one of"),
    (dict(io="MMAP"), r"io='MMAP'"),
    (dict(gds="maybe"), r"gds='maybe': expected one of"),
    (dict(gds=True), r"gds=True"),
    (dict(framework="tf"), r"framework 'tf': expected 'pt' or 'numpy'"),
    (dict(framework="jax"), r"framework 'jax'"),
    (dict(device="gpu"), r'device "gpu": expected cpu, cuda or cuda:N'),
    (dict(device="cuda:x"), r"device .cuda:x."),
    (dict(device="cpu:1"), r'device "cpu:1"'),
    (dict(device=""), r'device ""'),
    (dict(device="cuda:0"), r"numpy arrays live on the CPU"),
    (dict(device=0), r"numpy arrays live on the CPU"),
    (dict(device="cuda"), r"numpy arrays live on the CPU"),
    (dict(threads=1000), r"threads"),
    (dict(align=3), r"align 3 is not a power of two"),
])
def test_usage_errors(fst_pkg, good, kw, pattern):
    kw = {"framework": "numpy", **kw}
    rest = {k: v for k, v in kw.items() if k != "device"}
    calls = [
        lambda: fst_pkg.load(good, **kw),
        lambda: fst_pkg.load_file(good, kw.get("device", "cpu"), **rest),
        lambda: list(fst_pkg.iter_tensors(good, **kw)),
    ]
    for call in calls:
        with pytest.raises(fst_pkg.UsageError, match=pattern) as ei:
            call()
        assert isinstance(ei.value, ValueError) and ei.value.code == -1


def test_usage_errors_come_before_the_file(fst_pkg, tmp_path):
    """A bad argument is reported as such even when the file is missing."""
    with pytest.raises(fst_pkg.UsageError):
        fst_pkg.load(tmp_path / "missing.safetensors", framework="numpy", io="nope")
    with pytest.raises(fst_pkg.UsageError):
        fst_pkg.load(tmp_path / "missing.safetensors", framework="numpy", device="cuda:0")


def test_safe_open_usage_errors(fst_pkg, good):
    with pytest.raises(fst_pkg.UsageError, match="framework"):
        fst_pkg.safe_open(good, framework="flax")
    with pytest.raises(fst_pkg.UsageError, match="numpy arrays live on the CPU"):
        fst_pkg.safe_open(good, framework="numpy", device="cuda:0")
    # option values are checked when the object is made, as the reference
    # checks backend=, not at the first load
    with pytest.raises(fst_pkg.UsageError, match="io='bogus'"):
        fst_pkg.safe_open(good, framework="numpy", io="bogus")
    with pytest.raises(fst_pkg.UsageError, match='backend "bogus" is invalid'):
        fst_pkg.safe_open(good, framework="numpy", backend="bogus")


def test_low_level_argument_errors(fst_pkg, good, run_python):
    """The extension refuses wrong types cleanly. The calls that once
    crashed the interpreter (a load whose arguments fail to parse freed
    uninitialised memory) run in a child process first."""
    r = run_python(f"""
        import fst
        ck = fst._fst.Checkpoint({str(good)!r})
        for call in (lambda: fst._fst.load({str(good)!r}), lambda: fst._fst.start("x"),
                     lambda: fst._fst.load(ck, io="x"), lambda: fst._fst.load(ck, allocator=3),
                     lambda: fst._fst.load(ck, names=5)):
            try:
                call()
            except TypeError as e:
                print("TypeError", e)
    """)
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-2000:]}"
    assert r.stdout.count("TypeError") == 5, r.stdout
    _fst = fst_pkg._fst
    ck = _fst.Checkpoint(str(good))
    with pytest.raises(TypeError):
        _fst.load(str(good))  # not a Checkpoint
    with pytest.raises(TypeError):
        _fst.start("x")
    with pytest.raises(TypeError, match="allocator must be"):
        _fst.load(ck, allocator=3)
    with pytest.raises(TypeError, match="allocator must be"):
        _fst.load(ck, allocator=(len,))
    with pytest.raises(TypeError):
        _fst.load(ck, names=5)
    with pytest.raises(TypeError):
        _fst.Checkpoint(42)
    with pytest.raises(KeyError):
        _fst.load(ck).tensor("zz")
    with pytest.raises(IndexError):
        ck.metadata(7)
    loader = _fst.start(ck)
    while loader.next() is not None:
        pass
    loader.finish()
    with pytest.raises(RuntimeError, match="already finished"):
        loader.next()
    with pytest.raises(RuntimeError, match="already finished"):
        loader.finish()


def test_error_hierarchy(fst_pkg):
    E = fst_pkg
    assert issubclass(E.UsageError, (E.SafetensorError, ValueError))
    assert issubclass(E.FormatError, ValueError) and issubclass(E.FileError, OSError)
    assert issubclass(E.OutOfMemoryError, MemoryError)
    assert issubclass(E.DeviceError, RuntimeError) and issubclass(E.UnsupportedError, RuntimeError)
    assert issubclass(E.FileChangedError, OSError)
    for cls in (E.UsageError, E.FormatError, E.FileError, E.OutOfMemoryError, E.DeviceError,
                E.UnsupportedError, E.CancelledError, E.FileChangedError):
        assert issubclass(cls, E.SafetensorError)


def test_read_error_mid_load(fst_pkg, good, run_python):
    """An I/O error while reading (FST_FAULT, read once per process) is a
    FileError naming the file; nothing leaks or crashes, and the next load
    of the process works."""
    r = run_python(f"""
        import fst, numpy as np
        try:
            fst.load_file({str(good)!r}, framework="numpy", io="pread")
        except fst.FileError as e:
            print("FileError", e.code, e)
        else:
            print("loaded")
        print(sorted(fst.load_file({str(good)!r}, framework="numpy", io="pread")))
    """, env={"FST_FAULT": "read:1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("FileError -3 ") and str(good) in lines[0], r.stdout
    assert lines[1] == "['a', 'b']"


def test_permission_denied(fst_pkg, tmp_path, good):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    p = tmp_path / "locked.safetensors"
    p.write_bytes(good.read_bytes())
    p.chmod(0)
    with pytest.raises(fst_pkg.FileError, match="Permission denied"):
        fst_pkg.load_file(p, framework="numpy")


def test_save_errors(fst_pkg, tmp_path):
    with pytest.raises(fst_pkg.SafetensorError):
        fst_pkg.save_file({"a": np.zeros(2, np.float32)}, tmp_path / "no" / "dir" / "x.safetensors")
    assert not list(tmp_path.iterdir()), "a failed save left files behind"
