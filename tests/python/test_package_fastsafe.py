"""fst's fastsafetensors-compatible API (SafeTensorsFileLoader, SingleGroup,
fastsafe_open, FilesBufferOnDevice) with framework='numpy', as vLLM and the
fastsafetensors examples call it. get_sharded is checked against
fastsafetensors' own cut (block = ceil(size / world), rank r gets
[r * block, (r + 1) * block)) with fake process groups; fst loads every file
on every rank (no NCCL scatter yet), so the shards are cut locally."""
import numpy as np
import pytest

from fsttest import Header, file_bytes, write_safetensors


def expected(files):
    out = {}
    for f in files:
        h, blob = Header(f), file_bytes(f)
        for name, info in h.tensors.items():
            b, e = info["data_offsets"]
            out[name] = (str(f), info["shape"], blob[h.data_offset + b:h.data_offset + e])
    return out


@pytest.fixture(scope="module")
def shards(gen_dir):
    d = gen_dir(shards=3, seed=41, size="1MiB", misaligned=True)
    return sorted(str(f) for f in d.glob("*.safetensors"))


@pytest.fixture(scope="module")
def matrices(tmp_path_factory):
    """Tensors with sizes that do and do not divide by 2 and 3."""
    rng = np.random.default_rng(8)
    arrays = {
        "w.5x4": rng.standard_normal((5, 4)).astype(np.float32),
        "w.6x3": rng.standard_normal((6, 3)).astype(np.float32),
        "w.1x7": rng.integers(-9, 9, (1, 7)).astype(np.int32),
        "w.2x3x5": rng.standard_normal((2, 3, 5)).astype(np.float64),
        "b.7": rng.standard_normal(7).astype(np.float16),
        "s": np.array(3, np.int64),
    }
    p = tmp_path_factory.mktemp("fsf") / "m.safetensors"
    write_safetensors(p, [(k, {np.float32: "F32", np.int32: "I32", np.float64: "F64",
                                np.float16: "F16", np.int64: "I64"}[v.dtype.type], v.shape,
                           v.tobytes()) for k, v in arrays.items()],
                      metadata={"format": "np"})
    return str(p), arrays


class FakeGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def fastsafetensors_cut(a, rank, world, dim):
    """fastsafetensors' LazyTensorFactory.shuffle slicing."""
    if world == 1 or dim == -1:
        return a
    block = (a.shape[dim] + world - 1) // world
    index = (slice(None),) * dim + (slice(rank * block, (rank + 1) * block),)
    return a[index]


def test_loader_single_group(fst_pkg, shards):
    want = expected(shards)
    loader = fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), device="cpu", nogds=True,
                                           framework="numpy")
    loader.add_filenames({0: shards})
    assert sorted(loader.get_keys()) == sorted(want)
    name = next(iter(want))
    assert loader.get_shape(name) == want[name][1]
    fb = loader.copy_files_to_device()
    assert sorted(fb.get_keys()) == sorted(want) == sorted(fb.key_to_rank_lidx)
    for n, (f, shape, raw) in want.items():
        a = fb.get_tensor(n)
        assert isinstance(a, np.ndarray) and list(a.shape) == shape and a.tobytes() == raw, n
        assert fb.get_tensor(tensor_name=n) is a
        assert fb.get_filename(n) == f
        assert fb.get_shape(n) == shape
        assert fb.get_sharded(n, 0).tobytes() == raw  # world 1: the whole tensor
        assert fb.get_sharded(tensor_name=n, dim=-1) is a
    assert fb.key_to_rank_lidx[n][0] == 0
    assert {fb.key_to_rank_lidx[n][1] for n in want} == {0, 1, 2}
    assert fb.get_filename("no.such.tensor") == ""
    with pytest.raises(ValueError):
        fb.get_shape("no.such.tensor")
    fb.close()
    with pytest.raises(KeyError):
        fb.get_tensor(n)
    loader.reset()
    assert loader.get_keys() == []
    loader.close()


