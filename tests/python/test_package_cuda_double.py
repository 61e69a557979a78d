"""GPU loads through the libcuda test double (tests/doubles/cuda_double.c):
its "device memory" is host memory that only the driver API may touch, so
numpy cannot view it, but Tensor.tobytes() copies it back through
cuMemcpyDtoH. The driver is loaded once per process, so each test runs its
checks in a fresh interpreter with FST_CUDA_LIBRARY set (fixture
run_python); the child asserts, the parent reports its traceback."""
import json

import numpy as np
import pytest

import fsttest
from fsttest import Header, file_bytes, write_safetensors


def io_numbers():
    """_fst.load's io numbers of the readers the loads go through: auto, pread
    and, where it loads, uring."""
    return tuple({"auto": 0, "pread": 1, "uring": 2}[io]
                 for io in fsttest.io_cases("auto", "pread", "uring"))


@pytest.fixture(scope="module")
def files(tmp_path_factory, gen_dir):
    rng = np.random.default_rng(12)
    d = tmp_path_factory.mktemp("cu")
    parts = [("pad", "U8", (3,), b"\x07\x08\x09"),
             ("w", "F32", (33, 17), rng.standard_normal((33, 17)).astype(np.float32).tobytes()),
             ("s", "F64", (), np.float64(2.5).tobytes()),
             ("e", "I16", (0, 3), b""),
             ("bf", "BF16", (4, 4), rng.integers(0, 1 << 16, 16, dtype=np.uint16).tobytes()),
             ("f8", "F8_E4M3", (5,), bytes(range(5)))]
    single = write_safetensors(d / "one.safetensors", parts, metadata={"format": "pt"})
    sharded = gen_dir(shards=2, seed=51, size="2MiB", misaligned=True)
    return str(single), str(sharded)


def expected(path):
    from pathlib import Path
    p = Path(path)
    out = {}
    for f in (sorted(p.glob("*.safetensors")) if p.is_dir() else [p]):
        h, blob = Header(f), file_bytes(f)
        for name, info in h.tensors.items():
            b, e = info["data_offsets"]
            out[name] = [info["dtype"], info["shape"], blob[h.data_offset + b:h.data_offset + e].hex()]
    return out


def run_cuda(run_python, cuda_double, code, **env):
    r = run_python(code, env={"FST_CUDA_LIBRARY": cuda_double, **env})
    assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout


PRELUDE = """
import gc, json, sys
import numpy as np
import fst
_fst = fst._fst
"""


def want_file(tmp_path, path, name="want.json"):
    """expected(path) saved as JSON for a child to read (too big for argv)."""
    f = tmp_path / name
    f.write_text(json.dumps(expected(path)))
    return str(f)


def test_low_level_load_to_cuda(run_python, cuda_double, files, tmp_path):
    single, sharded = files
    w1, w2 = want_file(tmp_path, single, "1.json"), want_file(tmp_path, sharded, "2.json")
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
for path, wf in (({single!r}, {w1!r}), ({sharded!r}, {w2!r})):
    want = json.load(open(wf))
    ck = _fst.Checkpoint(path)
    for dev, devid in (("cuda:0", 0), ("cuda:1", 1), ("cuda", 0)):
        for io in {io_numbers()!r}:
            buf = _fst.load(ck, device=dev, io=io)
            assert sorted(buf.names()) == sorted(want)
            assert "GPU" in buf.describe() or "cuda" in buf.describe(), buf.describe()
            for name, (dtype, shape, hexbytes) in want.items():
                t = buf.tensor(name)
                assert t.device == f"cuda:{{devid}}", t.device
                assert t.__dlpack_device__() == (2, devid)
                assert (t.dtype, list(t.shape)) == (dtype, shape)
                assert t.data_ptr % 256 == 0
                assert t.tobytes().hex() == hexbytes, (name, dev, io)
            # tensors outlive their buffer and checkpoint objects
            t = buf.tensor(name)
            del buf
            gc.collect()
            assert t.tobytes().hex() == hexbytes
