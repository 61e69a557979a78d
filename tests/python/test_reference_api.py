"""fst.compat.safetensors against the real safetensors package as the
oracle: bytes written by either load byte-exact in the other, the same
refusals (shared and strided torch tensors, unknown dtypes, raw dicts), the
same errors for missing files, bad backends and bad slices, backend= over
fst's read paths, get_tensors, F4 and F8_E8M0. The numpy half runs
wherever numpy and safetensors are; the torch half skips without torch.
What the reference's own test suite found missing is tested here (see
scripts/peer-tests-safetensors.sh)."""
import ctypes
import importlib
import json
import struct
import threading

import numpy as np
import pytest
import safetensors as ref
import safetensors.numpy as ref_np

from fsttest import NUMPY_DTYPES, file_bytes


@pytest.fixture(scope="module")
def st(fst_pkg):
    return importlib.import_module("fst.compat.safetensors")


@pytest.fixture(scope="module")
def st_np(fst_pkg):
    return importlib.import_module("fst.compat.safetensors.numpy")


def header_of(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), 8 + n


def numpy_tensors():
    """Every dtype numpy holds itself, same-sized types of every width side
    by side (the reference orders them by type, not by size or name),
    scalars, empty and strided arrays."""
    rng = np.random.default_rng(11)
    t = {
        "a.f32": rng.standard_normal((3, 4)).astype(np.float32),
        "b.i32": rng.integers(-9, 9, (5,), dtype=np.int32),
        "c.u32": rng.integers(0, 9, (2, 2), dtype=np.uint32),
        "d.f16": rng.standard_normal((4,)).astype(np.float16),
        "e.i16": rng.integers(-9, 9, (3,), dtype=np.int16),
        "f.u16": rng.integers(0, 9, (3,), dtype=np.uint16),
        "g.f64": rng.standard_normal((2,)),
        "h.i64": rng.integers(-9, 9, (2, 1), dtype=np.int64),
        "i.u64": rng.integers(0, 9, (1,), dtype=np.uint64),
        "j.c64": (rng.standard_normal(3) + 1j).astype(np.complex64),
        "k.bool": np.array([True, False, True]),
        "l.u8": rng.integers(0, 255, (7,), dtype=np.uint8),
        "m.i8": rng.integers(-9, 9, (2, 3), dtype=np.int8),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((2, 0), np.float64),
    }
    try:
        import ml_dtypes
        t["n.bf16"] = rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16)
        t["o.e4m3"] = rng.standard_normal((3,)).astype(ml_dtypes.float8_e4m3fn)
        t["p.e5m2"] = rng.standard_normal((3,)).astype(ml_dtypes.float8_e5m2)
        t["q.e8m0"] = np.array([0.5, 2.0, 8.0], ml_dtypes.float8_e8m0fnu)
    except ImportError:
        pass
    return t


# ------------------------------------------------------------ bytes, numpy

def assert_saves_the_reference_bytes(fst_pkg, st_np, tensors, meta, p):
    """Every way fst saves tensors writes the reference's bytes."""
    want = ref_np.save(tensors, metadata=meta)
    assert st_np.save(tensors, metadata=meta) == want
    assert fst_pkg.save(tensors, meta) == want
    st_np.save_file(tensors, p, metadata=meta)
    assert file_bytes(p) == want


def test_save_is_the_reference_bytes(fst_pkg, st_np, tmp_path):
    tensors = numpy_tensors()
    for meta in (None, {"format": "np"}):
        assert_saves_the_reference_bytes(fst_pkg, st_np, tensors, meta,
                                         tmp_path / "fst.safetensors")
    # insertion order does not matter, in either
    backwards = dict(reversed(list(tensors.items())))
    assert st_np.save(backwards) == ref_np.save(tensors)


def test_control_characters_are_the_reference_bytes(fst_pkg, st, st_np, tmp_path):
    # every control character but NUL (escaped \u00XX by both, the hex in
    # lower case by the reference), quotes and backslashes, in names and in
    # metadata (fst refuses a NUL in a name: docs/cli.md)
    names = ["c" + chr(i) for i in range(1, 32)] + ['q"', "b\\", "e\x1b[0m", "del\x7f"]
    tensors = {n: np.array([i], np.uint8) for i, n in enumerate(names)}
    # one entry: the reference writes several in its hash map's order
    meta = {"note\x1f\x0b": "tab\x0bvt\x1funit\\u001B"}
    p = tmp_path / "ctl.safetensors"
    assert_saves_the_reference_bytes(fst_pkg, st_np, tensors, meta, p)
    with st.safe_open(p, "np") as f:
        assert f.metadata() == meta
        assert sorted(f.keys()) == sorted(names)