def test_vllm_style_iterator(fst_pkg, shards):
    """vLLM's fastsafetensors_weights_iterator, with fst imported instead."""
    from fst import SafeTensorsFileLoader, SingleGroup
    want = expected(shards)
    pg = SingleGroup()
    seen = {}
    weight_files_sub_lists = [shards[i:i + pg.size()] for i in range(0, len(shards), pg.size())]
    for f_list in weight_files_sub_lists:
        loader = SafeTensorsFileLoader(pg, "cpu", nogds=True, framework="numpy")
        rank_file_map = {i: [f] for i, f in enumerate(f_list)}
        loader.add_filenames(rank_file_map)
        try:
            fb = loader.copy_files_to_device()
            try:
                keys = list(fb.key_to_rank_lidx.keys())
                for k in keys:
                    t = fb.get_tensor(k)
                    assert k not in seen
                    seen[k] = t
            finally:
                fb.close()
        finally:
            loader.close()
    assert {k: v.tobytes() for k, v in seen.items()} == {k: v[2] for k, v in want.items()}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_get_sharded_numpy(fst_pkg, matrices, world, dim):
    path, arrays = matrices
    for rank in range(world):
        loader = fst_pkg.SafeTensorsFileLoader(FakeGroup(rank, world), "cpu", nogds=True,
                                               framework="numpy")
        loader.add_filenames({0: [path]})
        fb = loader.copy_files_to_device()
        for name, a in arrays.items():
            if a.ndim == 0:
                assert fb.get_sharded(name, dim).tobytes() == a.tobytes()
                continue
            if dim >= a.ndim or dim < -a.ndim:
                continue
            got = fb.get_sharded(name, dim)
            # -1 is fastsafetensors' "whole tensor"; other negatives count from the end
            d = dim if dim == -1 else dim % a.ndim
            want = fastsafetensors_cut(a, rank, world, d)
            assert got.shape == want.shape, (name, rank, world, dim)
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, rank)
        fb.close()
        loader.close()
    # the shards of all ranks put together are the tensor
    a = arrays["w.5x4"]
    parts = []
    for rank in range(world):
        loader = fst_pkg.SafeTensorsFileLoader(FakeGroup(rank, world), "cpu", framework="numpy")
        loader.add_filenames({0: [path]})
        parts.append(loader.copy_files_to_device().get_sharded("w.5x4", 0))
    np.testing.assert_array_equal(np.concatenate(parts, 0), a)


def test_every_rank_loads_every_file(fst_pkg, shards):
    """{rank: files} for two ranks: each rank sees all tensors (fst has no
    broadcast yet, so it reads the other rank's files itself)."""
    want = expected(shards)
    for rank in (0, 1):
        loader = fst_pkg.SafeTensorsFileLoader(FakeGroup(rank, 2), "cpu", nogds=True,
                                               framework="numpy")
        loader.add_filenames({0: shards[:2], 1: shards[2:]})
        fb = loader.copy_files_to_device()
        assert sorted(fb.key_to_rank_lidx) == sorted(want)
        for n, (f, _, raw) in want.items():
            assert fb.get_tensor(n).tobytes() == raw
            assert fb.key_to_rank_lidx[n][0] == (1 if f == shards[2] else 0)
            assert fb.get_filename(n) == f


def test_dtype_and_device_conversions(fst_pkg, matrices):
    path, arrays = matrices
    loader = fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), "cpu", framework="numpy")
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device(dtype=np.float64)
    for name, a in arrays.items():
        got = fb.get_tensor(name)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, a.astype(np.float64))
    fb = loader.copy_files_to_device()
    assert fb.get_tensor("w.5x4", dtype=np.float16).dtype == np.float16
    assert fb.get_tensor("w.5x4", device="cpu").dtype == np.float32
    with pytest.raises(fst_pkg.UsageError):
        fb.get_tensor("w.5x4", device="cuda:0")