print("ok")
""")
    assert out.strip() == "ok"


def test_streaming_to_cuda(run_python, cuda_double, files, tmp_path):
    single, sharded = files
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
want = json.load(open({want_file(tmp_path, sharded)!r}))
ck = _fst.Checkpoint({sharded!r})
loader = _fst.start(ck, device="cuda:0", threads=2)
seen = {{}}
while True:
    t = loader.next()
    if t is None:
        break
    assert t.name not in seen
    seen[t.name] = t
done, total = loader.progress()
assert done == total == sum(len(v[2]) // 2 for v in want.values()), (done, total)
buf = loader.finish()
del loader, ck, buf
gc.collect()
assert sorted(seen) == sorted(want)
for name, t in seen.items():
    assert t.tobytes().hex() == want[name][2], name
print("ok")
""")
    assert out.strip() == "ok"



def test_unified_memory_to_cuda(run_python, cuda_double, files, tmp_path):
    """On an integrated GPU (the double as a GB10) a load is one copy into
    mapped host memory: CUDA tensors (DLPack device 2) at device addresses,
    bytes equal to the file, and the mapped block unmapped when the last
    tensor goes; unified=2 (off) takes the discrete path."""
    single, sharded = files
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
import ctypes
dbl = ctypes.CDLL({cuda_double!r})
want = json.load(open({want_file(tmp_path, sharded)!r}))
ck = _fst.Checkpoint({sharded!r})
for io in {io_numbers()!r}:
    buf = _fst.load(ck, device="cuda:0", io=io)
    assert "unified memory" in buf.describe(), buf.describe()
    assert dbl.fst_double_live_mapped() == 1
    ts = {{n: buf.tensor(n) for n in buf.names()}}
    del buf
    gc.collect()
    for name, t in ts.items():
        assert t.device == "cuda:0" and t.__dlpack_device__() == (2, 0)
        assert t.data_ptr % 256 == 0
        assert dbl.fst_double_is_mapped_device(ctypes.c_void_p(t.data_ptr)) or t.tobytes() == b""
        assert t.tobytes().hex() == want[name][2], name
    assert dbl.fst_double_live_mapped() == 1
    del ts, t
    gc.collect()
    assert dbl.fst_double_live_mapped() == 0
buf = _fst.load(ck, device="cuda:0", unified=2)
assert "pinned staging" in buf.describe() and "unified=off" in buf.describe(), buf.describe()
assert dbl.fst_double_live_mapped() == 0
# the torch allocator is left out exactly where the load is unified
from fst._load import _unified
assert _unified({{"device": "cuda:0"}}) and _unified({{"device": "cuda"}})
assert not _unified({{"device": "cuda:0", "unified": 2}})
print("ok")
""", FST_DOUBLE_PLATFORM="integrated")
    assert out.strip() == "ok"

def test_unified_memory_as_numpy(run_python, cuda_double, files, tmp_path):
    """On an integrated GPU a unified-memory load may hand out numpy arrays:
    views of the mapped block as the CPU sees it (no copy), bytes equal to
    the file, from fst.load and iter_tensors; the block is unmapped when the
    last array goes. With unified="off" (device memory) numpy is refused."""
    single, sharded = files
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
import ctypes
dbl = ctypes.CDLL({cuda_double!r})
want = json.load(open({want_file(tmp_path, sharded)!r}))
for how in ("load", "iter"):
    if how == "load":
        d = fst.load({sharded!r}, device="cuda:0", framework="numpy")
    else:
        d = dict(fst.iter_tensors({sharded!r}, device="cuda:0", framework="numpy"))
    assert set(d) == set(want), how
    assert dbl.fst_double_live_mapped() == 1
    for name, a in d.items():
        assert isinstance(a, np.ndarray), (how, name, type(a))
        assert list(a.shape) == want[name][1], (how, name)
        assert a.tobytes().hex() == want[name][2], (how, name)
        if a.nbytes:
            host = a.__array_interface__["data"][0]
            assert not dbl.fst_double_is_mapped_device(ctypes.c_void_p(host)), name
    keep = next(iter(d.values()))
    del d, a
    gc.collect()
    assert dbl.fst_double_live_mapped() == 1  # one array still holds the block
    del keep
    gc.collect()
    assert dbl.fst_double_live_mapped() == 0, how
try:
    fst.load({sharded!r}, device="cuda:0", framework="numpy", unified="off")
except fst.UsageError as e:
    assert "numpy arrays live on the CPU" in str(e), e
else:
    raise AssertionError("numpy from device memory")
t = _fst.load(_fst.Checkpoint({single!r}), device="cuda:0", unified=2).tensor("w")
try:
    t.host_view()
except fst.UsageError as e:
    assert "the CPU has no view of it" in str(e), e
else:
    raise AssertionError("a host view of device memory")
print("ok")
""", FST_DOUBLE_PLATFORM="integrated")
    assert out.strip() == "ok"


