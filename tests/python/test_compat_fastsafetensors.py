"""fst.compat.fastsafetensors, fastsafetensors 0.5's API over fst: every
public call with one rank, the dtypes (BF16, F8_E8M0 as
torch.float8_e8m0fnu, F4 as torch.float4_e2m1fn_x2 with its last dimension
halved), DType and Device arguments, the options given to fst, errors, and
two ranks over gloo (compat_fs_child.py): each rank reads only the files
registered to it, and broadcast, scattered and pushed tensors are the
reference's bytes (safetensors.torch.load_file)."""
import json
import os
import socket
import subprocess
import sys
from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch", reason="fst.compat.fastsafetensors' tests need torch")
st_torch = pytest.importorskip("safetensors.torch", reason="the reference safetensors is needed")

import fst  # noqa: E402
from fst.compat import fastsafetensors as fs  # noqa: E402
from fst.compat.fastsafetensors import (  # noqa: E402
    FilesBufferOnDevice, ParallelLoader, SafeTensorsFileLoader, SingleGroup, fastsafe_open)
from fst.compat.fastsafetensors.st_types import Device, DeviceType, DType  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def raw(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(got, want):
    return (got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
            and torch.equal(raw(got), raw(want)))


def write_checkpoint(d):
    """Three shards with every kind the tests need: sizes that do and do not
    divide by two, BF16, F8_E8M0, F4, a 0-d and an empty tensor."""
    g = torch.Generator().manual_seed(5)
    f4 = torch.randint(0, 256, (4, 8), dtype=torch.uint8, generator=g)
    e8 = torch.randint(0, 255, (3, 4), dtype=torch.uint8, generator=g)
    shards = [
        {"w.5x3": torch.randn(5, 3, generator=g), "bias.7": torch.randn(7, generator=g).half(),
         "f4.4x16": f4.view(torch.float4_e2m1fn_x2)},
        {"w.4x6": torch.randn(4, 6, generator=g), "e8.3x4": e8.view(torch.float8_e8m0fnu),
         "bf.6x2": torch.randn(6, 2, generator=g).bfloat16(), "scalar": torch.tensor(7.5)},
        {"x.4x6": torch.randn(4, 6, generator=g), "i.3": torch.tensor([1, -2, 3]),
         "empty": torch.zeros(0, 4)},
    ]
    files = []
    for i, tensors in enumerate(shards):
        f = os.path.join(d, f"model-0000{i}.safetensors")
        st_torch.save_file(tensors, f, metadata={"shard": str(i)} if i else None)
        files.append(f)
    ref = {}
    for f in files:
        ref.update(st_torch.load_file(f))
    return files, ref


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("fsckpt")
    files, ref = write_checkpoint(str(d))
    return str(d), files, ref


class Calls(list):
    """(function, file, options) of each fst.load and fst.iter_tensors
    call; `addresses` the data address of each tensor they gave."""
    addresses: dict


@pytest.fixture()
def recorded(monkeypatch):
    calls = Calls()
    calls.addresses = {}
    load, iterate = fst.load, fst.iter_tensors

    def rec_load(path, *a, **kw):
        calls.append(("load", os.path.basename(getattr(path, "path", path)), kw))
        out = load(path, *a, **kw)
        calls.addresses.update({k: v.data_ptr() for k, v in out.items()})
        return out

    def rec_iter(paths, *a, **kw):
        calls.append(("iter", os.path.basename(os.fspath(paths)), kw))
        for name, t in iterate(paths, *a, **kw):
            calls.addresses[name] = t.data_ptr()
            yield name, t

    monkeypatch.setattr(fst, "load", rec_load)
    monkeypatch.setattr(fst, "iter_tensors", rec_iter)
    return calls


# ---------------------------------------------------------------- one rank

def test_module_layout():
    from fst.compat.fastsafetensors import common, file_buffer, frameworks, loader, \
        parallel_loader, st_types, tensor_factory
    assert parallel_loader.ParallelLoader is ParallelLoader
    assert loader.SafeTensorsFileLoader is SafeTensorsFileLoader
    assert file_buffer.FilesBufferOnDevice is FilesBufferOnDevice
    assert common.SingleGroup is SingleGroup and common.TensorFrame is fs.TensorFrame
    assert st_types.DType("F8_E8M0") is DType.F8_E8M0
    assert tensor_factory.LazyTensorFactory.__name__ == "LazyTensorFactory"
    assert frameworks.get_framework_op("pytorch").get_name() == "pytorch"
    from fst.compat.fastsafetensors.frameworks._torch import dtype_convert
    assert dtype_convert[DType.F4] is torch.float4_e2m1fn_x2
    assert fs.get_device_numa_node(None) is None
    assert fs.__version__ == "0.5.0"


def test_loader_single_rank(ckpt, recorded):
    d, files, ref = ckpt
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: [files[2], files[0], files[1]]})
    # registration order, each file in data-offset order, as fastsafetensors
    want_keys = [k for f in (files[2], files[0], files[1])
                 for k in fs.SafeTensorsMetadata.from_file(f, None).tensors]
    assert loader.get_keys() == want_keys and sorted(want_keys) == sorted(ref)
    assert loader.get_shape("f4.4x16") == [4, 16]  # F4 values, not bytes
    assert recorded == []  # registering reads headers only
    fb = loader.copy_files_to_device()
    assert [c[1] for c in recorded] == [os.path.basename(f) for f in files]  # sorted paths
    assert fb.key_to_rank_lidx["w.5x3"] == (0, 0) and fb.key_to_rank_lidx["i.3"] == (0, 2)
    for name, want in ref.items():
        t = fb.get_tensor(name)
        assert same(t, want), name
        assert fb.get_tensor(tensor_name=name) is t  # one rank: a view, the same each time
        assert fb.get_filename(name) == next(f for f in files
                                             if name in st_torch.load_file(f))
    f4 = fb.get_tensor("f4.4x16")
    assert f4.dtype == torch.float4_e2m1fn_x2 and tuple(f4.shape) == (4, 8)
    assert fb.get_tensor("e8.3x4").dtype == torch.float8_e8m0fnu
    assert fb.get_tensor("bf.6x2").dtype == torch.bfloat16
    assert fb.get_shape("f4.4x16") == [4, 16] and fb.get_shape("scalar") == []
    assert fb.get_tensor_wrapped("f4.4x16").get_shape() == [4, 16]
    # a group of one: every dim is the whole tensor, as in fastsafetensors
    assert same(fb.get_sharded("w.5x3", 0), ref["w.5x3"])
    cols = fb.get_multi_cols(["w.4x6", "x.4x6"], dim=1).get_raw()  # wrapped, as fastsafetensors
    assert same(cols, torch.cat([ref["w.4x6"], ref["x.4x6"]], 1))
    assert same(fb.push_tensor("bias.7", 0), ref["bias.7"])
    parts = fb.as_dict(OrderedDict([("w.5x3", 0), ("i.3", -1)]))
    assert same(parts["w.5x3"].get_raw(), ref["w.5x3"]) and same(parts["i.3"].get_raw(), ref["i.3"])
    assert dict(fb.iter_local_tensors(["i.3"]))["i.3"] is fb.get_tensor("i.3")
    assert fb.get_filename("no.such") == ""
    kept = fb.get_tensor("w.4x6")
    fb.close()
    assert same(kept, ref["w.4x6"])  # outlives the buffer
    with pytest.raises(KeyError):
        fb.get_tensor("w.4x6")
    loader.reset()
    assert loader.get_keys() == []
    loader.close()


