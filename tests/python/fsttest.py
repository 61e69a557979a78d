"""Helpers shared by the oracle tests: run fst, read and write safetensors
files byte by byte, and compare what `fst inspect --json` says with what the
reference `safetensors` package (the oracle) says about the same file."""
import functools
import json
import os
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from safetensors import deserialize, safe_open

REPO = Path(__file__).resolve().parents[2]
# The emulator the suite runs under, as who starts it says (tests/wheel/run.sh:
# qemu-aarch64 for the aarch64 wheel), else "".
EMULATOR = os.environ.get("FST_TEST_EMULATOR", "")
FST_BIN = Path(os.environ.get("FST_BIN") or REPO / "build" / "fst")
FST_LIB = Path(os.environ.get("FST_LIB") or FST_BIN.parent / "libfst.so")

# dtypes numpy can hold, as the reference's numpy frontend maps them
NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "U16": np.uint16,
    "F16": np.float16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "I64": np.int64,
    "U64": np.uint64,
    "F64": np.float64,
    "C64": np.complex64,
}

# Bits per element of every dtype of the format (REFERENCE.md section 1).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


def fst_bin_ok():
    return FST_BIN.is_file() and os.access(FST_BIN, os.X_OK)


def fst(*args, env=None, timeout=60):
    """Run the fst command; returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ)
    full_env.pop("FST_FAULT", None)
    full_env.pop("FST_LOG", None)
    if env:
        full_env.update(env)
    return subprocess.run(
        [str(FST_BIN), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


@functools.cache
def uring_unavailable():
    """Why a load with io=uring fails here (exit 7, unsupported), as under
    qemu-user, which lacks io_uring's system calls, or on a kernel that
    forbids them; "" where it loads. Asked once, by loading a one-tensor file
    with `fst load --io uring`, as the C tests' lh_uring_probe does: the
    tests leave out their uring cases where it says why (io_cases, and
    conftest.py for the cases parametrized with io="uring"), and conftest.py
    prints it."""
    if not fst_bin_ok():
        return ""
    with tempfile.TemporaryDirectory() as d:
        path = write_safetensors(Path(d) / "probe.safetensors", [("x", "U8", [8], bytes(8))])
        r = fst("load", path, "--io", "uring", "--no-progress")
    if r.returncode == 7:
        return r.stderr.strip()
    assert r.returncode == 0, f"the io=uring probe load failed ({r.returncode}): {r.stderr}"
    return ""


def io_cases(*cases):
    """cases, less those that read with io_uring where it cannot load
    (uring_unavailable): a case is "uring" itself, or arguments that hold it
    (["--io", "uring", ...])."""
    if not uring_unavailable():
        return list(cases)
    return [c for c in cases if c != "uring" and not (isinstance(c, (list, tuple)) and "uring" in c)]


def inspect_json(*paths, env=None):
    """(returncode, parsed JSON list, stderr) of `fst inspect --json PATHS`."""
    r = fst("inspect", "--json", *paths, env=env)
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"fst inspect --json printed invalid JSON ({e}): {r.stdout[:500]!r}"
                             f"\nstderr: {r.stderr}")
    assert isinstance(doc, list)
    return r.returncode, doc, r.stderr


def inspect_ok(*paths):
    rc, doc, err = inspect_json(*paths)
    assert rc == 0, f"fst inspect exited {rc}: {err}"
    assert err == "", f"unexpected stderr: {err}"
    return doc


# ---------------------------------------------------------------- raw files

class Header:
    """The header of a safetensors file, parsed independently of both
    readers (Python's json; duplicate keys are kept as pairs)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.n = struct.unpack("<Q", f.read(8))[0]
            self.text = f.read(self.n).decode("utf-8")
        self.data_offset = 8 + self.n
        self.pairs = json.loads(self.text, object_pairs_hook=lambda p: p)
        self.dict = json.loads(self.text)
        self.metadata = self.dict.get("__metadata__")
        self.tensors = {k: v for k, v in self.dict.items() if k != "__metadata__"}


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def tensor_nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    bits = n * DTYPE_BITS[dtype]
    assert bits % 8 == 0
    return bits // 8


def write_raw(path, header, data=b"", pad=True, length=None):
    """Write 8-byte length + header + data. header is str (padded with spaces
    to a multiple of 8 unless pad is False) or bytes (written as is)."""
    if isinstance(header, str):
        hb = header.encode("utf-8")
        if pad:
            hb += b" " * ((-len(hb)) % 8)
    else:
        hb = header
    n = len(hb) if length is None else length
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + hb + data)
    return Path(path)


