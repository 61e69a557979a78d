"""The fst Python package with numpy, against the reference `safetensors`
package: fst.load_file / fst.load / fst.safe_open / fst.save_file /
fst.Checkpoint on every numpy dtype, scalars, empty tensors, metadata,
misaligned files, sharded checkpoints (`fst gen`) and the dtypes numpy has no
native type for (BF16 and F8 through ml_dtypes; F4, F6 and F8_E8M0 as bytes).

Every comparison is bytewise (array.tobytes() against the file's bytes or
the reference's array), so NaNs and signed zeros compare exactly."""
import json
import sys

import numpy as np
import pytest
import safetensors.numpy as st_np
from safetensors import safe_open as ref_safe_open

import fsttest
from fsttest import (
    NUMPY_DTYPES,
    Header,
    file_bytes,
    random_array,
    reference_raw,
    tensor_nbytes,
    write_safetensors,
)

ml_dtypes = pytest.importorskip("ml_dtypes")

IOS = ["auto", "pread", "uring", "mmap"]
# numpy dtype of every safetensors dtype numpy (or ml_dtypes) has a type for
ML_DTYPES = {
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
}


def file_tensors(path):
    """{name: (dtype, shape, bytes)} straight from the file (parsed here)."""
    h = Header(path)
    blob = file_bytes(path)
    out = {}
    for name, info in h.tensors.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), blob[h.data_offset + b:h.data_offset + e])
    return out


def assert_same_array(got, want, name=""):
    assert isinstance(got, np.ndarray), (name, type(got))
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), name


def assert_matches_file(arrays, path, names=None):
    """Every array is the file's tensor: numpy dtype, shape, bytes."""
    want = file_tensors(path)
    names = set(want) if names is None else set(names)
    assert set(arrays) == names
    for name in names:
        dtype, shape, raw = want[name]
        a = arrays[name]
        assert isinstance(a, np.ndarray), name
        np_dtype = NUMPY_DTYPES.get(dtype) or ML_DTYPES.get(dtype)
        assert a.dtype == np.dtype(np_dtype), (name, a.dtype, dtype)
        assert a.shape == shape, (name, a.shape, shape)
        assert a.tobytes() == raw, name