def test_header_model_filter_and_memory(ckpt):
    """SafeTensorsMetadata from a file, a descriptor and host memory;
    TensorFrame slicing; set_tensor_filter; get_mem_used."""
    import ctypes
    d, files, ref = ckpt
    op = fs.frameworks.get_framework_op("pytorch")
    meta = fs.SafeTensorsMetadata.from_file(files[1], op)
    assert meta.metadata == {"shard": "1"} and meta.src == files[1]
    assert sorted(meta.tensors) == sorted(st_torch.load_file(files[1]))
    offsets = [t.data_offsets for t in meta.tensors.values()]
    assert offsets == sorted(offsets) and offsets[0][0] == 0
    assert meta.tensors["bf.6x2"].dtype == DType.BF16 and meta.tensors["scalar"].shape == []
    blob = open(files[1], "rb").read()
    buf = ctypes.create_string_buffer(blob, len(blob))
    mem = fs.SafeTensorsMetadata.from_buffer(ctypes.addressof(buf), len(blob), "mem", op)
    with open(files[1], "rb") as f:
        fd_meta = fs.SafeTensorsMetadata.from_fd(f.fileno(), files[1], op)
    assert repr(mem.tensors) == repr(fd_meta.tensors) == repr(meta.tensors)
    assert mem.header_length == meta.header_length == 8 + int.from_bytes(blob[:8], "little")
    with pytest.raises(fst.FormatError, match="HeaderTooSmall"):
        fs.SafeTensorsMetadata.from_buffer(ctypes.addressof(buf), 4, "mem", op)
    with pytest.raises(fst.FormatError, match="InvalidOffset"):
        fs.SafeTensorsMetadata('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
                               8, 100, op)

    frame = fs.TensorFrame(DType.F32, [5, 6], [0, 120], [6, 1], [0, 0], False)
    sub = frame[1:-1, ::2]
    assert (sub.shape, sub.offsets, sub.strides, sub.sliced) == ([3, 3], [1, 0], [6, 2], True)
    assert frame[-1].offsets == [4, 0] and frame[4:1].shape == []
    with pytest.raises(IndexError):
        frame[5]

    loader = SafeTensorsFileLoader(SingleGroup(), "cpu")
    loader.add_filenames({0: files})
    loader.set_tensor_filter(lambda n: n.startswith("w."))
    assert sorted(loader.get_keys()) == ["w.4x6", "w.5x3"]
    assert op.get_mem_used() == 0
    fb = loader.copy_files_to_device()
    assert sorted(fb.key_to_rank_lidx) == ["w.4x6", "w.5x3"]
    assert op.get_mem_used() == ref["w.4x6"].nbytes + ref["w.5x3"].nbytes
    with pytest.raises(ValueError):
        fb.get_tensor("bias.7")  # filtered out: not registered, not read
    fb.close()
    assert op.get_mem_used() == 0


