#!/usr/bin/env python3
"""Where the first load of a process loses time against its later ones, on
a GPU: what a device allocation of a checkpoint's size costs (torch's caching
allocator, cuMemAlloc, and the virtual-memory calls mapped piece by piece),
and fst.load timed in fresh processes with and without that allocation.

  first_load.py alloc BYTES          the allocation costs, in this process
  first_load.py touch BYTES          host-to-device copies into fresh device
                                     memory, into memory written before, and
                                     into fresh memory filled on the GPU first
  first_load.py driver -            what the driver objects a load makes cost
                                     the first time in a process and the next:
                                     16 streams (one thread, then 16 threads at
                                     once), 48 events, 16 pinned 4 MiB blocks,
                                     a first small copy
  first_load.py pin BYTES            pinning BYTES of staging in fresh
                                     processes, each way fst could: from
                                     cuMemHostAlloc, or huge-page memory
                                     registered untouched, or faulted in on
                                     1 or 16 threads first (4 KiB pages too);
                                     the first block of a process and a second
  first_load.py loads CHECKPOINT     fst.load in fresh processes, each case
                                     printed with fst's debug log beside it
  first_load.py timeline CHECKPOINT  two streamed loads in one process: when
                                     each share of the bytes was ready, so a
                                     first load's loss shows as a late start
                                     or as a lower rate
  first_load.py overlap CHECKPOINT   fst.load while a thread maps device
                                     memory piece by piece: does mapping
                                     stall the copies?
  first_load.py after CHECKPOINT     a process's first fst.load (as a
                                     bench pass times it) after what came
                                     before it: the GPU idle for 5 s, another
                                     process that freed the checkpoint's size
                                     of device memory by exiting just before,
                                     or one that kept the copy engines busy;
                                     each also with a 2 s wait, set up,
                                     before the clock; rounds in rotated order

Prints one line per measurement. Needs torch with CUDA and fst.
"""
import ctypes
import os
import subprocess
import sys
import threading
import time

from peers import files_of, warm  # bench/, beside this script

DEV = "cuda:0"


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    for f in ("cuMemAlloc_v2", "cuMemFree_v2", "cuMemAddressReserve", "cuMemAddressFree",
              "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
              "cuMemGetAllocationGranularity"):
        getattr(lib, f).restype = ctypes.c_int
    return lib


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class Access(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def ok(r, what):
    if r:
        raise SystemExit(f"{what}: CUDA error {r}")


def ms(t0):
    return (time.perf_counter() - t0) * 1e3


def torch_ready():
    import torch
    torch.zeros(1, device=DEV)
    torch.cuda.synchronize()
    return torch


class Mapper:
    """Device memory reserved once, then mapped in pieces (what a progressive
    allocation would do beside a load)."""

    def __init__(self, cu, size, piece):
        self.cu, self.piece = cu, piece
        prop = Prop(type=1, location=Location(type=1, id=0))  # pinned, device 0
        g = ctypes.c_size_t()
        ok(cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 1), "granularity")
        self.piece = (piece + g.value - 1) // g.value * g.value
        self.size = (size + self.piece - 1) // self.piece * self.piece
        self.prop = prop
        self.base = ctypes.c_uint64()
        ok(cu.cuMemAddressReserve(ctypes.byref(self.base), ctypes.c_size_t(self.size),
                                  ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0)),
           "reserve")
        self.handles = []

    def map_all(self):
        acc = Access(location=Location(type=1, id=0), flags=3)
        for off in range(0, self.size, self.piece):
            h = ctypes.c_uint64()
            ok(self.cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(self.piece),
                                   ctypes.byref(self.prop), ctypes.c_uint64(0)), "create")
            at = ctypes.c_uint64(self.base.value + off)
            ok(self.cu.cuMemMap(at, ctypes.c_size_t(self.piece), ctypes.c_size_t(0), h,
                                ctypes.c_uint64(0)), "map")
            ok(self.cu.cuMemSetAccess(at, ctypes.c_size_t(self.piece), ctypes.byref(acc),
                                      ctypes.c_size_t(1)), "access")
            self.handles.append(h)

    def free(self):
        self.cu.cuMemUnmap(self.base, ctypes.c_size_t(self.size))
        for h in self.handles:
            self.cu.cuMemRelease(h)
        self.cu.cuMemAddressFree(self.base, ctypes.c_size_t(self.size))


