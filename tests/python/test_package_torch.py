"""The fst package with torch (framework='pt', the default), against
safetensors.torch: CPU and cuda:0 loads, BF16 / F8 / unsigned dtypes,
safe_open, save_file, iter_tensors on the GPU, the fastsafetensors API
(get_sharded for a fake process group of world 2), and the torch allocator
integration (torch.cuda.memory_allocated sees fst's loads).

Skipped where torch is not installed (the CPU test machine); the GPU tests
also need torch.cuda.is_available()."""
import gc

import numpy as np
import pytest

from fsttest import Header, file_bytes, tensor_nbytes, write_safetensors

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open as ref_safe_open  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device for torch")
DEVICES = ["cpu", pytest.param("cuda:0", marks=needs_cuda)]
MiB = 1 << 20


def raw_bytes(t):
    """The bytes of a tensor, whatever its dtype and device."""
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    flat = t.reshape(-1)
    signed = {getattr(torch, f"uint{b}", None): getattr(torch, f"int{b}") for b in (16, 32, 64)}
    if flat.dtype in signed:  # torch's shell unsigned types support few ops
        flat = flat.view(signed[flat.dtype])
    return flat.view(torch.uint8).numpy().tobytes()


def file_tensors(path):
    h, blob = Header(path), file_bytes(path)
    return {n: (i["dtype"], tuple(i["shape"]),
                blob[h.data_offset + i["data_offsets"][0]:h.data_offset + i["data_offsets"][1]])
            for n, i in h.tensors.items()}


def assert_same(got, want, name=""):
    assert isinstance(got, torch.Tensor), (name, type(got))
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (name, got.shape, want.shape)
    assert got.device == want.device, (name, got.device, want.device)
    assert raw_bytes(got) == raw_bytes(want), name