def test_metadata_that_cannot_be_written_is_refused(fst_pkg, st_np, tmp_path):
    t = {"x": np.zeros(2, np.uint8)}
    p = tmp_path / "m.safetensors"
    # a NUL would cut the C string short: "cfg\0a" and "cfg\0b" were both
    # written as one "cfg"
    for meta in ({"cfg\x00a": "1", "cfg\x00b": "2"}, {"note": "x\x00y"}):
        with pytest.raises(ValueError, match="NUL character"):
            st_np.save_file(t, p, metadata=meta)
        with pytest.raises(ValueError, match="NUL character"):
            fst_pkg.save(t, meta)
        assert not p.exists()
    # a lone surrogate is Python's own encoding error, not a type error
    with pytest.raises(UnicodeEncodeError):
        st_np.save(t, metadata={"k": "\ud800"})
    with pytest.raises(TypeError, match="dict of str to str"):
        st_np.save(t, metadata={"k": 1})


def test_bytes_from_either_load_in_the_other(st_np):
    tensors = numpy_tensors()
    # the reference's numpy frontend has no bf16 / float8: its deserialize
    # reads those
    plain = {k: v for k, v in tensors.items() if v.dtype.type in NUMPY_DTYPES.values()}
    for got in (st_np.load(ref_np.save(tensors)), ref_np.load(st_np.save(plain)),
                {n: np.frombuffer(d["data"], np.uint8).reshape(-1)
                 for n, d in ref.deserialize(st_np.save(tensors))}):
        for name, a in tensors.items():
            if name in got:
                assert got[name].tobytes() == np.ascontiguousarray(a).tobytes(), name
    fst_loaded = st_np.load(ref_np.save(tensors))
    assert set(fst_loaded) == set(tensors)
    for name, a in tensors.items():
        # F8_E8M0 comes as its bytes in numpy (docs/python.md, dtypes)
        want = np.dtype(np.uint8) if name == "q.e8m0" else a.dtype
        assert fst_loaded[name].shape == a.shape and fst_loaded[name].dtype == want, name
    assert all(a.flags.writeable for a in fst_loaded.values())


def test_strided_and_big_endian_arrays_are_their_values(st_np):
    """fst writes what a strided array shows (the reference writes the memory
    under it as if it were contiguous: a deliberate difference) and
    big-endian arrays little-endian, as the reference does."""
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = ref_np.load(st_np.save({"t": base.T, "s": base[:, ::2], "be": base.astype(">i4")}))
    np.testing.assert_array_equal(got["t"], base.T)
    np.testing.assert_array_equal(got["s"], base[:, ::2])
    np.testing.assert_array_equal(got["be"], base)


def test_serialize_and_tensorspec(st, tmp_path):
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3),
              "y": np.arange(4, dtype=np.int16), "z": np.zeros(0, np.uint8)}

    def specs(mod):
        return {k: mod.TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data,
                                  data_len=a.nbytes) for k, a in arrays.items()}

    want = ref.serialize(specs(ref), metadata={"m": "1"})
    assert st.serialize(specs(st), metadata={"m": "1"}) == want
    p = tmp_path / "s.safetensors"
    st.serialize_file(specs(st), p, metadata={"m": "1"})
    assert file_bytes(p) == want
    spec = st.TensorSpec(dtype="float32", shape=(2, 3), data_ptr=0, data_len=24)
    assert (spec.dtype, spec.shape, spec.data_len) == ("F32", [2, 3], 24)
    with pytest.raises(AttributeError):
        spec.data_len = 1
    # packed F4: the shape given is torch's storage shape, kept as values
    f4 = st.TensorSpec(dtype="float4_e2m1fn_x2", shape=[3, 2], data_ptr=0, data_len=6)
    assert f4.shape == ref.TensorSpec(dtype="float4_e2m1fn_x2", shape=[3, 2], data_ptr=0,
                                      data_len=6).shape == [3, 4]
    with pytest.raises(st.SafetensorError):
        st.TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(TypeError):  # raw dicts were dropped in 0.8, by both
        st.serialize({"x": {"dtype": "float32", "shape": [1], "data_ptr": 0, "data_len": 0}})
    with pytest.raises(st.SafetensorError):  # 4 bytes are not 2x3 float32s
        st.serialize({"x": st.TensorSpec(dtype="float32", shape=[2, 3], data_ptr=0,
                                         data_len=0)})