def test_numpy_framework_refuses_cuda(run_python, cuda_double, files):
    """framework='numpy' with a GPU target raises the documented UsageError
    before anything is loaded, from every entry point; GPU tensors are not
    importable by numpy."""
    single, _ = files
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
calls = [
    lambda: fst.load({single!r}, device="cuda:0", framework="numpy"),
    lambda: fst.load_file({single!r}, "cuda:0", framework="numpy"),
    lambda: fst.load_file({single!r}, 0, framework="numpy"),
    lambda: fst.safe_open({single!r}, framework="numpy", device="cuda:1"),
    lambda: next(fst.iter_tensors({single!r}, device="cuda", framework="numpy")),
    lambda: fst.fastsafe_open({single!r}, framework="numpy", device="cuda:0"),
]
for call in calls:
    try:
        call()
    except fst.UsageError as e:
        assert "numpy arrays live on the CPU" in str(e), e
    else:
        raise AssertionError("no error")
t = _fst.load(_fst.Checkpoint({single!r}), device="cuda:0").tensor("w")
try:
    np.from_dlpack(t)
except (RuntimeError, BufferError, ValueError, TypeError) as e:
    print("numpy refuses:", type(e).__name__)
else:
    raise AssertionError("numpy imported device memory")
try:
    t.__dlpack__(dl_device=(1, 0))
except BufferError as e:
    assert "not (1, 0)" in str(e)
print("ok")
""")
    assert out.strip().endswith("ok"), out


def test_cuda_errors(run_python, cuda_double, files):
    single, _ = files
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
ck = _fst.Checkpoint({single!r})
for dev in ("cuda:2", "cuda:9"):
    try:
        _fst.load(ck, device=dev)
    except fst.DeviceError as e:
        assert "out of range (2 devices)" in str(e), e
    else:
        raise AssertionError(dev)
print("ok")
""")
    assert out.strip() == "ok"
    # device memory too small: DeviceError naming the device and the size
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
try:
    _fst.load(_fst.Checkpoint({single!r}), device="cuda:0")
except fst.DeviceError as e:
    print("DeviceError", e.code, e)
""", FST_DOUBLE_MEM="1000")
    assert out.startswith("DeviceError -5 cuda:0: cannot allocate"), out
    # a copy failing mid-load: DeviceError naming the file; the process goes on
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
try:
    _fst.load(_fst.Checkpoint({single!r}), device="cuda:0", chunk_bytes=4096)
except fst.DeviceError as e:
    print("DeviceError", e)
b = _fst.load(_fst.Checkpoint({single!r}), device="cuda:0")
print(len(b))
""", FST_FAULT="h2d:1")
    lines = out.splitlines()
    assert lines[0].startswith("DeviceError ") and "one.safetensors" in lines[0], out
    assert lines[1] == "6"