def ranks_of(world):
    """A group class of world ranks with rank() and size() alone (no
    collectives): Group(r) is rank r of it."""
    class Group:
        def __init__(self, rank):
            self.r = rank

        def rank(self):
            return self.r

        def size(self):
            return world
    return Group


def test_f4_sharding_rules(ckpt):
    """get_native_slices halves F4 bounds and refuses odd ones, as
    fastsafetensors' torch framework does."""
    op = fs.frameworks.get_framework_op("pt")
    assert op.get_native_shape(DType.F4, [8, 16]) == [8, 8]
    assert op.get_native_shape(DType.F4, [16]) == [8]
    assert op.get_native_slices(DType.F4, [8, 16], (slice(None), slice(4, 12, 1))) == \
        (slice(None), slice(2, 6, 1))
    with pytest.raises(ValueError):
        op.get_native_shape(DType.F4, [8, 15])
    with pytest.raises(ValueError):
        op.get_native_slices(DType.F4, [8, 16], (slice(None), slice(3, 12, 1)))


def test_f4_sharding_odd_block_names_the_tensor(tmp_path):
    """An F4 tensor cut along its last dimension where a rank's block
    starts or ends mid-byte: a UsageError naming the tensor, its file, the
    shape, the ranks and the rule, on every rank (rank 2's own block, values
    [6, 8), is whole bytes), so that all refuse it alike."""
    f = str(tmp_path / "f4.safetensors")
    g = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (5, 4), dtype=torch.uint8, generator=g)
    st_torch.save_file({"f4.5x8": packed.view(torch.float4_e2m1fn_x2)}, f)

    Group = ranks_of(3)

    for rank in range(3):
        loader = SafeTensorsFileLoader(Group(rank), "cpu")
        loader.add_filenames({0: [f]})
        fb = loader.copy_files_to_device()
        with pytest.raises(fst.UsageError) as ei:
            fb.get_sharded("f4.5x8", 1)
        assert str(ei.value) == (
            f"tensor f4.5x8 of {f}: F4 [5, 8] cannot be sharded along dim 1 over 3 ranks: "
            "rank 0's block is values [0, 3), and bounds must be even: a byte holds two F4 "
            "values")
        # dim 0 cuts whole rows: fine
        want = packed[[0, 1]] if rank == 0 else packed[2:4] if rank == 1 else packed[4:]
        assert same(fb.get_sharded("f4.5x8", 0), want.view(torch.float4_e2m1fn_x2))


