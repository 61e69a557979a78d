#!/usr/bin/env python3
"""Can the GPU take a checkpoint straight from the page cache faster than
fst's CPU copy into pinned staging? Times, for each file of a checkpoint
(in the page cache), the three steps of that path apart: pinning the file's
cached pages for the device (cuMemHostRegister, read-only, on an mmap of the
file), the device pulling them (cuMemcpyHtoD into a torch allocation), and
unpinning; then the same with the pinning done for every file first, on a
thread of its own, before any copy starts (the pull then overlaps the
pinning of the next file). Prints GB/s of each step and of the whole.

  python3 bench/register_probe.py CKPT_DIR [--device cuda:0] [--piece 256M]
"""
import argparse
import ctypes
import glob
import mmap
import os
import threading
import time

CU_MEMHOSTREGISTER_READ_ONLY = 0x08


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--piece", type=size_arg, default=256 << 20,
                    help="bytes pinned per cuMemHostRegister call")
    a = ap.parse_args()
    import torch
    torch.zeros(1, device=a.device)
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    ctx = ctypes.c_void_p()
    cu.cuCtxGetCurrent(ctypes.byref(ctx))  # torch's; the pinning thread makes it its own

    def check(rc, what):
        if rc:
            raise SystemExit(f"{what}: CUresult {rc}")

    files = sorted(glob.glob(os.path.join(a.path, "*.safetensors")))
    maps = []
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(64 << 20):  # in the page cache
                pass
            maps.append(mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ))
    total = sum(len(m) for m in maps)
    dst = torch.empty(max(len(m) for m in maps), dtype=torch.uint8, device=a.device)

    def pieces(m):
        p = _address(m)
        return [(p + off, min(a.piece, len(m) - off)) for off in range(0, len(m), a.piece)]

    def register(m):
        for p, n in pieces(m):
            check(cu.cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_READ_ONLY), "register")

    def unregister(m):
        for p, _ in pieces(m):
            check(cu.cuMemHostUnregister(p), "unregister")

    def pull(m):
        for i, (p, n) in enumerate(pieces(m)):
            check(cu.cuMemcpyHtoD_v2(dst.data_ptr() + i * a.piece, p, n), "copy")

    # one file at a time, each step apart
    t = {"register": 0.0, "pull": 0.0, "unregister": 0.0}
    for m in maps:
        for step, fn in (("register", register), ("pull", pull), ("unregister", unregister)):
            t0 = time.perf_counter()
            fn(m)
            t[step] += time.perf_counter() - t0
    whole = sum(t.values())
    print(f"{a.path}: {total / 1e9:.2f} GB in {len(files)} files, pieces of {a.piece >> 20} MiB")
    for step, s in t.items():
        print(f"  {step:10s} {s:.3f} s  {total / s / 1e9:6.2f} GB/s")
    print(f"  serial     {whole:.3f} s  {total / whole / 1e9:6.2f} GB/s")

    # pinning ahead on a thread of its own, the pulls following it
    ready = [threading.Event() for _ in maps]

    failed = []

    def pinner():
        try:
            check(cu.cuCtxSetCurrent(ctx), "context")
            for m, ev in zip(maps, ready):
                register(m)
                ev.set()
        except SystemExit as e:  # the waits below must not outlive it
            failed.append(str(e))
            for ev in ready:
                ev.set()
    t0 = time.perf_counter()
    th = threading.Thread(target=pinner)
    th.start()
    for m, ev in zip(maps, ready):
        ev.wait()
        if failed:
            raise SystemExit(f"pinning thread: {failed[0]}")
        pull(m)
    th.join()
    dt = time.perf_counter() - t0
    for m in maps:
        unregister(m)
    print(f"  pinned ahead on a thread, pulls overlapping: {dt:.3f} s  {total / dt / 1e9:6.2f} GB/s "
          f"(unpinning not counted)")


class _Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _address(obj):
    """The address of an object's buffer (a read-only mmap refuses
    ctypes' from_buffer, so ask for the buffer itself)."""
    view = _Py_buffer()
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(_Py_buffer)]
    if get(obj, ctypes.byref(view), 0):
        raise SystemExit("no buffer")
    p = view.buf
    release(ctypes.byref(view))  # the mapping stays; only the export is released
    return p


if __name__ == "__main__":
    main()