def test_no_driver(run_python, files):
    single, _ = files
    r = run_python(f"""
import fst
try:
    fst._fst.load(fst._fst.Checkpoint({single!r}), device="cuda:0")
except fst.DeviceError as e:
    print("DeviceError", e)
""", env={"FST_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("DeviceError no CUDA driver"), r.stdout


def test_allocator_bridge_on_cuda(run_python, cuda_double, files, tmp_path):
    """A caller's allocator for device memory (what torch_allocator=True
    plugs torch's caching allocator into): called once per load with the
    device, freed once when the last tensor goes. The allocator here calls
    the double's own cuMemAlloc through ctypes (the double checks that every
    copy lands inside one of its allocations)."""
    single, _ = files
    out = run_cuda(run_python, cuda_double, PRELUDE + f"""
import ctypes
want = json.load(open({want_file(tmp_path, single)!r}))
cu = ctypes.CDLL({cuda_double!r})  # the same handle fst dlopen()ed
blocks, calls = {{}}, []
def alloc(size, align, device_type, device_id):
    calls.append(("alloc", size, align, device_type, device_id))
    ctx, p = ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device_id) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) == 0
    blocks[p.value] = size
    return p.value
def free(ptr, size, device_type, device_id):
    calls.append(("free", size, device_type, device_id))
    assert cu.cuMemFree_v2(ctypes.c_uint64(ptr)) == 0
    del blocks[ptr]
buf = _fst.load(_fst.Checkpoint({single!r}), device="cuda:1", allocator=(alloc, free))
t = buf.tensor("w")
assert any(p <= t.data_ptr < p + n for p, n in blocks.items())
del buf
gc.collect()
assert len(blocks) == 1 and t.tobytes().hex() == want["w"][2]
del t
gc.collect()
assert len(blocks) == 0
kinds = [c[0] for c in calls]
assert kinds == ["alloc", "free"], calls
assert calls[0][3:] == (2, 1) and calls[1][2:] == (2, 1), calls
assert calls[0][1] >= sum(len(v[2]) // 2 for v in want.values())
print("ok", sys.getrefcount(alloc), sys.getrefcount(free))
""")
    assert out.strip() == "ok 2 2"


@pytest.mark.parametrize("how", ["load", "next", "finish"])
def test_ctrl_c_stops_a_load(cuda_double, gen_dir, how):
    """Ctrl-C (SIGINT) during a load raises KeyboardInterrupt within a beat
    of the load's wait (100 ms), not once every byte is in: here a load the
    double's slowed copies stretch to seconds. So in a streamed load's
    next() and finish() (they ignored it until the load ended). The process
    loads again after, and nothing of the interrupted load is left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    ck = gen_dir(shards=1, seed=52, size="8MiB")
    call = {"load": 'fst._fst.load(ck, device="cuda:0", threads=1, chunk_bytes=4096)',
            # one tensor whose copies the double stretches to seconds: one
            # next() waits that long
            "next": 'ld = fst._fst.start(ck, device="cuda:0", threads=1, chunk_bytes=4096, '
                    'names=["lm_head.weight"])\n'
                    '    while ld.next() is not None:\n        pass',
            "finish": 'ld = fst._fst.start(ck, device="cuda:0", threads=1, chunk_bytes=4096)\n'
                      '    ld.finish()'}[how]
    code = f"""
import time, fst
ck = fst._fst.Checkpoint({str(ck)!r})
t0 = time.time()
print("start", flush=True)
try:
    {call}
    print("finished %.2f" % (time.time() - t0), flush=True)
except KeyboardInterrupt:
    print("interrupted %.2f" % (time.time() - t0), flush=True)
import os
os.environ["FST_DOUBLE_DELAY_US"] = "0"
buf = fst._fst.load(ck, device="cuda:1")
print("again", len(buf.names()), flush=True)
"""
    env = dict(os.environ, FST_CUDA_LIBRARY=cuda_double,
               FST_DOUBLE_DELAY_US="40000" if how == "next" else "3000")
    env.pop("FST_FAULT", None)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "start"
    time.sleep(0.8)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    lines = out.split("\n")
    assert lines[0].startswith("interrupted "), out + err[-2000:]
    assert float(lines[0].split()[1]) < 2.5, out
    assert lines[1].startswith("again ") and int(lines[1].split()[1]) > 0, out + err[-2000:]