def test_failed_conversion_leaves_mem_used(ckpt):
    """A copy_files_to_device whose dtype conversion fails takes back what
    it counted in get_mem_used, and no more."""
    d, files, ref = ckpt
    op = fs.frameworks.get_framework_op("pytorch")
    before = op.get_mem_used()
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: [files[2]]})
    with pytest.raises(fst.UnsupportedError, match=r"cannot convert \w+ to F4"):
        loader.copy_files_to_device(dtype=DType.F4)
    assert op.get_mem_used() == before
    fb = loader.copy_files_to_device()
    assert op.get_mem_used() == before + sum(ref[k].nbytes for k in ("x.4x6", "i.3", "empty"))
    fb.close()
    assert op.get_mem_used() == before


def test_dtype_and_device_arguments(ckpt):
    d, files, ref = ckpt
    loader = SafeTensorsFileLoader(None, Device(DeviceType.CPU), nogds=True)
    assert loader.device == Device(DeviceType.CPU, None)
    loader.add_filenames({0: [files[2]]})
    fb = loader.copy_files_to_device(dtype=DType.F16)
    for name in ("x.4x6", "i.3"):  # every tensor converts, integers too, as fastsafetensors does
        assert same(fb.get_tensor(name), ref[name].to(torch.float16)), name
    fb = loader.copy_files_to_device(dtype=torch.float64)  # a torch dtype is taken too
    assert same(fb.get_tensor("x.4x6"), ref["x.4x6"].double())
    fb = loader.copy_files_to_device()
    assert same(fb.get_tensor("x.4x6", dtype=DType.BF16), ref["x.4x6"].bfloat16())
    assert same(fb.get_tensor("x.4x6", dtype=torch.float16), ref["x.4x6"].half())
    assert same(fb.get_tensor("x.4x6", dtype="F64"), ref["x.4x6"].double())
    assert same(fb.get_sharded("x.4x6", 0, device=Device.from_str("cpu"), dtype=DType.F16),
                ref["x.4x6"].half())
    assert fb.get_tensor("x.4x6", device="cpu") is fb.get_tensor("x.4x6")
    assert fb.get_tensor("x.4x6", device=torch.device("cpu")).device.type == "cpu"
    for bad, match in (("aaaa:0", "Unknown device type: aaaa"), ("cpu:-xx", "Invalid index: -xx")):
        with pytest.raises(ValueError, match=match):
            Device.from_str(bad)
    assert Device.from_str("cuda:4") == Device(DeviceType.CUDA, 4)
    assert Device.from_str("cuda:4").as_str() == "cuda:4"


def test_fst_options(ckpt, recorded):
    """nogds -> gds="off", else "auto"; max_threads reader threads;
    bbuf_size_kb a bounce buffer a thread -> staging bytes, except that
    fastsafetensors' defaults (16 MiB, 16 threads) mean fst's (0, 0); fst
    options in **kwargs pass through."""
    d, files, ref = ckpt
    for kwargs, want in (
            (dict(nogds=True), dict(gds="off", threads=0, staging_bytes=0)),
            (dict(), dict(gds="auto", threads=0, staging_bytes=0)),
            (dict(max_threads=8), dict(gds="auto", threads=8, staging_bytes=128 << 20)),
            (dict(bbuf_size_kb=1024), dict(gds="auto", threads=16, staging_bytes=16 << 20)),
            (dict(max_threads=4, bbuf_size_kb=1024, io="pread"),
             dict(gds="auto", threads=4, staging_bytes=4 << 20, io="pread"))):
        recorded.clear()
        loader = SafeTensorsFileLoader(SingleGroup(), "cpu", **kwargs)
        loader.add_filenames({0: [files[0]]})
        fb = loader.copy_files_to_device()
        assert same(fb.get_tensor("w.5x3"), ref["w.5x3"])
        (_, name, kw), = recorded
        assert name == os.path.basename(files[0])
        assert {k: kw.get(k) for k in want} == want, kw