def test_deserialize_is_the_reference(st):
    blob = ref_np.save(numpy_tensors(), metadata={"k": "v"})
    got = st.deserialize(blob)
    want = ref.deserialize(blob)
    assert sorted((n, d["dtype"], d["shape"], bytes(d["data"])) for n, d in got) == \
        sorted((n, d["dtype"], d["shape"], bytes(d["data"])) for n, d in want)
    header, _ = header_of(blob)
    assert [n for n, _ in got] == sorted((k for k in header if k != "__metadata__"),
                                        key=lambda k: header[k]["data_offsets"])
    with pytest.raises(st.SafetensorError):
        st.deserialize(blob[:-1])


# ------------------------------------------------------------ safe_open, numpy

@pytest.fixture
def cube_file(tmp_path):
    p = tmp_path / "cube.safetensors"
    ref_np.save_file({"cube": np.arange(60, dtype=np.float32).reshape(3, 4, 5),
                      "v": np.arange(4, dtype=np.int64)}, str(p), metadata={"k": "v"})
    return p


def test_missing_file_is_file_not_found(st, st_np, tmp_path):
    missing = tmp_path / "nope.safetensors"
    for call in (lambda: st.safe_open(missing, framework="np"),
                 lambda: st_np.load_file(missing),
                 lambda: st_np.load_file(missing, backend="pread")):
        with pytest.raises(FileNotFoundError) as ei:
            call()
        assert isinstance(ei.value, st.SafetensorError) and ei.value.filename == str(missing)
    with pytest.raises(FileNotFoundError):
        ref.safe_open(str(missing), framework="np")


def test_backend_values_and_their_errors(st, st_np, cube_file, tmp_path):
    loads = [st_np.load_file(cube_file), st_np.load_file(cube_file, backend="pread"),
             st_np.load_file(cube_file, backend="mmap")]
    want = ref_np.load_file(str(cube_file))
    for got in loads:
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    # checked when the object is made, before the file: as the reference
    for path in (cube_file, tmp_path / "missing.safetensors"):
        with pytest.raises(st.SafetensorError, match='backend "nope" is invalid'):
            st.safe_open(path, framework="np", backend="nope")
        with pytest.raises(ref.SafetensorError, match='backend "nope" is invalid'):
            ref.safe_open(str(path), framework="np", backend="nope")
    with pytest.raises(TypeError):
        st.safe_open(cube_file, framework="np", backend=1)
    with pytest.raises(TypeError):
        ref.safe_open(str(cube_file), framework="np", backend=1)
    with pytest.raises(st.SafetensorError, match="backend"):
        st_np.load_file(cube_file, backend="MMAP")


def test_mmap_arrays_are_copy_on_write(st, st_np, cube_file):
    """backend="mmap" maps the file: the arrays may be written, as the
    reference's may, and a write reaches neither the file nor other
    loads."""
    before = file_bytes(cube_file)
    got = st_np.load_file(cube_file, backend="mmap")
    assert got["cube"].flags.writeable
    got["cube"][0, 0, 0] = -1.0
    with st.safe_open(cube_file, framework="np") as f:
        t = f.get_tensor("v")
        t[:] = 7
        assert f.get_tensor("cube")[0, 0, 0] == 0.0
    assert file_bytes(cube_file) == before
    assert st_np.load_file(cube_file)["v"].tolist() == [0, 1, 2, 3]


class Index:
    def __getitem__(self, k):
        return k


I = Index()
# slices the reference's indexer takes, refuses, or refuses with its words
SLICES = [I[:], I[()], I[1:3], I[::2], I[1::2], I[:, 1:3], I[..., 0], I[0, ...], I[0, ..., 1],
          I[..., 1:3, 0], I[0, 0, 0], I[:, :2, 2:4], I[-3], I[-1], I[2, -5], I[1:1], I[0:0:2],
          I[:, ::3, 1], I[True], I[np.int64(1)], I[[]], I[:20], I[:, 4:], I[3:3], I[:, 3:10:2],
          I[5], I[..., 6], I[-4], I[..., -6], I[0, 0, 0, 0], I[-1:], I[:-1], I[::-1], I[::0],
          I[None], I[[0, 2]], I[..., ...], I[1.5], I["a"], I[::1.5], I[2 ** 40], I[3:1],
          # a bound past the end in one dimension and a start after its stop in a
          # later one: the reference names the bound
          I[4:1, :, 1:0], I[5:, 2:1]]