def every_dtype_tensors(seed=0):
    """One of each numpy dtype in several shapes, plus scalars and empty
    tensors, as numpy arrays."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, (st, dt) in enumerate(NUMPY_DTYPES.items()):
        out[f"{st.lower()}.matrix"] = random_array(rng, dt, (3 + i % 3, 5))
        out[f"{st.lower()}.vector"] = random_array(rng, dt, (7 + i,))
        out[f"{st.lower()}.scalar"] = random_array(rng, dt, ())
        out[f"{st.lower()}.empty"] = random_array(rng, dt, (0, 4))
    out["f32.cube"] = random_array(rng, np.float32, (2, 3, 4))
    out["f32.specials"] = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45], np.float32)
    out["i64.one"] = np.array([-(2 ** 63)], np.int64)
    return out


@pytest.fixture(scope="module")
def ref_file(tmp_path_factory):
    """Every numpy dtype, written by the reference writer, with metadata."""
    p = tmp_path_factory.mktemp("np") / "every_dtype.safetensors"
    st_np.save_file(every_dtype_tensors(), str(p), metadata={"format": "np", "k": "v é"})
    return p


@pytest.fixture(scope="module")
def misaligned_file(tmp_path_factory):
    """Odd-sized U8 tensors before wider ones, in the given order, so that
    F32 / F64 / I16 / C64 data starts at odd file offsets."""
    rng = np.random.default_rng(3)
    parts = []
    for i, (name, dt, shape) in enumerate([
        ("w.f32", np.float32, (5, 3)), ("w.f64", np.float64, (4,)), ("w.i16", np.int16, (9,)),
        ("w.c64", np.complex64, (2, 2)), ("w.u64", np.uint64, (3,)), ("w.f16", np.float16, (3, 3)),
    ]):
        pad = random_array(rng, np.uint8, (2 * i + 1,))
        parts.append((f"scale.{i}", "U8", pad.shape, pad.tobytes()))
        a = random_array(rng, dt, shape)
        st = {v: k for k, v in NUMPY_DTYPES.items()}[dt]
        parts.append((name, st, shape, a.tobytes()))
    p = tmp_path_factory.mktemp("mis") / "misaligned.safetensors"
    write_safetensors(p, parts, metadata={"format": "pt"}, pad_to=16)
    return p


# ------------------------------------------------------------ load_file / load

@pytest.mark.parametrize("io", IOS)
def test_load_file_every_dtype_matches_reference(fst_pkg, ref_file, io):
    got = fst_pkg.load_file(ref_file, framework="numpy", io=io)
    want = st_np.load_file(str(ref_file))
    assert set(got) == set(want)
    for name in want:
        assert_same_array(got[name], want[name], name)
    assert_matches_file(got, ref_file)
    assert got["f32.scalar"].shape == () and got["u8.empty"].shape == (0, 4)


@pytest.mark.parametrize("framework", ["numpy", "np", "NumPy"])
def test_framework_spellings(fst_pkg, ref_file, framework):
    got = fst_pkg.load_file(str(ref_file), framework=framework)
    assert_matches_file(got, ref_file)


def test_arrays_are_writable_like_the_reference(fst_pkg, ref_file):
    """Loaded arrays are writable, as safetensors.numpy.load_file's are;
    writing one changes that array only (io=mmap excepted: read-only
    mappings of the files give read-only arrays)."""
    got = fst_pkg.load_file(ref_file, framework="numpy")
    ref = st_np.load_file(str(ref_file))
    a = got["f32.matrix"]
    assert a.flags.writeable
    a += 1
    np.testing.assert_array_equal(a, ref["f32.matrix"] + 1)
    assert got["f32.vector"].tobytes() == ref["f32.vector"].tobytes()
    mm = fst_pkg.load_file(ref_file, framework="numpy", io="mmap")
    assert not mm["f32.matrix"].flags.writeable
    with pytest.raises(ValueError):
        mm["f32.matrix"][0, 0] = 1


def test_misaligned_file(fst_pkg, misaligned_file):
    h = Header(misaligned_file)
    offsets = {n: h.data_offset + i["data_offsets"][0] for n, i in h.tensors.items()}
    assert any(offsets[n] % 2 for n in offsets if not n.startswith("scale")), \
        "the file was meant to misalign wide tensors"
    want = st_np.load_file(str(misaligned_file))
    for io in fsttest.io_cases(*IOS):
        got = fst_pkg.load_file(misaligned_file, framework="numpy", io=io)
        for name in want:
            assert_same_array(got[name], want[name], f"{name} io={io}")
            np.testing.assert_array_equal(got[name], want[name])  # values, not only bytes
    # the default load aligns every tensor in memory whatever the file does
    got = fst_pkg.load_file(misaligned_file, framework="numpy")
    assert all(a.ctypes.data % 256 == 0 for a in got.values() if a.size)


def test_load_names_subset(fst_pkg, ref_file):
    names = ["f32.matrix", "bool.scalar", "c64.empty", "u64.vector"]
    got = fst_pkg.load(ref_file, framework="numpy", names=names)
    assert_matches_file(got, ref_file, names)
    # any iterable, duplicates fine
    got = fst_pkg.load(ref_file, framework="numpy", names=(n for n in names + names[:1]))
    assert set(got) == set(names)
    assert fst_pkg.load(ref_file, framework="numpy", names=[]) == {}
    # through a Checkpoint opened once
    ck = fst_pkg.Checkpoint(ref_file)
    got = fst_pkg.load(ck, framework="numpy", names=names[:2])
    assert_matches_file(got, ref_file, names[:2])
    # a name the checkpoint lacks is an error naming it, before anything is read
    with pytest.raises(fst_pkg.UsageError, match="no tensor named 'f32.matrx'"):
        fst_pkg.load(ref_file, framework="numpy", names=["f32.matrix", "f32.matrx"])


@pytest.mark.parametrize("kw", [dict(threads=1), dict(threads=3, chunk_bytes=4096),
                                dict(staging_bytes=1 << 20), dict(align=4096), dict(align=8)])
def test_load_options(fst_pkg, ref_file, kw):
    got = fst_pkg.load(ref_file, framework="numpy", **kw)
    assert_matches_file(got, ref_file)
    if "align" in kw:
        assert all(a.ctypes.data % kw["align"] == 0 for a in got.values())


def test_reference_writes_fst_reads(fst_pkg, tmp_path):
    """Files from the reference writer, one tensor each and all together,
    including a file with no tensors at all."""
    tensors = every_dtype_tensors(seed=5)
    for name, a in list(tensors.items())[:12]:
        p = tmp_path / f"{name}.safetensors"
        st_np.save_file({name: a}, str(p))
        got = fst_pkg.load_file(p, framework="numpy")
        assert_same_array(got[name], a, name)
    p = tmp_path / "none.safetensors"
    st_np.save_file({}, str(p), metadata={"only": "metadata"})
    assert fst_pkg.load_file(p, framework="numpy") == {}
    with fst_pkg.safe_open(p, framework="numpy") as f:
        assert f.keys() == [] and f.metadata() == {"only": "metadata"}


# ------------------------------------------------------------------ safe_open

SLICES = [np.s_[0:1], np.s_[:, 1:3], np.s_[..., 0:2], np.s_[1], np.s_[1, :, 2], np.s_[::2],
          np.s_[:], np.s_[...], np.s_[()]]


def test_safe_open_matches_reference(fst_pkg, ref_file):
    with ref_safe_open(str(ref_file), framework="numpy") as ref, \
            fst_pkg.safe_open(ref_file, framework="numpy") as f:
        assert f.keys() == ref.keys() == sorted(ref.keys())
        assert f.offset_keys() == ref.offset_keys()
        assert f.metadata() == ref.metadata()
        for name in ref.keys():
            assert_same_array(f.get_tensor(name), ref.get_tensor(name), name)
            s, rs = f.get_slice(name), ref.get_slice(name)
            assert s.get_shape() == rs.get_shape() and isinstance(s.get_shape(), list)
            assert s.get_dtype() == rs.get_dtype()
            for idx in SLICES:
                try:
                    want = rs[idx]
                except Exception:  # an index the reference refuses for this shape
                    continue
                assert_same_array(np.asarray(s[idx]), np.asarray(want), f"{name}{idx}")


def test_safe_open_slices_of_a_cube(fst_pkg, ref_file):
    with ref_safe_open(str(ref_file), framework="numpy") as ref, \
            fst_pkg.safe_open(ref_file, framework="numpy") as f:
        cube = f.get_slice("f32.cube")
        assert cube.get_shape() == [2, 3, 4]
        for idx in SLICES:
            assert_same_array(np.asarray(cube[idx]), np.asarray(ref.get_slice("f32.cube")[idx]))
        # negative bounds and bounds past the end: refused, as the reference
        # refuses them (numpy would count from the end, and clip)
        import safetensors
        for idx, ref_exc, exc in ((np.s_[-1:], OverflowError, OverflowError),
                                  (np.s_[:, :9], safetensors.SafetensorError,
                                   fst_pkg.SafetensorError)):
            with pytest.raises(ref_exc) as want:
                ref.get_slice("f32.cube")[idx]
            with pytest.raises(exc) as got:
                cube[idx]
            assert str(got.value) == str(want.value)


def test_safe_open_unknown_name_and_metadata_none(fst_pkg, ref_file, tmp_path):
    with fst_pkg.safe_open(ref_file, framework="np") as f:
        with pytest.raises(KeyError):
            f.get_tensor("missing")
        with pytest.raises(KeyError):
            f.get_slice("missing")
    p = tmp_path / "nometa.safetensors"
    st_np.save_file({"a": np.ones(3, np.float32)}, str(p))
    with ref_safe_open(str(p), framework="np") as ref, fst_pkg.safe_open(p, "np") as f:
        assert f.metadata() is None and ref.metadata() is None


def test_safe_open_arrays_outlive_the_context(fst_pkg, ref_file):
    with fst_pkg.safe_open(ref_file, framework="numpy") as f:
        a = f.get_tensor("f64.matrix")
    import gc
    del f
    gc.collect()
    assert a.tobytes() == file_tensors(ref_file)["f64.matrix"][2]


# ------------------------------------------------------------------ save_file

def test_save_file_reference_reads(fst_pkg, tmp_path):
    tensors = every_dtype_tensors(seed=9)
    meta = {"format": "np", "note": "ünïcode ✓", "empty": ""}
    p = tmp_path / "fst.safetensors"
    fst_pkg.save_file(tensors, p, metadata=meta)
    with ref_safe_open(str(p), framework="numpy") as ref:
        assert ref.metadata() == meta
        assert set(ref.keys()) == set(tensors)
        for name, a in tensors.items():
            assert_same_array(ref.get_tensor(name), a, name)
    # the layout the reference writer uses: wider dtypes first, then names
    h = Header(p)
    order = sorted(h.tensors, key=lambda n: h.tensors[n]["data_offsets"])
    widths = [tensor_nbytes(h.tensors[n]["dtype"], [1]) for n in order]
    assert widths == sorted(widths, reverse=True)
    # fst reads its own file back
    got = fst_pkg.load_file(p, framework="numpy")
    for name, a in tensors.items():
        assert_same_array(got[name], a, name)


def test_save_file_keeps_scalars_and_byte_order(fst_pkg, tmp_path):
    """Shapes () stay (): not (1,); big-endian and non-contiguous arrays are
    written as their values in little-endian order, as the reference does."""
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    tensors = {
        "scalar": np.array(3.5, np.float32),
        "np_scalar": np.float32(-2.0),
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
        "big_endian_c64": (np.arange(3) + 1j).astype(">c8"),
        "transposed": base.T,
        "strided": base[::2, ::3],
        "fortran": np.asfortranarray(base),
    }
    p, r = tmp_path / "fst.safetensors", tmp_path / "ref.safetensors"
    fst_pkg.save_file(tensors, p)
    st_np.save_file({k: np.ascontiguousarray(v) if k != "np_scalar" else np.asarray(v)
                     for k, v in tensors.items()}, str(r))
    ref = st_np.load_file(str(r))
    got_ref = st_np.load_file(str(p))
    for name, a in tensors.items():
        np.testing.assert_array_equal(got_ref[name], a, err_msg=name)
        assert got_ref[name].shape == np.shape(a), name
        assert got_ref[name].tobytes() == ref[name].tobytes(), name
    assert Header(p).tensors["scalar"]["shape"] == []


def test_save_file_ml_dtypes(fst_pkg, tmp_path):
    rng = np.random.default_rng(4)
    tensors = {k: rng.standard_normal((3, 4)).astype(v) for k, v in ML_DTYPES.items()}
    tensors["F8_E8M0"] = np.array([1.0, 2.0, 0.5, 4.0], ml_dtypes.float8_e8m0fnu)
    p = tmp_path / "ml.safetensors"
    fst_pkg.save_file(tensors, p)
    raw = reference_raw(p)  # the reference's deserialize: every dtype
    for st, a in tensors.items():
        dtype, shape, payload = raw[st]
        assert dtype == st and shape == list(a.shape)
        assert payload == a.tobytes(), st
    got = fst_pkg.load_file(p, framework="numpy")
    for st in ML_DTYPES:
        assert_same_array(got[st], tensors[st], st)
    # F8_E8M0 comes back as its bytes (uint8), see test_package_dtypes
    assert got["F8_E8M0"].dtype == np.uint8
    assert got["F8_E8M0"].tobytes() == tensors["F8_E8M0"].tobytes()


def test_save_file_refusals(fst_pkg, tmp_path):
    p = tmp_path / "x.safetensors"
    for bad in (np.array(["a"], dtype=object), np.array([1], dtype=np.float128)
                if hasattr(np, "float128") else np.array(["s"]), np.array([1 + 1j])):
        with pytest.raises(fst_pkg.UsageError, match="cannot be saved"):
            fst_pkg.save_file({"t": bad}, p)
    with pytest.raises(TypeError):
        fst_pkg.save_file({"t": np.zeros(2, np.float32)}, p, metadata={"k": 1})
    assert not p.exists(), "a refused save left a file behind"


# ------------------------------------------------------------ sharded (fst gen)

@pytest.mark.parametrize("misaligned", [False, True])
def test_sharded_checkpoint(fst_pkg, gen_dir, misaligned):
    d = gen_dir(shards=3, seed=21, size="2MiB", misaligned=misaligned)
    shards = sorted(d.glob("*.safetensors"))
    want = {}
    for s in shards:
        for name, t in file_tensors(s).items():
            want[name] = (s, t)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(want)
    for target in (d, d / "model.safetensors.index.json"):
        got = fst_pkg.load(target, framework="numpy")
        assert set(got) == set(want)
        for name, (s, (dtype, shape, raw)) in want.items():
            a = got[name]
            assert a.shape == shape and a.tobytes() == raw, name
            assert a.dtype == np.dtype(NUMPY_DTYPES.get(dtype) or ML_DTYPES[dtype]), name
    assert {t[0] for _, t in want.values()} >= {"BF16", "F32"}
    # BF16 equals the reference's bytes (safetensors.deserialize); F32 and U8
    # equal the reference's arrays
    for s in shards:
        raw = reference_raw(s)
        mine = fst_pkg.load_file(s, framework="numpy")
        with ref_safe_open(str(s), framework="numpy") as ref:
            for name, (dtype, shape, payload) in raw.items():
                assert mine[name].tobytes() == payload, name
                if dtype in NUMPY_DTYPES:
                    assert_same_array(mine[name], ref.get_tensor(name), name)
                else:
                    assert dtype == "BF16" and mine[name].dtype == ml_dtypes.bfloat16
    # Checkpoint: the table, the files, the metadata of each
    ck = fst_pkg.Checkpoint(d)
    assert sorted(ck.keys()) == sorted(want)
    assert [p.split("/")[-1] for p in ck.files()] == [s.name for s in shards]
    for i in range(len(shards)):
        assert ck.metadata(i) == {"format": "pt"}
    name = next(iter(want))
    dtype, shape, nbytes = ck.info(name)
    assert (dtype, shape, nbytes) == (want[name][1][0], want[name][1][1], len(want[name][1][2]))
    with pytest.raises(KeyError):
        ck.info("no.such.tensor")
    # safe_open over a directory is fst's extension of the reference API
    with fst_pkg.safe_open(d, framework="numpy") as f:
        assert f.keys() == sorted(want)
        assert f.get_tensor(name).tobytes() == want[name][1][2]


def test_sharded_subset_spans_shards(fst_pkg, gen_dir):
    d = gen_dir(shards=3, seed=21, size="2MiB", misaligned=True)
    per_shard = [list(file_tensors(s)) for s in sorted(d.glob("*.safetensors"))]
    names = [ns[len(ns) // 2] for ns in per_shard] + [per_shard[-1][-1]]
    got = fst_pkg.load(d, framework="numpy", names=names)
    assert set(got) == set(names)
    blobs = {}
    for s in sorted(d.glob("*.safetensors")):
        blobs.update(file_tensors(s))
    for n in names:
        assert got[n].tobytes() == blobs[n][2]


def test_version(fst_pkg):
    r = __import__("fsttest").fst("--version")
    assert r.stdout.strip() == f"fst {fst_pkg.__version__} (fst-loader)"
    assert sys.modules["fst"].__version__.count(".") == 2