def test_fastsafe_open(ckpt):
    d, files, ref = ckpt
    with fastsafe_open(files[0], nogds=True) as f:
        assert f.metadata() == {files[0]: ""}  # no __metadata__: "", as fastsafetensors
        assert f.keys() == list(fs.SafeTensorsMetadata.from_file(files[0], None).tensors)
        kept = f.get_tensor("w.5x3")
        assert same(f.get_tensor_wrapped("bias.7").get_raw(), ref["bias.7"])
        assert f.get_filename("w.5x3") == files[0]  # the buffer's methods, through f
    assert same(kept, ref["w.5x3"])
    for spec in (files, {0: files}, tuple(files)):
        with fastsafe_open(spec, framework="pt", device="cpu") as f:
            assert sorted(f.keys()) == sorted(ref)
            assert f.metadata() == {files[0]: "", files[1]: {"shard": "1"},
                                    files[2]: {"shard": "2"}}
            for k in f.keys():
                assert same(f.get_tensor(k), ref[k]), k


def test_parallel_loader_single_rank(ckpt, recorded):
    d, files, ref = ckpt
    pl = ParallelLoader(SingleGroup(), files, queue_size=0, use_tqdm_on_load=False,
                        device="cpu", nogds=False)
    got = {}
    for name, t in pl.iterate_weights():
        assert name not in got
        got[name] = t
    pl.close()
    assert sorted(got) == sorted(ref)
    for name, t in got.items():
        assert same(t, ref[name]), name
        # a view of fst's load of its file, no copy (fastsafetensors clones:
        # its buffers are freed at close, fst's live while a view does)
        assert t.nbytes == 0 or t.data_ptr() == recorded.addresses[name], name
    assert [c[1] for c in recorded] == [os.path.basename(f) for f in files]
    assert all(c[2]["gds"] == "auto" for c in recorded)

    # borrowed: views of fst's loads, no copy
    pl = ParallelLoader(None, files[:1], use_tqdm_on_load=False, borrowed_tensors=True,
                        accumulate_resident=False)
    views = dict(pl.iterate_weights())
    for name, t in views.items():
        assert same(t, ref[name]) and t.data_ptr() == recorded.addresses[name], name

    # tensor_filter: the others are not read at all (fst's names=)
    recorded.clear()
    pl = ParallelLoader(SingleGroup(), files, use_tqdm_on_load=False,
                        tensor_filter=lambda n: n.startswith("w."), all_local=True)
    got = dict(pl.iterate_weights())
    assert sorted(got) == ["w.4x6", "w.5x3"]
    assert [sorted(c[2]["names"]) for c in recorded] == [["w.5x3"], ["w.4x6"]]

    # max_batch_bytes: each file in chunks of at most that span
    recorded.clear()
    pl = ParallelLoader(SingleGroup(), files[1:2], use_tqdm_on_load=False, max_batch_bytes=96)
    got = dict(pl.iterate_weights())
    assert sorted(got) == sorted(st_torch.load_file(files[1]))
    assert all(same(t, ref[n]) for n, t in got.items())
    assert len(recorded) > 1 and sorted(n for c in recorded for n in c[2]["names"]) == sorted(got)

    # leaving early stops the load; what was yielded stays valid
    pl = ParallelLoader(SingleGroup(), files, use_tqdm_on_load=False)
    it = pl.iterate_weights()
    name, first = next(it)
    it.close()
    pl.close()
    assert same(first, ref[name])


def test_vllm_call_pattern(ckpt):
    """vLLM 0.33's fastsafetensors_weights_iterator, with the import changed
    (and the CPU for its "cuda:N"): keyword arguments as it passes them, and
    its retry on a RuntimeError naming gds, which fst never raises."""
    from fst.compat.fastsafetensors import SingleGroup as SG
    from fst.compat.fastsafetensors.parallel_loader import ParallelLoader as PL
    d, files, ref = ckpt
    pg = torch.distributed.group.WORLD if torch.distributed.is_initialized() else SG()

    def weights():
        pl = PL(pg=pg, hf_weights_files=sorted(files), queue_size=0, use_tqdm_on_load=False,
                device=str(torch.device("cpu")), nogds=pg.size() > 1)
        try:
            for name, tensor in pl.iterate_weights():
                yield name, tensor
        except RuntimeError as e:
            assert "gds" not in str(e)
            raise
        finally:
            pl.close()

    got = {}
    for name, t in weights():
        got[name] = t.clone()  # what a model's weight_loader does: copy, then drop
    assert sorted(got) == sorted(ref) and all(same(got[k], ref[k]) for k in ref)