def same_outcome(got_call, want_call, what, fst_error):
    """Both give equal arrays, or both raise the same kind of error with the
    same words (the reference's SafetensorError is fst's)."""
    try:
        want = want_call()
    except Exception as e:  # noqa: BLE001
        want = e
    try:
        got = got_call()
    except Exception as e:  # noqa: BLE001
        got = e
    if isinstance(want, Exception):
        assert isinstance(got, Exception), (what, "fst gave a result where the reference "
                                            f"raised {want!r}")
        if isinstance(want, ref.SafetensorError):
            assert isinstance(got, fst_error), (what, got)
        else:
            assert type(got) is type(want), (what, got, want)
        assert str(got) == str(want), what
        return
    assert not isinstance(got, Exception), (what, got)
    assert tuple(got.shape) == tuple(want.shape), what
    if hasattr(want, "cpu"):  # torch, maybe on a GPU
        assert got.device == want.device and got.dtype == want.dtype, what
        got, want = got.cpu(), want.cpu()
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), what


def test_slices_are_the_reference_ones(st, cube_file):
    """framework="np": the reference's own indexer, its bounds checks and
    its words, not numpy's clipping and counting from the end."""
    with st.safe_open(cube_file, framework="np") as f, \
            ref.safe_open(str(cube_file), framework="np") as r:
        s, rs = f.get_slice("cube"), r.get_slice("cube")
        assert s.get_shape() == rs.get_shape() == [3, 4, 5]
        assert s.get_dtype() == rs.get_dtype() == "F32"
        for idx in SLICES:
            same_outcome(lambda: s[idx], lambda: rs[idx], idx, st.SafetensorError)
        # a start past its stop: the reference fails with a SystemError (a
        # negative size reaches CPython), fst with its own error
        with pytest.raises(SystemError):
            rs[2:1]
        with pytest.raises(st.SafetensorError, match="after its stop"):
            s[2:1]
        # a cut is a fresh array, not a view of the loaded tensor
        part = s[0:1]
        part[:] = 99
        assert f.get_tensor("cube")[0, 0, 0] == 0.0


def test_get_tensors_keys_metadata(st, cube_file):
    with st.safe_open(cube_file, framework="np") as f, \
            ref.safe_open(str(cube_file), framework="np") as r:
        got, want = f.get_tensors(), r.get_tensors()
        assert list(got) == f.offset_keys() == r.offset_keys()
        assert f.keys() == r.keys() == sorted(want)
        assert f.metadata() == r.metadata() == {"k": "v"}
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
            assert got[k] is f.get_tensor(k)


def test_closed_and_unknown_names(st, cube_file):
    with st.safe_open(cube_file, framework="np") as f:
        kept = f.get_tensor("v")
        cut = f.get_slice("cube")
        with pytest.raises(st.SafetensorError, match="File does not contain tensor zz") as ei:
            f.get_tensor("zz")
        assert isinstance(ei.value, KeyError) and str(ei.value) == \
            "File does not contain tensor zz"
        with pytest.raises(KeyError):
            f.get_slice("zz")
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("v"),
                 lambda: f.get_slice("v")):
        with pytest.raises(st.SafetensorError, match="File is closed"):
            call()
    # what was handed out stays valid
    assert kept.tolist() == [0, 1, 2, 3]
    assert cut[1, 1].tolist() == [25.0, 26.0, 27.0, 28.0, 29.0]


def test_safe_open_handle(st, cube_file):
    with open(cube_file, "r") as fh, st._safe_open_handle(fh, framework="np") as f:
        assert f.get_tensor("v").tolist() == [0, 1, 2, 3]

    class NoFileno:
        name = str(cube_file)
    with pytest.raises(AttributeError):
        st._safe_open_handle(NoFileno(), framework="np")


