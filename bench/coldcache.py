"""Making files cold for a benchmark pass, shared by bench/peers.py and
bench/cold_patterns.py.

Dropping the page cache empties the guest's cache only. A virtual disk may
also be cached on its host, by block, and a reader that takes the blocks in
another order than the pass before it then finds some of them there (a
sequential pass leaves its tail cached). scrub() reads other files, at least
as big as that cache, with O_DIRECT, so the next pass finds none of the
checkpoint's blocks anywhere."""
import mmap
import os
import threading
import time

MiB = 1 << 20


def drop_caches(files):
    """The page cache dropped (root), else each file evicted; says which."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return "posix_fadvise"


def scrub_files(path):
    if not path:
        return []
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path)
                      if os.path.isfile(os.path.join(path, n)))
    return [path]


def scrub(files, threads=16, req=16 * MiB):
    """Read every byte of files with O_DIRECT (nothing enters the guest's
    page cache); returns the seconds it took."""
    t0 = time.perf_counter()
    work = [(p, off) for p in files for off in range(0, os.path.getsize(p), req)]
    lock = threading.Lock()

    def worker():
        buf = mmap.mmap(-1, req)
        fds = {}
        while True:
            with lock:
                if not work:
                    break
                p, off = work.pop()
            fd = fds.get(p)
            if fd is None:
                fd = fds[p] = os.open(p, os.O_RDONLY | os.O_DIRECT)
            os.preadv(fd, [buf], off)
        for fd in fds.values():
            os.close(fd)
        buf.close()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def make_cold(files, scrub_with=()):
    """drop_caches(files), after scrubbing with scrub_with when given."""
    if scrub_with:
        scrub(scrub_with)
    return drop_caches(files) + (" + scrub" if scrub_with else "")