def torch_dtypes():
    names = ["bool", "uint8", "int8", "int16", "float16", "bfloat16", "int32", "float32",
             "int64", "float64", "complex64", "uint16", "uint32", "uint64",
             "float8_e4m3fn", "float8_e5m2"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def make(dtype, shape, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point and dtype.itemsize == 1:
        return (torch.randn(shape, generator=gen) * 4).to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    return torch.randint(0, 100, shape, generator=gen, dtype=torch.int64).to(dtype)


@pytest.fixture(scope="module")
def ref_file(tmp_path_factory):
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for dt in torch_dtypes():
        n = str(dt).replace("torch.", "")
        tensors[f"{n}.m"] = make(dt, (5, 3), gen)
        tensors[f"{n}.s"] = make(dt, (), gen)
        tensors[f"{n}.e"] = make(dt, (0, 2), gen)
    p = tmp_path_factory.mktemp("pt") / "every_dtype.safetensors"
    try:
        st_torch.save_file(tensors, str(p), metadata={"format": "pt"})
    except Exception:  # an older reference without the unsigned types
        tensors = {k: v for k, v in tensors.items() if not k.startswith("uint") or
                   k.startswith("uint8")}
        st_torch.save_file(tensors, str(p), metadata={"format": "pt"})
    return p, tensors


@pytest.mark.parametrize("device", DEVICES)
def test_load_file_matches_reference(fst_pkg, ref_file, device):
    p, tensors = ref_file
    got = fst_pkg.load_file(p, device=device)
    want = st_torch.load_file(str(p), device=device)
    assert set(got) == set(want) == set(tensors)
    for name in want:
        assert_same(got[name], want[name], name)
    assert got["bfloat16.m"].dtype == torch.bfloat16
    assert got["float32.s"].shape == () and got["int8.e"].shape == (0, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_loaded_tensors_are_writable_and_independent(fst_pkg, ref_file, device):
    p, tensors = ref_file
    got = fst_pkg.load_file(p, device=device)
    got["float32.m"].add_(1)
    assert torch.equal(got["float32.m"].cpu(), tensors["float32.m"] + 1)
    again = fst_pkg.load_file(p, device=device)
    assert torch.equal(again["float32.m"].cpu(), tensors["float32.m"])


@pytest.mark.parametrize("device", DEVICES)
def test_exotic_dtypes(fst_pkg, tmp_path, device):
    """F8 through torch's float8 dtypes (F8_E8M0 where torch has
    float8_e8m0fnu, else uint8); F4 with whole bytes a row as
    float4_e2m1fn_x2 where torch has it, as the reference gives it; other F4
    and F6 as uint8 with the last dimension in bytes (else flat), as for
    numpy."""
    rng = np.random.default_rng(2)
    cases = [("e4m3", "F8_E4M3", (4, 3)), ("e5m2", "F8_E5M2", (6,)),
             ("e4m3fnuz", "F8_E4M3FNUZ", (2, 2)), ("e5m2fnuz", "F8_E5M2FNUZ", ()),
             ("e8m0", "F8_E8M0", (3, 2)), ("f4", "F4", (3, 4)), ("f4odd", "F4", (2, 3)),
             ("f6", "F6_E2M3", (2, 4)), ("bf16", "BF16", (3, 3))]
    parts = [(n, d, s, rng.integers(0, 256, tensor_nbytes(d, s), dtype=np.uint8).tobytes())
             for n, d, s in cases]
    p = write_safetensors(tmp_path / "x.safetensors", [("pad", "U8", (1,), b"\x01")] + parts)
    got = fst_pkg.load_file(p, device=device)
    want_dtype = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                  "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
                  "F8_E8M0": "float8_e8m0fnu", "BF16": "bfloat16"}
    shapes = {"f4": (3, 2), "f4odd": (3,), "f6": (2, 3)}
    for name, dtype, shape, raw in parts:
        t = got[name]
        assert t.device == torch.device(device)
        want = getattr(torch, want_dtype.get(dtype, "uint8"), torch.uint8)
        if name == "f4":
            want = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
        assert t.dtype == want, (name, t.dtype)
        assert tuple(t.shape) == shapes.get(name, shape), (name, t.shape)
        assert raw_bytes(t) == raw, name
    # the reference agrees where it knows the dtype
    try:  # the reference may refuse F4 / F6 / E8M0 in the same file
        ref = st_torch.load_file(str(p))
    except Exception:  # noqa: BLE001
        ref = {}
    for name in ("e4m3", "e5m2", "bf16"):
        if name in ref:
            assert raw_bytes(ref[name]) == raw_bytes(got[name]) and ref[name].dtype == got[name].dtype


@pytest.mark.parametrize("device", DEVICES)
def test_safe_open_matches_reference(fst_pkg, ref_file, device):
    p, _ = ref_file
    with ref_safe_open(str(p), framework="pt", device=device) as ref, \
            fst_pkg.safe_open(p, framework="pt", device=device) as f:
        assert f.keys() == ref.keys() and f.metadata() == ref.metadata()
        for name in ref.keys():
            assert_same(f.get_tensor(name), ref.get_tensor(name), name)
            assert f.get_slice(name).get_shape() == ref.get_slice(name).get_shape()
        assert_same(f.get_slice("float32.m")[1:4, 1:], ref.get_slice("float32.m")[1:4, 1:])


@pytest.mark.parametrize("device", DEVICES)
def test_save_file_reference_reads(fst_pkg, tmp_path, device):
    gen = torch.Generator().manual_seed(3)
    tensors = {str(dt).replace("torch.", ""): make(dt, (4, 5), gen).to(device)
               for dt in torch_dtypes()}
    tensors["scalar"] = torch.tensor(1.5, device=device)
    transposed = torch.randn(3, 4, generator=gen).to(device).t()
    p = tmp_path / "fst.safetensors"
    # a strided tensor is refused, as the reference refuses it, and nothing
    # is written; its contiguous copy is saved
    with pytest.raises(ValueError, match="non contiguous tensor: `transposed`"):
        fst_pkg.save_file({**tensors, "transposed": transposed}, p)
    assert not p.exists()
    tensors["transposed"] = transposed.contiguous()
    fst_pkg.save_file(tensors, p, metadata={"k": "v"})
    try:
        ref = st_torch.load_file(str(p))
    except Exception as e:  # noqa: BLE001 - an older reference lacks some dtypes
        pytest.skip(f"reference cannot read every dtype: {e}")
    for name, t in tensors.items():
        want = t.cpu().contiguous()
        assert ref[name].dtype == want.dtype and ref[name].shape == want.shape, name
        assert raw_bytes(ref[name]) == raw_bytes(want), name
    with ref_safe_open(str(p), framework="pt") as f:
        assert f.metadata() == {"k": "v"}


def test_from_dlpack_directly(fst_pkg, ref_file):
    p, tensors = ref_file
    buf = fst_pkg._fst.load(fst_pkg._fst.Checkpoint(str(p)))
    t = torch.from_dlpack(buf.tensor("float32.m"))
    del buf
    gc.collect()
    assert torch.equal(t, tensors["float32.m"])


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_reach_torch_as_capsules(fst_pkg, ref_file, device, monkeypatch):
    """Every tensor of a load reaches torch as a DLPack capsule, so torch does
    not look up the device's current stream for each of them (fst ignores
    the stream: a tensor is handed out only once its bytes have landed)."""
    p, tensors = ref_file
    given, streams = [], []
    real = torch.from_dlpack
    monkeypatch.setattr(torch, "from_dlpack", lambda x, *a, **k: given.append(x) or real(x, *a, **k))
    real_stream = torch.cuda.current_stream
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda *a, **k: streams.append(a) or real_stream(*a, **k))
    got = fst_pkg.load_file(p, device=device)
    got.update(dict(fst_pkg.iter_tensors(p, device=device)))
    assert len(given) == 2 * len(tensors) and \
        {type(x).__name__ for x in given} == {"PyCapsule"}, {type(x) for x in given}
    assert streams == []
    for name, t in tensors.items():
        assert raw_bytes(got[name]) == raw_bytes(t), name


@needs_cuda
def test_iter_tensors_on_cuda(fst_pkg, gen_dir):
    d = gen_dir(shards=3, seed=61, size="8MiB", misaligned=True)
    want = {}
    for f in sorted(d.glob("*.safetensors")):
        want.update(st_torch.load_file(str(f), device="cuda:0"))
    seen = set()
    for name, t in fst_pkg.iter_tensors(d, device="cuda:0"):
        assert name not in seen
        seen.add(name)
        assert_same(t, want[name], name)
    assert seen == set(want)
    for name, t in fst_pkg.iter_tensors(sorted(d.glob("*.safetensors")), device=0,
                                        names=list(want)[:3]):
        assert_same(t, want[name], name)


@needs_cuda
@pytest.mark.parametrize("torch_allocator", [True, False])
def test_torch_allocator_accounting(fst_pkg, tmp_path, torch_allocator):
    """With torch_allocator=True (the default) the device memory of a load
    comes from torch's caching allocator: memory_allocated grows by about
    the checkpoint's size while the tensors live and drops back after; with
    False fst allocates itself and torch sees nothing."""
    size = 64 * MiB
    a = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    p = write_safetensors(tmp_path / "m.safetensors", [
        ("a", "U8", (size // 2,), a[:size // 2].tobytes()),
        ("b", "F32", (size // 8,), a[size // 2:].tobytes())])
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated(0)
    got = fst_pkg.load(p, device="cuda:0", torch_allocator=torch_allocator)
    during = torch.cuda.memory_allocated(0)
    if torch_allocator:
        assert size <= during - before <= size + 4 * MiB, (before, during)
    else:
        assert during - before < MiB, (before, during)
    assert raw_bytes(got["a"]) == a[:size // 2].tobytes()
    keep = got["b"]
    del got
    gc.collect()
    if torch_allocator:
        assert torch.cuda.memory_allocated(0) - before >= size  # one tensor holds it all
    del keep
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(0) - before < MiB


class FakeGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


@pytest.mark.parametrize("device", DEVICES)
def test_fastsafetensors_api(fst_pkg, tmp_path, device):
    from fst import SafeTensorsFileLoader, SingleGroup, fastsafe_open
    gen = torch.Generator().manual_seed(5)
    tensors = {"w.5x4": torch.randn(5, 4, generator=gen), "w.6x3": torch.randn(6, 3, generator=gen),
               "b.7": torch.randn(7, generator=gen).half(), "s": torch.tensor(3)}
    p = str(tmp_path / "m.safetensors")
    st_torch.save_file(tensors, p)
    loader = SafeTensorsFileLoader(SingleGroup(), device, nogds=True)
    loader.add_filenames({0: [p]})
    fb = loader.copy_files_to_device()
    for k in fb.key_to_rank_lidx:
        t = fb.get_tensor(k)
        assert t.device == torch.device(device) and torch.equal(t.cpu(), tensors[k])
        assert fb.get_filename(k) == p
    assert fb.get_tensor("w.5x4", dtype=torch.float16).dtype == torch.float16
    fb.close()
    loader.close()
    # get_sharded for a world of 2: rank r gets [r * ceil(n/2), (r + 1) * ceil(n/2))
    expect = {("w.5x4", 0): [(3, 4), (2, 4)], ("w.5x4", 1): [(5, 2), (5, 2)],
              ("w.6x3", 0): [(3, 3), (3, 3)], ("w.6x3", 1): [(6, 2), (6, 1)],
              ("b.7", 0): [(4,), (3,)], ("w.5x4", -1): [(5, 4), (5, 4)]}
    for rank in (0, 1):
        loader = SafeTensorsFileLoader(FakeGroup(rank, 2), device, nogds=True)
        loader.add_filenames({0: [p]})
        fb = loader.copy_files_to_device()
        for (name, dim), shapes in expect.items():
            t = fb.get_sharded(name, dim)
            assert tuple(t.shape) == shapes[rank], (name, dim, rank, t.shape)
            full = tensors[name]
            if dim == -1:
                assert torch.equal(t.cpu(), full)
            else:
                block = (full.shape[dim] + 1) // 2
                assert torch.equal(t.cpu(), full.narrow(dim, rank * block, shapes[rank][dim]))
        fb.close()
    with fastsafe_open([p], device=device, nogds=True) as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert torch.equal(f.get_tensor("w.6x3").cpu(), tensors["w.6x3"])


def test_unsigned_dtypes_need_torch_support(fst_pkg, tmp_path):
    """U16/U32/U64 map to torch.uint16/32/64 (torch >= 2.3); older torch
    raises UnsupportedError naming the tensor."""
    p = write_safetensors(tmp_path / "u.safetensors", [
        ("u16", "U16", (3,), np.array([1, 2, 65535], np.uint16).tobytes()),
        ("u64", "U64", (2,), np.array([1, 2 ** 64 - 1], np.uint64).tobytes())])
    if not hasattr(torch, "uint16"):
        with pytest.raises(fst_pkg.UnsupportedError, match="u16"):
            fst_pkg.load_file(p)
        return
    got = fst_pkg.load_file(p)
    assert got["u16"].dtype == torch.uint16 and got["u64"].dtype == torch.uint64
    assert raw_bytes(got["u16"]) == np.array([1, 2, 65535], np.uint16).tobytes()
    assert raw_bytes(got["u64"]) == np.array([1, 2 ** 64 - 1], np.uint64).tobytes()