def test_local_group_reads_every_file(ckpt, recorded):
    """A group that is no torch.distributed group (rank() and size() only)
    cannot exchange tensors: each rank reads every file and cuts its own
    shards, with fastsafetensors' cut."""
    d, files, ref = ckpt

    Group = ranks_of(2)

    for rank in (0, 1):
        recorded.clear()
        loader = SafeTensorsFileLoader(Group(rank), "cpu")
        loader.add_filenames({0: files[:2], 1: files[2:]})
        fb = loader.copy_files_to_device()
        assert sorted(c[1] for c in recorded) == sorted(os.path.basename(f) for f in files)
        assert fb.key_to_rank_lidx["x.4x6"] == (1, 0)
        w = ref["w.5x3"]
        assert same(fb.get_sharded("w.5x3", 0), w[[0, 1, 2]] if rank == 0 else w[3:5])
        assert same(fb.get_tensor("x.4x6"), ref["x.4x6"])
        assert (fb.push_tensor("i.3", 1) is None) == (rank == 0)


def test_errors(ckpt, tmp_path):
    d, files, ref = ckpt
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu")
    with pytest.raises(fst.FileError):
        loader.add_filenames({0: [str(tmp_path / "missing.safetensors")]})
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}")
    with pytest.raises(fst.FormatError):
        loader.add_filenames({0: [str(bad)]})
    loader.add_filenames({0: [files[0]]})
    with pytest.raises(KeyError):
        loader.get_shape("no.such")
    fb = loader.copy_files_to_device()
    for call in (lambda: fb.get_tensor("no.such"), lambda: fb.get_shape("no.such"),
                 lambda: fb.get_sharded("no.such", 0)):
        with pytest.raises(ValueError, match="no.such"):  # fastsafetensors' ValueError ...
            call()
        with pytest.raises(KeyError):  # ... and fst's earlier KeyError
            call()
    with pytest.raises(fst.UnsupportedError, match="cannot convert F4"):
        loader.copy_files_to_device(dtype=DType.F16)
    # the same name in two files
    twin = tmp_path / "twin.safetensors"
    st_torch.save_file({"w.5x3": torch.zeros(1)}, str(twin))
    loader.add_filenames({0: [str(twin)]})
    with pytest.raises(fst.UsageError, match="must be unique"):
        loader.copy_files_to_device()
    with pytest.raises(fst.UsageError, match="Unknown framework name"):
        SafeTensorsFileLoader(None, "cpu", framework="paddle")
    with pytest.raises(fst.UsageError, match="pg"):
        SafeTensorsFileLoader(0, "cpu")
    with pytest.raises(fst.UsageError, match="max_concurrent_producers"):
        ParallelLoader(None, files, max_concurrent_producers=2)
    with pytest.raises(fst.UsageError, match="max_batch_bytes=8"):
        list(ParallelLoader(None, files[:1], max_batch_bytes=8,
                            use_tqdm_on_load=False).iterate_weights())
    from fst.compat.fastsafetensors.copier.gds import GdsFileCopier
    with pytest.raises(fst.UnsupportedError, match="internal machinery"):
        GdsFileCopier()


def test_numpy_framework(ckpt):
    """An fst extension kept from its earlier face: framework='numpy'."""
    np = pytest.importorskip("numpy")
    d, files, ref = ckpt
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", framework="numpy")
    loader.add_filenames({0: files[2:]})
    fb = loader.copy_files_to_device()
    a = fb.get_tensor("x.4x6")
    assert isinstance(a, np.ndarray) and a.tobytes() == raw(ref["x.4x6"]).numpy().tobytes()
    assert fb.get_tensor("i.3", dtype=np.float32).tolist() == [1.0, -2.0, 3.0]
    pl = ParallelLoader(None, files, framework="numpy", use_tqdm_on_load=False)
    got = dict(pl.iterate_weights())
    assert sorted(got) == sorted(ref)
    assert all(isinstance(v, np.ndarray) and v.tobytes() == raw(ref[k]).numpy().tobytes()
               for k, v in got.items())
    with pytest.raises(fst.UsageError, match="numpy arrays live on the CPU"):
        SafeTensorsFileLoader(None, "cuda:0", framework="numpy")