def test_first_load_happens_once_across_threads(st, fst_pkg, cube_file, monkeypatch):
    """transformers cuts slices from a pool of threads: the first cuts, at
    once, must share one load."""
    calls = []
    real = fst_pkg._fst.load

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(fst_pkg._fst, "load", counting)
    with st.safe_open(cube_file, framework="np", backend="pread") as f:
        slices = [f.get_slice("cube") for _ in range(8)]
        barrier = threading.Barrier(8)
        out = [None] * 8

        def cut(i):
            barrier.wait()
            out[i] = slices[i][i % 3]

        threads = [threading.Thread(target=cut, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(calls) == 1
    assert [o[0, 0] for o in out] == [20.0 * (i % 3) for i in range(8)]


def test_f8_e8m0_numpy(st_np, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([0.25, 1.0, 64.0], ml_dtypes.float8_e8m0fnu)
    blob = st_np.save({"scale": a})
    assert header_of(blob)[0]["scale"]["dtype"] == "F8_E8M0"
    assert ref.deserialize(blob)[0][1]["data"] == bytearray(a.tobytes())
    # fst gives F8_E8M0 as its bytes in numpy (docs/python.md, dtypes)
    assert st_np.load(blob)["scale"].tobytes() == a.tobytes()


def test_a_safe_open_lets_its_file_go_once_loaded(st, cube_file):
    # transformers keeps a safe_open per shard for the whole load: after
    # its first tensor one holds no descriptor of its file, its slices and
    # header still answering
    import os

    def held():
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds
                   if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(cube_file))

    before = held()
    kept = []
    for _ in range(20):
        f = st.safe_open(cube_file, framework="np")
        s = f.get_slice("cube")
        assert s[0:1].shape == (1, 4, 5)
        kept.append((f, s))
    assert held() == before
    f, s = kept[-1]
    with ref.safe_open(str(cube_file), framework="np") as r:
        assert f.keys() == r.keys() and f.offset_keys() == r.offset_keys()
        assert f.metadata() == r.metadata()
        np.testing.assert_array_equal(s[1:3, ::2], r.get_slice("cube")[1:3, ::2])
    with pytest.raises(st.SafetensorError, match="does not contain tensor nope"):
        f.get_slice("nope")


# ------------------------------------------------------------ torch

@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="the torch half of the reference API needs torch")


@pytest.fixture(scope="module")
def st_pt(fst_pkg, torch):
    return importlib.import_module("fst.compat.safetensors.torch")


@pytest.fixture(scope="module")
def ref_pt(torch):
    return importlib.import_module("safetensors.torch")


def raw(t):
    import torch
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def torch_tensors(torch):
    g = torch.Generator().manual_seed(5)
    t = {
        "f32": torch.randn(3, 4, generator=g), "i32": torch.arange(5, dtype=torch.int32),
        "bf16": torch.randn(2, 2, generator=g).bfloat16(), "f16": torch.randn(3).half(),
        "i64": torch.arange(3), "bool": torch.tensor([True, False]),
        "u8": torch.arange(7, dtype=torch.uint8), "c64": torch.zeros(2, dtype=torch.complex64),
        "scalar": torch.tensor(1.5), "empty": torch.zeros(2, 0),
        "e4m3": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
    }
    if hasattr(torch, "uint32"):
        t["u32"] = torch.arange(4, dtype=torch.int32).view(torch.uint32)
    if hasattr(torch, "float8_e8m0fnu"):
        t["e8m0"] = torch.tensor([0.5, 4.0]).to(torch.float8_e8m0fnu)
    if hasattr(torch, "float4_e2m1fn_x2"):
        t["f4"] = torch.arange(6, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(3, 2)
    return t


def test_torch_bytes_both_ways(torch, st_pt, ref_pt, tmp_path):
    tensors = torch_tensors(torch)
    want = ref_pt.save(tensors, metadata={"format": "pt"})
    assert st_pt.save(tensors, metadata={"format": "pt"}) == want
    p = tmp_path / "fst.safetensors"
    st_pt.save_file(tensors, p, metadata={"format": "pt"})
    assert file_bytes(p) == want
    q = tmp_path / "ref.safetensors"
    ref_pt.save_file(tensors, str(q))
    for got in (st_pt.load_file(q), st_pt.load_file(q, backend="pread"), st_pt.load(want),
                ref_pt.load_file(str(p))):
        assert set(got) == set(tensors)
        for k, t in tensors.items():
            assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
            assert raw(got[k]) == raw(t), k


# names that clients import from the reference's modules beside the
# functions (vLLM: safe_open from safetensors.torch, _TYPES as its dtype map;
# torch's checkpoint reader: _getdtype)
IMPORTED = ("safe_open", "serialize", "serialize_file", "deserialize", "TensorSpec", "_TYPES",
            "_getdtype")


def test_names_clients_import_from_the_torch_module(torch, st, st_pt, ref_pt):
    for name in IMPORTED + ("_SIZE",):
        assert hasattr(ref_pt, name), name  # still the reference's
        assert hasattr(st_pt, name), name
    for name in IMPORTED[:5]:
        assert getattr(st_pt, name) is getattr(st, name), name
    assert st_pt._TYPES == ref_pt._TYPES
    assert {k: v for k, v in st_pt._SIZE.items() if k is not None} == \
        {k: v for k, v in ref_pt._SIZE.items() if k is not None}
    assert st_pt._getdtype("BF16") is torch.bfloat16
    with pytest.raises(KeyError):
        st_pt._getdtype("F4")


def test_names_clients_import_from_the_numpy_module(st, st_np):
    for name in IMPORTED:
        assert hasattr(ref_np, name), name
        assert hasattr(st_np, name), name
    for name in IMPORTED[:5]:
        assert getattr(st_np, name) is getattr(st, name), name
    assert st_np._TYPES == ref_np._TYPES
    assert st_np._getdtype("U16") is np.uint16


def test_conjugate_and_negative_views_are_saved_as_their_values(torch, st_pt, tmp_path):
    # their memory holds the values before the conjugation or negation (the
    # reference writes that memory: the wrong values)
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    n = torch.tensor([1.0, -2.0])._neg_view()
    p = tmp_path / "views.safetensors"
    st_pt.save_file({"c": c, "n": n}, p)
    got = st_pt.load_file(p)
    assert torch.equal(got["c"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert torch.equal(got["n"], torch.tensor([-1.0, 2.0]))
    assert torch.equal(st_pt.load(st_pt.save({"c": c}))["c"], c.resolve_conj())


def test_f4_and_e8m0_round_trip(torch, st_pt, ref_pt, tmp_path):
    if not (hasattr(torch, "float4_e2m1fn_x2") and hasattr(torch, "float8_e8m0fnu")):
        pytest.skip(f"torch {torch.__version__} has no float4_e2m1fn_x2 / float8_e8m0fnu")
    f4 = torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 4)
    e8 = torch.tensor([0.5, 2.0], dtype=torch.float8_e8m0fnu)
    p = tmp_path / "f4.safetensors"
    st_pt.save_file({"f4": f4, "e8": e8}, p)
    header, _ = header_of(file_bytes(p))
    assert header["f4"]["dtype"] == "F4" and header["f4"]["shape"] == [2, 8]
    assert header["e8"]["dtype"] == "F8_E8M0"
    for got in (st_pt.load_file(p), ref_pt.load_file(str(p))):
        assert got["f4"].dtype == torch.float4_e2m1fn_x2 and tuple(got["f4"].shape) == (2, 4)
        assert raw(got["f4"]) == raw(f4)
        assert got["e8"].dtype == torch.float8_e8m0fnu and raw(got["e8"]) == raw(e8)


def test_tensor_subclasses_are_saved_as_tensors(torch, st_pt, ref_pt, tmp_path):
    """A torch.Tensor subclass from outside torch (vLLM's parameters, a
    user's) is saved as a tensor, with the reference's bytes and refusals:
    it went the numpy way once (BF16 and parameters failed, shared and
    strided ones were saved)."""
    class Sub(torch.Tensor):
        pass

    w = torch.arange(6, dtype=torch.float32).reshape(2, 3).bfloat16().as_subclass(Sub)
    p = torch.nn.Parameter(torch.ones(4, 2))  # requires grad
    tensors = {"w": w, "p": p}
    assert st_pt.save(tensors) == ref_pt.save(tensors)
    s = torch.ones(2).as_subclass(Sub)
    for bad, exc in (({"a": s, "b": s}, RuntimeError),
                     ({"t": torch.ones(2, 3).as_subclass(Sub).t()}, ValueError)):
        with pytest.raises(exc):
            ref_pt.save(bad)
        with pytest.raises(exc):
            st_pt.save(bad)


def test_f4_slices_count_values_with_every_backend(torch, st, st_pt, tmp_path):
    """get_shape() counts F4 values, and so does every slice: with the mmap
    backend (torch's indexing) a slice once counted bytes of two values,
    giving twice the columns asked for."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip(f"torch {torch.__version__} has no float4_e2m1fn_x2")
    f4 = torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 4)
    p = tmp_path / "f4.safetensors"
    st_pt.save_file({"f4": f4}, p)
    cuts = []
    for backend in ("mmap", "pread"):
        with st.safe_open(p, "pt", backend=backend) as f:
            sl = f.get_slice("f4")
            assert sl.get_shape() == [2, 8]
            cuts.append((sl[:, 0:2], sl[1:, 4:8], sl[:]))
    for a, b in zip(*cuts):
        assert a.shape == b.shape and raw(a) == raw(b)
    assert raw(cuts[0][0]) == bytes([0, 4])  # the first byte of each row: two values
    assert raw(cuts[0][1]) == bytes([6, 7])


def test_shared_strided_sparse_and_bogus_are_refused(torch, st_pt, ref_pt, fst_pkg, tmp_path):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    cases = [
        ({"A": a, "B": a[:1]}, RuntimeError),
        ({"A": a, "B": a[1:]}, RuntimeError),
        ({"T": a.t()}, ValueError),
        ({"S": torch.sparse_coo_tensor(size=(2, 3))}, ValueError),
        ({"D": {"not": "a tensor"}}, ValueError),
        ("notadict", ValueError),
    ]
    p = tmp_path / "x.safetensors"
    for tensors, exc in cases:
        for save in (lambda: ref_pt.save_file(tensors, str(p)), lambda: ref_pt.save(tensors),
                     lambda: st_pt.save_file(tensors, p), lambda: st_pt.save(tensors)):
            with pytest.raises(exc):
                save()
        if not isinstance(tensors, str) and "D" not in tensors:
            with pytest.raises(exc):  # fst's own save_file refuses them too
                fst_pkg.save_file(tensors, p)
        assert not p.exists()
    # disjoint views of one storage are not shared
    st_pt.save_file({"X": a[1:], "Y": a[:1]}, p)
    assert file_bytes(p) == ref_pt.save({"X": a[1:], "Y": a[:1]})


def test_save_model_and_load_model(torch, st_pt, ref_pt, tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = self.a

    torch.manual_seed(0)
    m = Tied()
    with pytest.raises(RuntimeError):
        st_pt.save_file(m.state_dict(), tmp_path / "x.safetensors")
    p, q = tmp_path / "fst.safetensors", tmp_path / "ref.safetensors"
    st_pt.save_model(m, p)
    ref_pt.save_model(m, str(q))
    (hp, np_), (hq, nq) = header_of(file_bytes(p)), header_of(file_bytes(q))
    assert hp == hq and file_bytes(p)[np_:] == file_bytes(q)[nq:]
    assert hp["__metadata__"] == {"b.bias": "a.bias", "b.weight": "a.weight"}
    for load_model, path in ((st_pt.load_model, q), (ref_pt.load_model, p)):
        m2 = Tied()
        assert load_model(m2, str(path)) == (set(), [])
        for k, v in m.state_dict().items():
            assert torch.equal(m2.state_dict()[k], v)

    class Untied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

    with pytest.raises(RuntimeError, match='Missing key.s. in state_dict: "b.bias", "b.weight"'):
        st_pt.load_model(Untied(), p)
    missing, unexpected = st_pt.load_model(Untied(), p, strict=False)
    assert missing == {"b.bias", "b.weight"} and unexpected == []
    strided = torch.nn.Linear(3, 3)
    strided.weight = torch.nn.Parameter(torch.zeros(3, 3).t())
    with pytest.raises(ValueError, match="force_contiguous=True"):
        st_pt.save_model(strided, p, force_contiguous=False)
    st_pt.save_model(strided, p)
    assert torch.equal(st_pt.load_file(p)["weight"], torch.zeros(3, 3))

def test_torch_slices_follow_the_reference(torch, st, fst_pkg, ref_pt, tmp_path):
    """framework="pt": with backend="mmap" the reference hands the index to
    torch (clipping, negative bounds, lists); with "pread" to its own
    indexer. fst does the same, with the same results and errors."""
    p = tmp_path / "t.safetensors"
    ref_pt.save_file({"cube": torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)}, str(p))
    for backend in ("mmap", "pread"):
        with st.safe_open(p, framework="pt", backend=backend) as f, \
                ref.safe_open(str(p), framework="pt", backend=backend) as r:
            s, rs = f.get_slice("cube"), r.get_slice("cube")
            for idx in SLICES + [I[:, -2:], I[2:1]] if backend == "mmap" else SLICES:
                same_outcome(lambda: s[idx], lambda: rs[idx], (backend, idx), st.SafetensorError)
    with st.safe_open(p, framework="pt") as f:
        assert torch.equal(f.get_slice("cube")[:20], f.get_tensor("cube"))  # torch clips


def test_torch_mmap_tensors_may_be_written(torch, st, st_pt, ref_pt, tmp_path):
    """fst's read-only io=mmap views would kill the process on a write; the
    reference's mmap tensors may be written, and so may fst's behind
    backend="mmap": copy-on-write, the file unchanged."""
    p = tmp_path / "w.safetensors"
    ref_pt.save_file({"w": torch.zeros(4, 4), "b": torch.ones(4)}, str(p))
    before = file_bytes(p)
    got = st_pt.load_file(p)
    got["w"].add_(1)
    with st.safe_open(p, framework="pt") as f:
        f.get_slice("b")[...].mul_(3)
        f.get_tensor("w").sub_(5)
    assert file_bytes(p) == before
    again = st_pt.load_file(p)
    assert torch.equal(again["w"], torch.zeros(4, 4)) and torch.equal(again["b"], torch.ones(4))


def test_gpu_loads_follow_the_reference(torch, st, st_pt, ref_pt, tmp_path):
    """device="cuda:0" or 0: the tensors land there, for either backend
    (fst's GPU path for both), with the reference's values and slices."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    p = tmp_path / "g.safetensors"
    tensors = torch_tensors(torch)
    ref_pt.save_file(tensors, str(p))
    for device in ("cuda:0", 0, "cuda"):
        for backend in ("mmap", "pread"):
            got = st_pt.load_file(p, device=device, backend=backend)
            want = ref_pt.load_file(str(p), device=device, backend=backend)
            for k in tensors:
                assert got[k].device == want[k].device == torch.device("cuda:0"), k
                assert got[k].dtype == want[k].dtype and raw(got[k]) == raw(want[k]), k
            with st.safe_open(p, framework="pt", device=device, backend=backend) as f, \
                    ref.safe_open(str(p), framework="pt", device=device, backend=backend) as r:
                s, rs = f.get_slice("f32"), r.get_slice("f32")
                for idx in (I[1:3], I[:, 1], I[..., -1], I[:20], I[-1:], I[5], I[::2]):
                    same_outcome(lambda: s[idx], lambda: rs[idx], (device, backend, idx),
                                 st.SafetensorError)


@pytest.mark.parametrize("shape", [[1] * 65, [1] * 200, [1 << 59, 0], [1 << 58, 1, 0]],
                         ids=["65-dims", "200-dims", "2^59x0", "2^58x1x0"])
def test_shapes_the_reference_writes(st, shape):
    """Any number of dimensions, and an empty tensor of huge other dimensions:
    written with the reference's bytes, and read back."""
    n = 0 if 0 in shape else 1
    buf = (ctypes.c_uint8 * 1)(7)

    def spec(mod):
        return {"a": mod.TensorSpec(dtype="uint8", shape=shape,
                                    data_ptr=ctypes.addressof(buf) if n else 0, data_len=n)}
    want = ref.serialize(spec(ref))
    assert st.serialize(spec(st)) == want
    assert [(k, v["shape"]) for k, v in st.deserialize(want)] == [("a", shape)]


def test_save_to_the_longest_file_name(st_np, tmp_path):
    """A name of NAME_MAX bytes is saved, as the reference saves it (the
    temporary file beside it once took 13 more bytes and failed)."""
    name = "m" * (255 - len(".safetensors")) + ".safetensors"
    t = {"a": np.arange(5, dtype=np.int16)}
    st_np.save_file(t, str(tmp_path / name))
    assert (tmp_path / name).read_bytes() == ref_np.save(t)
    assert [p.name for p in tmp_path.iterdir()] == [name]