def alloc(n):
    torch = torch_ready()
    cu = cuda()
    for i in range(2):
        t0 = time.perf_counter()
        x = torch.empty(n, dtype=torch.uint8, device=DEV)
        torch.cuda.synchronize()
        t1 = ms(t0)
        del x
        t0 = time.perf_counter()
        torch.cuda.empty_cache()
        print(f"torch.empty {n} bytes #{i + 1}: {t1:.1f} ms; empty_cache {ms(t0):.1f} ms",
              flush=True)
    for i in range(2):
        p = ctypes.c_uint64()
        t0 = time.perf_counter()
        ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
        t1 = ms(t0)
        t0 = time.perf_counter()
        cu.cuMemFree_v2(p)
        print(f"cuMemAlloc {n} bytes #{i + 1}: {t1:.1f} ms; cuMemFree {ms(t0):.1f} ms", flush=True)
    for piece in (64 << 20, 256 << 20, 1 << 30):
        t0 = time.perf_counter()
        m = Mapper(cu, n, piece)
        t1 = ms(t0)
        t0 = time.perf_counter()
        m.map_all()
        t2 = ms(t0)
        t0 = time.perf_counter()
        m.free()
        print(f"VMM {m.size} bytes in {m.size // m.piece} pieces of {m.piece >> 20} MiB: "
              f"reserve {t1:.1f} ms, create+map+access {t2:.1f} ms "
              f"({t2 / (m.size // m.piece):.2f} ms a piece), free {ms(t0):.1f} ms", flush=True)


def touch(n):
    torch = torch_ready()
    piece = 1 << 30
    src = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)

    def copy_pass(dst, label):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for off in range(0, n, piece):
            k = min(piece, n - off)
            dst[off:off + k].copy_(src[:k], non_blocking=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"{label}: {dt * 1e3:.1f} ms, {n / dt / 1e9:.2f} GB/s", flush=True)

    for r in range(2):
        torch.cuda.empty_cache()
        dst = torch.empty(n, dtype=torch.uint8, device=DEV)
        copy_pass(dst, f"round {r + 1}: copies into fresh memory")
        copy_pass(dst, f"round {r + 1}: copies into the same memory again")
        del dst
        torch.cuda.empty_cache()
        dst = torch.empty(n, dtype=torch.uint8, device=DEV)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.zero_()
        torch.cuda.synchronize()
        print(f"round {r + 1}: filling fresh memory on the GPU: {ms(t0):.1f} ms", flush=True)
        copy_pass(dst, f"round {r + 1}: copies into fresh memory filled first")
        del dst


def driver():
    import mmap
    torch_ready()
    cu = cuda()
    for f in ("cuStreamCreate", "cuStreamDestroy_v2", "cuEventCreate", "cuEventDestroy_v2",
              "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemcpyHtoDAsync_v2",
              "cuStreamSynchronize", "cuCtxGetCurrent", "cuCtxSetCurrent"):
        getattr(cu, f).restype = ctypes.c_int
    ctx = ctypes.c_void_p()
    ok(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "context")

    def streams(n, label):
        ss = [ctypes.c_void_p() for _ in range(n)]
        t0 = time.perf_counter()
        for x in ss:
            ok(cu.cuStreamCreate(ctypes.byref(x), 1), "stream")
        t1 = ms(t0)
        t0 = time.perf_counter()
        for x in ss:
            cu.cuStreamDestroy_v2(x)
        print(f"{label}: {n} streams created in {t1:.2f} ms, destroyed in {ms(t0):.2f} ms",
              flush=True)

    def threaded_streams(label):
        out = []

        def one():
            cu.cuCtxSetCurrent(ctx)
            x = ctypes.c_void_p()
            t0 = time.perf_counter()
            ok(cu.cuStreamCreate(ctypes.byref(x), 1), "stream")
            out.append((ms(t0), x))

        th = [threading.Thread(target=one) for _ in range(16)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        total = ms(t0)
        for _, x in out:
            cu.cuStreamDestroy_v2(x)
        each = sorted(v for v, _ in out)
        print(f"{label}: 16 threads creating a stream each: {total:.2f} ms in all, each "
              f"{each[0]:.2f}-{each[-1]:.2f} ms", flush=True)

    def events(label):
        es = [ctypes.c_void_p() for _ in range(48)]
        t0 = time.perf_counter()
        for x in es:
            ok(cu.cuEventCreate(ctypes.byref(x), 2), "event")
        t1 = ms(t0)
        for x in es:
            cu.cuEventDestroy_v2(x)
        print(f"{label}: 48 events created in {t1:.2f} ms", flush=True)

    blocks = []

    def pin(label):
        t0 = time.perf_counter()
        for _ in range(16):
            m = mmap.mmap(-1, 4 << 20)
            buf = (ctypes.c_char * (4 << 20)).from_buffer(m)
            ok(cu.cuMemHostRegister_v2(buf, ctypes.c_size_t(4 << 20), 1), "register")
            blocks.append((m, buf))
        print(f"{label}: 16 blocks of 4 MiB registered in {ms(t0):.2f} ms", flush=True)

    def first_copy(label):
        import torch
        dst = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
        s = ctypes.c_void_p()
        ok(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        src = blocks[0][1]
        t0 = time.perf_counter()
        ok(cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst.data_ptr()), src, ctypes.c_size_t(1 << 20),
                                   s), "copy")
        ok(cu.cuStreamSynchronize(s), "sync")
        print(f"{label}: a 1 MiB copy from registered memory on a new stream: {ms(t0):.2f} ms",
              flush=True)
        cu.cuStreamDestroy_v2(s)

    for r in ("first", "second", "third"):
        threaded_streams(r) if r != "second" else streams(16, r)
    streams(16, "again, one thread")
    events("first")
    events("second")
    pin("first")
    pin("second")
    first_copy("first")
    first_copy("second")
    for m, buf in blocks:
        cu.cuMemHostUnregister(buf)


