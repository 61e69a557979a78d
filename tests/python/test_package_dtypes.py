"""The dtypes numpy has no native type for, through fst's numpy frontend
(docs/python.md, "dtypes"):

- BF16, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ: ml_dtypes arrays of the
  file's shape (bfloat16, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz,
  float8_e5m2fnuz);
- F8_E8M0: uint8 of the file's shape (its bytes);
- F4 (two per byte) and F6_E2M3 / F6_E3M2 (four per three bytes): uint8,
  the last dimension in bytes when it holds whole bytes (F4: halved, F6:
  times 3/4), else flat: one dimension of nbytes.

Files are written with raw headers (fsttest.write_safetensors) since no
writer makes these dtypes from numpy. The reference's numpy frontend refuses
all of them; its deserialize gives their bytes, the oracle here."""
import numpy as np
import pytest

from fsttest import reference_raw, tensor_nbytes, write_safetensors

ml_dtypes = pytest.importorskip("ml_dtypes")

ML = {
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}

# (name, dtype, shape in the file, numpy dtype, numpy shape)
CASES = [
    ("bf16.m", "BF16", (3, 5), "bfloat16", (3, 5)),
    ("bf16.s", "BF16", (), "bfloat16", ()),
    ("bf16.e", "BF16", (0, 5), "bfloat16", (0, 5)),
    ("e4m3.m", "F8_E4M3", (2, 3), "float8_e4m3fn", (2, 3)),
    ("e5m2.v", "F8_E5M2", (7,), "float8_e5m2", (7,)),
    ("e4m3fnuz.m", "F8_E4M3FNUZ", (2, 2, 2), "float8_e4m3fnuz", (2, 2, 2)),
    ("e5m2fnuz.s", "F8_E5M2FNUZ", (), "float8_e5m2fnuz", ()),
    ("e8m0.m", "F8_E8M0", (4, 2), "uint8", (4, 2)),
    ("e8m0.s", "F8_E8M0", (), "uint8", ()),
    ("f4.m", "F4", (3, 4), "uint8", (3, 2)),         # last dim halved
    ("f4.v", "F4", (6,), "uint8", (3,)),
    ("f4.odd", "F4", (2, 3), "uint8", (3,)),         # 3 nibbles a row: flat
    ("f4.one", "F4", (2, 1), "uint8", (1,)),
    ("f4.e", "F4", (0, 8), "uint8", (0, 4)),
    ("f6a.m", "F6_E2M3", (2, 4), "uint8", (2, 3)),   # last dim x 3/4
    ("f6b.m", "F6_E3M2", (4, 2), "uint8", (6,)),     # 12 bits a row: flat
    ("f6a.v", "F6_E2M3", (8,), "uint8", (6,)),
    ("f6b.big", "F6_E3M2", (3, 32), "uint8", (3, 24)),
]


@pytest.fixture(scope="module")
def exotic(tmp_path_factory):
    rng = np.random.default_rng(17)
    parts = []
    for name, dtype, shape, _, _ in CASES:
        n = tensor_nbytes(dtype, shape)
        parts.append((name, dtype, shape, rng.integers(0, 256, n, dtype=np.uint8).tobytes()))
    # an odd-sized U8 first: everything after it is misaligned in the file
    parts.insert(0, ("pad", "U8", (3,), b"\x01\x02\x03"))
    p = tmp_path_factory.mktemp("dtypes") / "exotic.safetensors"
    write_safetensors(p, parts, metadata={"format": "pt"})
    return p


def check(arrays, path, names=None):
    raw = reference_raw(path)
    for name, dtype, shape, np_name, np_shape in CASES:
        if names is not None and name not in names:
            continue
        a = arrays[name]
        want_dtype = np.uint8 if np_name == "uint8" else getattr(ml_dtypes, np_name)
        assert a.dtype == np.dtype(want_dtype), (name, a.dtype)
        assert a.shape == np_shape, (name, a.shape, np_shape)
        assert raw[name][0] == dtype and tuple(raw[name][1]) == shape
        assert a.tobytes() == raw[name][2], name


@pytest.mark.parametrize("io", ["auto", "pread", "mmap"])
def test_load_file(fst_pkg, exotic, io):
    check(fst_pkg.load_file(exotic, framework="numpy", io=io), exotic)


def test_safe_open_and_info(fst_pkg, exotic):
    with fst_pkg.safe_open(exotic, framework="numpy") as f:
        arrays = {n: f.get_tensor(n) for n in f.keys()}
        for name, dtype, shape, _, _ in CASES:
            s = f.get_slice(name)
            assert s.get_dtype() == dtype and s.get_shape() == list(shape)
    check(arrays, exotic)
    ck = fst_pkg.Checkpoint(exotic)
    for name, dtype, shape, _, _ in CASES:
        assert ck.info(name) == (dtype, shape, tensor_nbytes(dtype, shape))


def test_iter_tensors(fst_pkg, exotic):
    arrays = dict(fst_pkg.iter_tensors(exotic, framework="numpy"))
    check(arrays, exotic)


def test_values_of_float8_and_bf16(fst_pkg, tmp_path):
    """Known values survive: the ml_dtypes arrays hold the numbers, not
    only the bytes."""
    vals = np.array([0.0, 1.0, -2.0, 0.5, 448.0, -0.125], np.float32)
    parts = []
    for st, name in ML.items():
        v = vals if "E4M3" in st or st == "BF16" else vals[:4]
        a = v.astype(getattr(ml_dtypes, name))
        parts.append((st, st, a.shape, a.tobytes()))
    p = write_safetensors(tmp_path / "vals.safetensors", parts)
    got = fst_pkg.load_file(p, framework="numpy")
    for st, _, shape, raw in parts:
        want = np.frombuffer(raw, getattr(ml_dtypes, ML[st])).astype(np.float32)
        np.testing.assert_array_equal(got[st].astype(np.float32), want, err_msg=st)


def test_low_level_export_shapes(fst_pkg, exotic):
    """What the numpy frontend builds on: every Tensor exports its bytes as
    uint8 (F8/F6/F4) or its natural DLPack type, and reinterpret() gives
    the same bytes as another element width."""
    _fst = fst_pkg._fst
    buf = _fst.load(_fst.Checkpoint(str(exotic)))
    assert sorted(buf.names()) == sorted(["pad"] + [c[0] for c in CASES])
    raw = reference_raw(exotic)
    for name, dtype, shape, np_name, np_shape in CASES:
        t = buf.tensor(name)
        assert (t.name, t.dtype, t.shape, t.nbytes) == (name, dtype, shape, len(raw[name][2]))
        assert t.tobytes() == raw[name][2]
        if dtype == "BF16":
            # exported as DLPack bfloat16, which numpy does not take: the
            # frontend reinterprets it as uint16 and views it as bfloat16
            a = np.from_dlpack(t.reinterpret(1, 16))
            assert a.dtype == np.uint16 and a.shape == shape
        else:
            a = np.from_dlpack(t)
            assert a.dtype == np.uint8 and a.shape == np_shape, name
        assert a.tobytes() == raw[name][2]
    u16 = np.from_dlpack(buf.tensor("f6b.big").reinterpret(1, 16))
    assert u16.dtype == np.uint16 and u16.shape == (3, 12)
    with pytest.raises(ValueError, match="whole number"):
        buf.tensor("pad").reinterpret(1, 16)  # 3 bytes are no uint16s
    with pytest.raises(ValueError):
        buf.tensor("pad").reinterpret(1, 12)