def test_duplicate_keys_refused(fst_pkg, matrices, tmp_path):
    """Two files holding one key are refused; one file registered twice is
    one file, as in fastsafetensors."""
    path, arrays = matrices
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(open(path, "rb").read())
    loader = fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), "cpu", framework="numpy")
    loader.add_filenames({0: [path, str(copy)]})
    with pytest.raises(fst_pkg.UsageError, match="must be unique"):
        loader.copy_files_to_device()
    loader = fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), "cpu", framework="numpy")
    loader.add_filenames({0: [path, path]})
    fb = loader.copy_files_to_device()
    assert sorted(fb.get_keys()) == sorted(arrays)


def test_single_group_class_and_defaults(fst_pkg, matrices):
    """Old fastsafetensors examples pass SingleGroup itself, not an instance."""
    path, arrays = matrices
    loader = fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup, "cpu", nogds=True,
                                           framework="np")
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device()
    assert fb.get_sharded("w.6x3", 1).shape == (6, 3)
    g = fst_pkg.SingleGroup()
    assert (g.rank(), g.size()) == (0, 1)


def test_fastsafe_open(fst_pkg, matrices, shards):
    path, arrays = matrices
    with fst_pkg.fastsafe_open(path, framework="numpy", nogds=True) as f:
        assert sorted(f.keys()) == sorted(arrays) == sorted(f.get_keys())
        for name, a in arrays.items():
            assert f.get_tensor(name).tobytes() == a.tobytes()
        assert f.metadata() == {path: {"format": "np"}}
        assert f.get_filename("w.5x4") == path  # the buffer's methods, through f
        assert f.get_sharded("w.5x4", 0).shape == (5, 4)
        kept = f.get_tensor("w.6x3")
    assert kept.tobytes() == arrays["w.6x3"].tobytes()  # outlives the context
    want = expected(shards)
    for spec in (shards, {0: shards}, {0: shards[:1], 1: shards[1:]}):
        with fst_pkg.fastsafe_open(spec, "numpy", None, "cpu", True) as f:
            assert sorted(f.keys()) == sorted(want)
            assert set(f.metadata()) == set(shards)
            for n in f.keys():
                assert f.get_tensor(n).tobytes() == want[n][2]


def test_fastsafe_open_numpy_on_gpu_refused(fst_pkg, matrices):
    path, _ = matrices
    with pytest.raises(fst_pkg.UsageError, match="numpy arrays live on the CPU"):
        fst_pkg.fastsafe_open(path, framework="numpy", device="cuda:0")
    with pytest.raises(fst_pkg.UsageError):
        fst_pkg.SafeTensorsFileLoader(None, "cuda:0", framework="numpy")
    with pytest.raises(fst_pkg.UsageError, match="framework"):
        fst_pkg.SafeTensorsFileLoader(None, "cpu", framework="paddle")


def test_pytorch_default_needs_torch(fst_pkg, matrices):
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed: test_package_torch.py covers framework='pytorch'")
    except ImportError:
        pass
    path, _ = matrices
    # fastsafetensors' framework is chosen when the loader is made: so is
    # the missing torch found, before any file is added or read
    with pytest.raises(ImportError, match="torch"):
        fst_pkg.SafeTensorsFileLoader(fst_pkg.SingleGroup(), "cpu", nogds=True)


def test_face_imported_on_first_use(fst_pkg, run_python):
    """`import fst` leaves fst.compat.fastsafetensors unimported (most of the
    import's time); the face's names still resolve from fst, to the face's
    own objects, and are listed by dir(fst)."""
    r = run_python("""
        import sys, fst
        assert 'fst.compat.fastsafetensors' not in sys.modules, 'imported early'
        names = ('FilesBufferOnDevice', 'SafeTensorsFileLoader', 'SingleGroup', 'fastsafe_open')
        assert all(n in dir(fst) for n in names)
        from fst import SafeTensorsFileLoader
        import fst.compat.fastsafetensors as face
        assert all(getattr(fst, n) is getattr(face, n) for n in names)
        assert SafeTensorsFileLoader is face.SafeTensorsFileLoader
        try:
            fst.no_such_name
        except AttributeError as e:
            assert 'no_such_name' in str(e)
        else:
            raise SystemExit('no AttributeError')
        print('ok')
        """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
