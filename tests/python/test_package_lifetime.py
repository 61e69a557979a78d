"""Lifetimes of what the fst package hands out (docs/python.md, "Lifetimes"):
every array or tensor holds a reference on the one allocation its load made,
so it stays valid after the Checkpoint, safe_open, Buffer, Loader and
iterator objects are gone, and that allocation is freed when the last array
over it dies. Measured without weakrefs: the process's resident memory
(/proc/self/statm) over loads of a 64 MiB file, and its open descriptors
(/proc/self/fd). Also: DLPack export of the low-level Tensor, and the
caller-allocator bridge (the mechanism behind torch_allocator=True)."""
import gc
import os

import numpy as np
import pytest

import fsttest
from fsttest import write_safetensors

MiB = 1 << 20
BIG = 64 * MiB


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 64 MiB U8 tensor and a few small ones: (path, {name: bytes})."""
    rng = np.random.default_rng(99)
    data = {
        "big": rng.integers(0, 256, BIG, dtype=np.uint8),
        "small": np.arange(10, dtype=np.float32),
        "odd": rng.integers(0, 256, 7, dtype=np.uint8),
        "tail": rng.standard_normal((33, 3)).astype(np.float64),
    }
    p = tmp_path_factory.mktemp("big") / "big.safetensors"
    write_safetensors(p, [(k, {np.uint8: "U8", np.float32: "F32", np.float64: "F64"}[v.dtype.type],
                           v.shape, v.tobytes()) for k, v in data.items()])
    return p, {k: v.tobytes() for k, v in data.items()}


def churn(fst, path, times=3):
    """Allocate and free memory of the same size as earlier loads, so a
    use-after-free would read someone else's bytes."""
    for _ in range(times):
        d = fst.load_file(path, framework="numpy")
        d["big"][:] = 0xA5  # writes over the whole freed-and-reused block
        del d
    junk = [np.full(BIG // 4, 0x5A, np.uint8) for _ in range(4)]
    del junk
    gc.collect()


def test_arrays_outlive_every_owner(fst_pkg, big):
    path, want = big
    fst = fst_pkg
    kept = {}
    # load_file / load
    kept["load_file"] = fst.load_file(path, framework="numpy")["odd"]
    # safe_open, closed and deleted
    with fst.safe_open(path, framework="numpy") as f:
        kept["safe_open"] = f.get_tensor("tail")
        kept["slice"] = f.get_slice("small")[2:5]
    del f
    # iter_tensors, abandoned half way
    it = fst.iter_tensors(path, framework="numpy")
    for name, a in it:
        kept[f"iter.{name}"] = a
        if len(kept) == 5:
            break
    del it
    # the low level: Checkpoint, Buffer and Tensor deleted, numpy array kept
    ck = fst._fst.Checkpoint(str(path))
    buf = fst._fst.load(ck)
    t = buf.tensor("small")
    kept["dlpack"] = np.from_dlpack(t)
    del ck, buf, t
    # a streaming Loader deleted before finish
    ck = fst._fst.Checkpoint(str(path))
    loader = fst._fst.start(ck)
    t = loader.next()
    kept["loader"] = np.from_dlpack(t)
    first = t.name
    del loader, ck, t
    gc.collect()
    churn(fst, path)
    assert kept["load_file"].tobytes() == want["odd"]
    assert kept["safe_open"].tobytes() == want["tail"]
    assert kept["slice"].tobytes() == np.frombuffer(want["small"], np.float32)[2:5].tobytes()
    assert kept["dlpack"].tobytes() == want["small"]
    assert kept["loader"].tobytes() == want[first]
    for k, a in kept.items():
        if k.startswith("iter."):
            assert a.tobytes() == want[k[5:]], k


def test_memory_freed_with_the_last_array(fst_pkg, big):
    """One allocation per load: any array over it keeps all of it; the
    last one to go frees it."""
    path, want = big
    fst_pkg.load_file(path, framework="numpy")  # warm up: page cache, first-time costs
    gc.collect()
    r0 = rss()
    d = fst_pkg.load_file(path, framework="numpy")
    r1 = rss()
    assert r1 - r0 > 0.9 * BIG, (r0, r1)
    keep = d["odd"]
    del d
    gc.collect()
    assert rss() - r0 > 0.9 * BIG, "freed while an array over it is alive"
    assert keep.tobytes() == want["odd"]
    del keep
    gc.collect()
    assert rss() - r0 < 0.1 * BIG, "not freed when the last array died"


def test_rss_bounded_over_many_loads(fst_pkg, big):
    """Resident memory stays within half a load over 12 loads. Under
    qemu-user (fsttest.EMULATOR) every thread a process has started keeps
    about 270 KiB after it ends, qemu's memory (bare Python threads do the
    same; natively they keep none), so it grows with each load's threads:
    there the bound is a tenth of a load a round, which a load's buffer lost
    each round still exceeds ten times."""
    path, want = big
    fst = fst_pkg
    fst.load_file(path, framework="numpy")
    gc.collect()
    r0 = rss()
    peak = 0
    for i in range(12):
        d = fst.load_file(path, framework="numpy", io=["auto", "pread", "mmap"][i % 3])
        assert d["odd"].tobytes() == want["odd"]
        with fst.safe_open(path, framework="numpy") as f:
            f.get_tensor("small")
        for item in fst.iter_tensors(path, framework="numpy"):
            pass
        # the loop variable keeps the last tensor, hence the whole load
        del d, f, item
        gc.collect()
        peak = max(peak, rss() - r0)
    bound = 12 * BIG / 10 if fsttest.EMULATOR else 0.5 * BIG
    assert peak < bound, f"resident memory grew by {peak / MiB:.0f} MiB over 12 loads"


def test_dlpack_capsules_release_their_reference(fst_pkg, big):
    """Capsules never consumed, and capsules consumed by numpy, both give
    their buffer reference back."""
    path, want = big
    fst_pkg.load_file(path, framework="numpy")
    gc.collect()
    r0 = rss()
    buf = fst_pkg._fst.load(fst_pkg._fst.Checkpoint(str(path)))
    t = buf.tensor("big")
    caps = [t.__dlpack__() for _ in range(50)] + [t.__dlpack__(max_version=(1, 0))
                                                  for _ in range(50)]
    arrays = [np.from_dlpack(t) for _ in range(10)]
    assert arrays[3].tobytes()[:4096] == want["big"][:4096]
    del buf, t
    gc.collect()
    assert rss() - r0 > 0.9 * BIG
    del caps
    gc.collect()
    assert rss() - r0 > 0.9 * BIG  # the arrays still hold it
    del arrays
    gc.collect()
    assert rss() - r0 < 0.1 * BIG


def test_open_descriptors_stay_constant(fst_pkg, big, gen_dir):
    path, _ = big
    d = gen_dir(shards=3, seed=4, size="1MiB")
    fst = fst_pkg
    for target in (path, d):  # warm-up: whatever is opened once per process
        fst.load(target, framework="numpy")
    gc.collect()
    n0 = open_fds()
    for _ in range(5):
        for target in (path, d):
            for io in fsttest.io_cases("uring"):
                fst.load(target, framework="numpy", io=io)
            fst.load(target, framework="numpy", io="mmap")
            with fst.safe_open(target, framework="numpy") as f:
                f.keys()
            list(fst.iter_tensors(target, framework="numpy"))
            it = fst.iter_tensors(target, framework="numpy")
            next(it)
            del it  # abandoned: the loader is cancelled and freed
            ck = fst.Checkpoint(target)
            ck.keys()
            with fst.fastsafe_open(fst.Checkpoint(d).files(), framework="numpy", nogds=True) as f:
                f.get_tensor(f.keys()[0])
        for bad in (path.parent / "missing.safetensors",):
            with pytest.raises(fst.FileError):
                fst.load(bad, framework="numpy")
    del f, ck
    gc.collect()
    assert open_fds() == n0


def test_numpy_from_dlpack_on_tensors(fst_pkg, big):
    path, want = big
    buf = fst_pkg._fst.load(fst_pkg._fst.Checkpoint(str(path)))
    assert len(buf) == 4 and buf.nbytes() == sum(len(v) for v in want.values())
    assert isinstance(buf.describe(), str) and buf.describe()
    for name in buf.names():
        t = buf.tensor(name)
        assert t.__dlpack_device__() == (1, 0) and t.device == "cpu"
        assert t.data_ptr % 256 == 0
        a = np.from_dlpack(t)
        assert a.tobytes() == want[name] == t.tobytes()
        assert a.ctypes.data == t.data_ptr  # zero-copy
        # numpy asks for DLPack 1.x: writable (not an mmap load)
        assert a.flags.writeable
        b = np.from_dlpack(t, device="cpu")
        assert b.ctypes.data == t.data_ptr
        with pytest.raises(BufferError):
            t.__dlpack__(copy=True)
        with pytest.raises(BufferError):
            t.__dlpack__(dl_device=(2, 0))
    # two arrays over the same tensor share memory
    a1, a2 = np.from_dlpack(buf.tensor("small")), np.from_dlpack(buf.tensor("small"))
    a1[0] = 42
    assert a2[0] == 42
    # an mmap load: read-only views of the file
    mm = fst_pkg._fst.load(fst_pkg._fst.Checkpoint(str(path)), io=3)
    a = np.from_dlpack(mm.tensor("tail"))
    assert a.tobytes() == want["tail"] and not a.flags.writeable


ALLOC_SCRIPT = """
    import gc, sys, numpy as np, fst
    blocks, calls = {}, []
    mode = sys.argv[1] if len(sys.argv) > 1 else MODE

    def alloc(size, align, device_type, device_id):
        calls.append(("alloc", size, align, device_type, device_id))
        if mode == "fail":
            return 0
        if mode == "raise":
            raise RuntimeError("allocator exploded")
        a = np.zeros(size + 2 * align, np.uint8)
        p = (a.ctypes.data + align - 1) // align * align + (1 if mode == "misalign" else 0)
        blocks[p] = a
        return p

    def free(ptr, size, device_type, device_id):
        calls.append(("free", size, device_type, device_id))
        del blocks[ptr]

    ck = fst._fst.Checkpoint(PATH)
    for i in range(20):
        try:
            buf = fst._fst.load(ck, allocator=(alloc, free), align=512)
        except fst.SafetensorError as e:
            if i == 0:
                print("error", type(e).__name__, e)
            continue
        a = np.from_dlpack(buf.tensor("tail"))
        assert any(p <= a.ctypes.data < p + len(blocks[p]) for p in blocks)
        del buf
        gc.collect()
        if i == 0:
            print("live", len(blocks))
        del a
        gc.collect()
    try:
        s = fst._fst.start(ck, allocator=(alloc, free))
        while s.next() is not None:
            pass
        b = s.finish()
        del s, b
    except fst.SafetensorError:
        pass
    gc.collect()
    kinds = [c[0] for c in calls]
    print("calls", kinds.count("alloc"), kinds.count("free"), "live", len(blocks))
    print("refs", sys.getrefcount(alloc), sys.getrefcount(free))
"""


def test_allocator_free_keeps_the_exception_on_its_way(fst_pkg, tmp_path, run_python):
    """The last tensor of an allocator's block let go while an exception
    unwinds (a dict of tensors dropped by a KeyError): the free is called,
    and the caller still gets its KeyError (not a SystemError)."""
    path = write_safetensors(tmp_path / "a.safetensors", [("w", "U8", (8,), bytes(range(8)))])
    r = run_python(f"""
        import gc, numpy as np, fst
        blocks, freed = {{}}, []
        def alloc(size, align, device_type, device_id):
            a = np.zeros(size + 2 * align, np.uint8)
            p = (a.ctypes.data + align - 1) // align * align
            blocks[p] = a
            return p
        def free(ptr, size, device_type, device_id):
            freed.append(ptr)
            del blocks[ptr]
        ck = fst._fst.Checkpoint({str(path)!r})
        def load():
            buf = fst._fst.load(ck, allocator=(alloc, free))
            return {{n: np.from_dlpack(buf.tensor(n)) for n in buf.names()}}
        for attempt in (lambda: load()["nope"],
                        lambda: fst._fst.load(ck, allocator=(alloc, free)).tensor("nope")):
            try:
                attempt()
            except KeyError as e:
                print("KeyError", e)
            gc.collect()
        print("freed", len(freed), "live", len(blocks))
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["KeyError 'nope'", "KeyError 'nope'", "freed 2 live 0"], \
        r.stdout + r.stderr[-2000:]
    assert "SystemError" not in r.stderr, r.stderr


@pytest.mark.parametrize("mode", ["ok", "misalign", "fail", "raise"])
def test_allocator_bridge(fst_pkg, tmp_path, run_python, mode):
    """fst._fst.load(allocator=(alloc, free)): the memory of a load comes from
    Python and goes back exactly once, also when the load fails after the
    allocation (a misaligned block); a failing allocator is an
    OutOfMemoryError; nothing leaks (the callables' reference counts)."""
    rng = np.random.default_rng(1)
    path = write_safetensors(tmp_path / "a.safetensors", [
        ("odd", "U8", (5,), bytes(range(5))),
        ("tail", "F64", (33, 3), rng.standard_normal((33, 3)).tobytes())])
    r = run_python(ALLOC_SCRIPT.replace("PATH", repr(str(path))).replace("MODE", repr(mode)))
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-2000:]}"
    out = r.stdout.splitlines()
    calls = [line for line in out if line.startswith("calls")][0].split()
    n_alloc, n_free, live = int(calls[1]), int(calls[2]), int(calls[4])
    if mode == "ok":
        assert out[0] == "live 1"  # the array holds the block after the Buffer went
        assert n_alloc == 21 and n_free == 21 and live == 0
    elif mode == "misalign":
        assert out[0].startswith("error UsageError allocator: returned") and "512" in out[0]
        assert n_alloc == 21 and n_free == 21 and live == 0, r.stdout
    else:
        assert out[0].startswith("error OutOfMemoryError allocator: could not allocate"), out
        assert n_free == 0 and live == 0
        if mode == "raise":
            assert "allocator exploded" in r.stderr  # reported as unraisable
    # the script's own references: the name and getrefcount's argument
    assert out[-1] == "refs 2 2", out[-1]