PIN_WAYS = ("hostalloc", "huge-lazy", "huge-touch1", "huge-touch16", "small-lazy", "small-touch16")


def pin_one(way, n):
    """One fresh process's two blocks of n bytes, pinned `way` (run by `pin`)."""
    torch_ready()
    cu = cuda()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    for f in ("cuMemHostAlloc", "cuMemHostRegister_v2"):
        getattr(cu, f).restype = ctypes.c_int
    huge = 2 << 20
    for which in ("first", "second"):
        t0 = time.perf_counter()
        touch_ms = 0.0
        if way == "hostalloc":
            p = ctypes.c_void_p()
            ok(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 1), "cuMemHostAlloc")
        else:
            raw = libc.mmap(None, n + huge, 3, 0x22 | 0x4000, -1, 0)  # PRIVATE|ANON|NORESERVE
            a = (raw + huge - 1) // huge * huge
            libc.madvise(a, n, 15 if way.startswith("small") else 14)  # NOHUGEPAGE, HUGEPAGE
            if "touch" in way:
                k = int(way.split("touch")[1])
                part = (n // k + huge - 1) // huge * huge
                spans = [(a + o, min(part, n - o)) for o in range(0, n, part)]
                th = [threading.Thread(target=libc.memset, args=(q, 0, m)) for q, m in spans]
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                touch_ms = ms(t0)
            t1 = time.perf_counter()
            ok(cu.cuMemHostRegister_v2(ctypes.c_void_p(a), ctypes.c_size_t(n), 1),
               "cuMemHostRegister")
            reg_ms = ms(t1)
        total = ms(t0)
        split = f" (touch {touch_ms:.2f}, register {reg_ms:.2f})" if way != "hostalloc" else ""
        print(f"pin {way} {which}: {n >> 20} MiB in {total:.2f} ms{split}", flush=True)


def pin(n):
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        thp = f.read().strip()
    with open("/sys/kernel/mm/transparent_hugepage/defrag") as f:
        print(f"transparent huge pages: {thp}; defrag: {f.read().strip()}", flush=True)
    for r in range(4):
        ways = PIN_WAYS if r % 2 == 0 else tuple(reversed(PIN_WAYS))
        for way in ways:
            subprocess.run([sys.executable, __file__, "pinone", way, str(n)],
                           stderr=subprocess.STDOUT)


def fill_cache(torch, path):
    """Leave a block of the checkpoint's size (and some) in torch's cache,
    so the next load's device memory comes from it, allocated before."""
    n = sum(os.path.getsize(f) for f in files_of(path))
    x = torch.empty(n + (256 << 20), dtype=torch.uint8, device=DEV)
    del x


def load_once(path, label, **kw):
    import torch
    import fst
    t0 = time.perf_counter()
    d = fst.load(path, device=DEV, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = sum(t.numel() * t.element_size() for t in d.values())
    print(f"{label}: {dt * 1e3:.1f} ms, {n / dt / 1e9:.2f} GB/s", flush=True)
    del d
    return n


def case(path, which):
    """One fresh process's loads (run by `loads`)."""
    torch = torch_ready()
    t0 = time.perf_counter()
    import fst  # noqa: F401
    print(f"import fst: {ms(t0):.1f} ms", flush=True)
    if which == "default":
        for i in range(3):
            load_once(path, f"load {i + 1} (torch's allocator)")
    elif which == "cumemalloc":
        for i in range(2):
            load_once(path, f"load {i + 1} (cuMemAlloc)", torch_allocator=False)
    elif which == "cached":
        # the first load without the device allocation (it still pins its staging)
        fill_cache(torch, path)
        load_once(path, "load 1 (torch's cache holds the memory)")
        load_once(path, "load 2 (torch's cache holds the memory)")


def loads(path):
    env = dict(os.environ, FST_LOG="debug")
    for which in ("cached", "default", "cumemalloc", "default"):
        print(f"--- fresh process: {which}", flush=True)
        subprocess.run([sys.executable, __file__, "case", path, which], env=env,
                       stderr=subprocess.STDOUT)


def timeline(path):
    torch = torch_ready()
    import fst
    shares = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    for i in range(2):
        t0 = time.perf_counter()
        marks, done, out = [], 0, {}
        for k, t in fst.iter_tensors(path, device=DEV):
            out[k] = t
            done += t.numel() * t.element_size()
            marks.append((time.perf_counter() - t0, done))
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        at = []
        for f in shares:
            when = next(m for m, d in marks if d >= f * done)
            at.append(f"{f:.0%} {when * 1e3:.1f}")
        print(f"load {i + 1}: {done / total / 1e9:.2f} GB/s, first tensor at "
              f"{marks[0][0] * 1e3:.1f} ms; ms at each share of the bytes: " + ", ".join(at),
              flush=True)
        del out


def overlap(path):
    """fst.load with the device memory already in torch's cache (no
    allocation), while another thread maps 16 GB piece by piece."""
    torch = torch_ready()
    import fst  # noqa: F401
    fill_cache(torch, path)
    load_once(path, "load alone (cache holds the memory), warm-up")
    load_once(path, "load alone (cache holds the memory)")
    cu = cuda()
    ctx = ctypes.c_void_p()
    ok(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "context")
    for piece in (256 << 20, 1 << 30):
        m = Mapper(cu, 16 << 30, piece)
        done = {}

        def run():
            ok(cu.cuCtxSetCurrent(ctx), "context")  # torch's, on this thread too
            t0 = time.perf_counter()
            m.map_all()
            done["ms"] = ms(t0)

        th = threading.Thread(target=run)
        th.start()
        load_once(path, f"load beside a mapper of {piece >> 20} MiB pieces")
        th.join()
        print(f"  the mapper took {done['ms']:.1f} ms", flush=True)
        m.free()
    load_once(path, "load alone again")


def before(what, n):
    """What runs in a process of its own just before an `after` probe."""
    torch = torch_ready()
    if what == "free":  # the checkpoint's size, written, freed at exit
        torch.empty(n, dtype=torch.uint8, device=DEV).fill_(1)
    elif what == "busy":  # the copy engines busy for 2 s, little to free
        src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2:
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
    torch.cuda.synchronize()


def probe(path, settle, label):
    """A process's first load, timed as bench/peers.py times a pass."""
    torch_ready()
    import fst  # noqa: F401
    time.sleep(settle)
    load_once(path, label)


AFTER = (("idle", 0), ("free", 0), ("busy", 0), ("idle", 2), ("free", 2), ("busy", 2))


def after(path, rounds=3):
    files = files_of(path)
    n = sum(os.path.getsize(f) for f in files)
    # read through the page cache here: a load of files not cached reads them
    # with O_DIRECT (io=auto) and would leave every probe a cold read
    warm(files)
    run = [sys.executable, __file__]
    subprocess.run(run + ["probe", path, "0", "warm-up (page cache)"], check=True)
    for r in range(rounds):
        for i in range(len(AFTER)):
            what, settle = AFTER[(i + r) % len(AFTER)]
            if what == "idle":
                time.sleep(5)
            else:
                subprocess.run(run + ["before", what, str(n)], check=True)
            label = f"round {r + 1}: after {what}, settle {settle} s"
            subprocess.run(run + ["probe", path, str(settle), label], check=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    what, arg = sys.argv[1], sys.argv[2]
    if what == "alloc":
        alloc(int(arg))
    elif what == "touch":
        touch(int(arg))
    elif what == "loads":
        loads(arg)
    elif what == "pin":
        pin(int(arg))
    elif what == "pinone":
        pin_one(arg, int(sys.argv[3]))
    elif what == "driver":
        driver()
    elif what == "timeline":
        timeline(arg)
    elif what == "case":
        case(arg, sys.argv[3])
    elif what == "overlap":
        overlap(arg)
    elif what == "after":
        after(arg)
    elif what == "before":
        before(arg, int(sys.argv[3]))
    elif what == "probe":
        probe(arg, float(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(__doc__)