def write_safetensors(path, tensors, metadata=None, prefix="", pad_to=8, extra_fields=None):
    """A minimal safetensors writer that keeps the given tensor order, so
    that odd-sized tensors really do misalign the ones after them (the
    reference's save_file sorts by dtype size). tensors: list of (name, dtype,
    shape, data bytes). Returns the path."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    data = []
    for name, dtype, shape, raw in tensors:
        assert len(raw) == tensor_nbytes(dtype, shape), name
        info = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        if extra_fields:
            info.update(extra_fields)
        header[name] = info
        off += len(raw)
        data.append(raw)
    text = prefix + json.dumps(header, separators=(",", ":"), ensure_ascii=False)
    hb = text.encode("utf-8")
    hb += b" " * ((-(8 + len(hb))) % pad_to)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(data))
    return Path(path)


def random_array(rng, dtype, shape):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return np.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return np.asarray(rng.standard_normal(shape)).astype(dt)


# ---------------------------------------------------------------- the oracle

def reference_view(path):
    """What the reference reader says about a file: {name: (dtype, shape)},
    metadata, and the names in offset order."""
    with safe_open(str(path), framework="np") as f:
        keys = list(f.keys())
        view = {}
        for k in keys:
            s = f.get_slice(k)
            view[k] = (s.get_dtype(), list(s.get_shape()))
        return view, f.metadata(), list(f.offset_keys())


def reference_raw(path):
    """The reference's raw bytes of every tensor (any dtype, BF16 included):
    {name: (dtype, shape, bytes)} from safetensors.deserialize."""
    return {
        name: (info["dtype"], list(info["shape"]), bytes(info["data"]))
        for name, info in deserialize(file_bytes(path))
    }


def check_entry(entry, path=None, compare_bytes="numpy", blob=None):
    """Assert that one file entry of `fst inspect --json` agrees exactly with
    the reference about the file: names, dtypes, shapes, data_offsets (read
    both by parsing the header here and through safe_open), data offset,
    metadata. compare_bytes: "numpy" compares get_tensor bytes for the dtypes
    numpy has, "all" also every dtype through safetensors.deserialize, None
    skips the data. Returns {name: tensor entry}."""
    path = Path(path or entry["path"])
    assert entry["ok"] is True, entry
    assert Path(entry["path"]).resolve() == path.resolve()
    hdr = Header(path)
    assert entry["data_offset"] == hdr.data_offset

    tensors = entry["tensors"]
    by_name = {t["name"]: t for t in tensors}
    assert len(by_name) == len(tensors), "a tensor is listed twice"
    for t in tensors:
        assert set(t) == {"name", "dtype", "shape", "data_offsets"}, t

    # 1. the header as parsed here
    assert set(by_name) == set(hdr.tensors)
    for name, want in hdr.tensors.items():
        got = by_name[name]
        assert got["dtype"] == want["dtype"], name
        assert got["shape"] == want["shape"], name
        assert got["data_offsets"] == want["data_offsets"], name
    offsets = [tuple(t["data_offsets"]) for t in tensors]
    assert offsets == sorted(offsets), "tensors are not in data-offset order"

    # 2. the reference reader
    view, meta, offset_keys = reference_view(path)
    assert set(view) == set(by_name)
    for name, (dtype, shape) in view.items():
        assert by_name[name]["dtype"] == dtype, name
        assert by_name[name]["shape"] == shape, name
    # Same order as the reference's offset order wherever offsets differ
    # (empty tensors sharing one offset may tie in any order).
    ref_order = [tuple(by_name[k]["data_offsets"]) for k in offset_keys]
    assert ref_order == offsets

    # 3. metadata: fst prints null when there is none (absent, null or {})
    if entry["metadata"] is None:
        assert not meta, meta
    else:
        assert entry["metadata"] == meta
        assert list(entry["metadata"]) == list(hdr.metadata), "metadata order"

    # 4. bytes
    if compare_bytes:
        data = blob if blob is not None else file_bytes(path)
        base = hdr.data_offset
        with safe_open(str(path), framework="np") as f:
            for name, t in by_name.items():
                if t["dtype"] not in NUMPY_DTYPES:
                    continue
                b, e = t["data_offsets"]
                arr = f.get_tensor(name)
                assert arr.dtype == np.dtype(NUMPY_DTYPES[t["dtype"]]), name
                assert list(arr.shape) == t["shape"], name
                assert arr.tobytes() == data[base + b:base + e], name
        if compare_bytes == "all":
            raw = reference_raw(path)
            assert set(raw) == set(by_name)
            for name, (dtype, shape, payload) in raw.items():
                b, e = by_name[name]["data_offsets"]
                assert dtype == by_name[name]["dtype"] and shape == by_name[name]["shape"]
                assert payload == data[base + b:base + e], name
    return by_name


def reference_rejects(path):
    """The reference's error message for a file it rejects, both through
    safe_open and deserialize; fails the test if it accepts the file."""
    msgs = []
    try:
        with safe_open(str(path), framework="np") as f:
            for k in f.keys():
                f.get_slice(k)
    except Exception as e:  # SafetensorError
        msgs.append(str(e))
    else:
        raise AssertionError(f"the reference safe_open accepted {path}")
    try:
        deserialize(file_bytes(path))
    except Exception as e:
        msgs.append(str(e))
    else:
        raise AssertionError(f"the reference deserialize accepted {path}")
    return msgs