# ---------------------------------------------------------------- two ranks

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario, d, tmp_path, world=2, timeout=90):
    port = free_port()
    env = dict(os.environ)
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"{scenario}-{rank}.json"
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "compat_fs_child.py"), scenario, str(rank),
             str(world), str(port), d, str(out)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{scenario}: a rank hung (no answer in {timeout} s)")
    results = []
    for out, log, p in zip(outs, logs, procs):
        assert out.exists(), f"{scenario}: rank wrote nothing (exit {p.returncode}):\n{log}"
        r = json.loads(out.read_text())
        assert "error" not in r, r["error"]
        assert r["failures"] == [], r["failures"]
        results.append(r)
    return results


def test_two_ranks_loader(ckpt, tmp_path):
    d, files, ref = ckpt
    r0, r1 = run_ranks("loader", d, tmp_path)
    # each rank read its own files and nothing else (three buffers were made)
    assert sorted(r0["reads"]) == ["model-00000.safetensors"] * 3 + ["model-00001.safetensors"] * 3
    assert r1["reads"] == ["model-00002.safetensors"] * 3
    assert r0["owners"] == r1["owners"]
    assert r0["owners"]["w.5x3"] == [0, 0] and r0["owners"]["w.4x6"] == [0, 1]
    assert r0["owners"]["x.4x6"] == [1, 0]


def test_two_ranks_parallel_loader(ckpt, tmp_path):
    d, files, ref = ckpt
    r0, r1 = run_ranks("parallel", d, tmp_path)
    # files go two a batch, one a rank: rank 0 reads 0 and 2, rank 1 reads 1 (three runs)
    assert r0["reads"] == ["model-00000.safetensors", "model-00002.safetensors"] * 3
    assert r1["reads"] == ["model-00001.safetensors"] * 3
    assert r0["runs"] == r1["runs"] == [len(ref)] * 3


def test_two_ranks_error_on_one_rank_fails_both(ckpt, tmp_path):
    d, files, ref = ckpt
    r0, r1 = run_ranks("error", d, tmp_path)
    for r in (r0, r1):
        assert [e[0] if e else None for e in r["errors"]] == ["FileError", "FileError"]
    assert all("injected on rank 1" in e[1] for e in r1["errors"])
    assert all("rank 1 failed to load its files" in e[1] and "injected" in e[1]
               for e in r0["errors"])


def test_two_ranks_dtype_check_on_one_rank_fails_both(ckpt, tmp_path):
    """The header check (numpy without ml_dtypes) fails on the owner of the
    BF16 file only: the other rank raises the same class naming rank 0,
    instead of waiting for it."""
    d, files, ref = ckpt
    r0, r1 = run_ranks("dtypes_one_rank", d, tmp_path, timeout=40)
    (e0,), (e1,) = r0["errors"], r1["errors"]
    assert e0 and e0[0] == "MissingDependencyError" and "needs ml_dtypes" in e0[1], e0
    assert e1 and e1[0] == "MissingDependencyError", e1
    assert e1[1].startswith("rank 0 failed to load its files: ") and "needs ml_dtypes" in e1[1]
    assert e0[2] == e1[2] == "ml_dtypes", (e0, e1)  # what to install, on both


def test_two_ranks_push_keeps_the_file(ckpt, tmp_path):
    """A push counts toward no release, on any rank: after every tensor of
    a file was pushed, get_tensor of each works on both ranks; after each
    went out by get_tensor, both refuse the file."""
    d, files, ref = ckpt
    for r in run_ranks("push", d, tmp_path, timeout=40):
        *gets, last = r["errors"]
        assert gets == [None, None, None], gets
        assert last and last[0] == "UsageError" and "released" in last[1], last


def test_two_ranks_comm_without_nccl_on_rank_0(ckpt, tmp_path):
    """fst.Comm where rank 0 cannot make the NCCL id: rank 0 raises its
    error, rank 1 the same class naming rank 0 and the cause."""
    d, files, ref = ckpt
    r0, r1 = run_ranks("comm_no_nccl", d, tmp_path, timeout=40)
    (e0,), (e1,) = r0["errors"], r1["errors"]
    assert e0 and e0[0] == "UnsupportedError" and "no-such-libnccl" in e0[1], e0
    assert e1 and e1[0] == e0[0], e1
    assert e1[1] == "rank 0 of the group could not make the NCCL id: " + e0[1]
