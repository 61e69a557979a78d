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
import queue
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


def advised_mapping(size):
    """A new anonymous mapping of `size` bytes (at least 1), advised for huge
    pages where the kernel has them; not touched."""
    m = mmap.mmap(-1, max(1, size))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    return m


def huge_buffer(size):
    """A buffer of `size` bytes at a 2 MiB boundary of a mapping advised for
    huge pages and faulted in: (the mapping, a memoryview of the buffer).
    An O_DIRECT read into it is one segment per huge page, as into fst's
    landing slots, where a buffer of 4 KiB pages is one per page."""
    import ctypes
    huge = 2 * MiB
    m = advised_mapping(size + huge)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    at = -addr % huge
    for off in range(0, len(m), 4096):
        m[off] = 0
    return m, memoryview(m)[at:at + size]


def read_pattern(files, threads, req, direct, per_file, fresh=False, huge=False):
    """Every byte of files with `threads` threads of `req`-byte preads into
    aligned buffers; per_file: threads split among the files, each group
    reading its file in order; else one queue of requests in file order.
    Each thread reads into a buffer of its own, reused (with huge, one of
    huge pages: huge_buffer); with fresh, every
    request into its own place of one new mapping (each file from a
    `req`-aligned place, huge pages advised), whose pages the reads fault
    in: returned, with each file's place, for the caller to unmap after the
    clock."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fds = [os.open(p, flags) for p in files]
    sizes = [os.fstat(fd).st_size for fd in fds]
    if not direct:
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    # where each file lands in the fresh mapping: whole requests each, so
    # that every O_DIRECT read lands at an aligned place
    bases = [0]
    for size in sizes:
        bases.append(bases[-1] + (size + req - 1) // req * req)
    base_of = dict(zip(fds, bases))
    dst = None
    if fresh:
        dst = advised_mapping(bases[-1])
    work = []
    if per_file:
        per = max(1, threads // len(files))
        queues = []
        for fd, size in zip(fds, sizes):
            q = queue.Queue()
            for off in range(0, size, req):
                q.put((fd, off))
            queues.append(q)
        work = [queues[i % len(queues)] for i in range(per * len(files))]
    else:
        q = queue.Queue()
        for fd, size in zip(fds, sizes):
            for off in range(0, size, req):
                q.put((fd, off))
        work = [q] * threads
    total = [0]
    lock = threading.Lock()

    def worker(q):
        if huge and not fresh:
            buf, mv = huge_buffer(req)
        else:
            buf = dst if fresh else mmap.mmap(-1, req)
            mv = memoryview(buf)
        n = 0
        while True:
            try:
                fd, off = q.get_nowait()
            except queue.Empty:
                break
            where = base_of[fd] + off if fresh else 0
            n += os.preadv(fd, [mv[where:where + req]], off)
        with lock:
            total[0] += n
        mv.release()
        if not fresh:
            buf.close()

    ts = [threading.Thread(target=worker, args=(q,)) for q in work]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for fd in fds:
        os.close(fd)
    assert total[0] == sum(sizes), (total[0], sum(sizes))
    return (dst, bases[:-1]) if fresh else None


def read_ahead_pattern(files, threads, req, ahead, fresh=False):
    """Buffered preads of `req` bytes by `threads` threads from one queue in
    file order, each request taken asking the kernel (WILLNEED) for the one
    `ahead` bytes later: what fst's readahead does. Each thread reads into a
    buffer of its own, reused; with fresh, every request into its own place
    of one new mapping the size of the files (advised for huge pages), whose
    pages the reads fault in, as fst's load into host memory does: returned,
    so that the caller unmaps it after the clock."""
    fds = [os.open(p, os.O_RDONLY) for p in files]
    reqs = [(fd, off, min(req, os.fstat(fd).st_size - off)) for fd in fds
            for off in range(0, os.fstat(fd).st_size, req)]
    dst = None
    if fresh:
        dst = advised_mapping(sum(r[2] for r in reqs))
    at = [0]
    for r in reqs[:-1]:
        at.append(at[-1] + r[2])
    k = max(1, ahead // req)
    nxt = [0]
    lock = threading.Lock()
    total = [0]

    def worker():
        buf = dst if fresh else mmap.mmap(-1, req)
        mv = memoryview(buf)
        n = 0
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(reqs):
                break
            for j in (range(1, k + 1) if i == 0 else (i + k,)):
                if j < len(reqs):
                    fd, off, ln = reqs[j]
                    os.posix_fadvise(fd, off, ln, os.POSIX_FADV_WILLNEED)
            fd, off, ln = reqs[i]
            where = at[i] if fresh else 0
            n += os.preadv(fd, [mv[where:where + ln]], off)
        with lock:
            total[0] += n
        mv.release()
        if not fresh:
            buf.close()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for fd in fds:
        os.close(fd)
    assert total[0] == sum(r[2] for r in reqs)
    return dst


def read_stream_pattern(files, threads, req, block, direct):
    """Every byte of files by `threads` threads, each taking the next `block`
    bytes (in file order, from one queue) and reading them in order with
    `req`-byte preads through descriptors of its own: one sequential stream
    per thread, what fastsafetensors' reader threads do (a 256 MiB block each,
    16 threads, 516 KiB preads with O_DIRECT)."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    sizes = [os.path.getsize(p) for p in files]
    q = queue.Queue()
    for i, size in enumerate(sizes):
        for off in range(0, size, block):
            q.put((i, off, min(block, size - off)))
    total = [0]
    lock = threading.Lock()

    def worker():
        fds = [os.open(p, flags) for p in files]
        buf = mmap.mmap(-1, req)
        mv = memoryview(buf)
        n = 0
        while True:
            try:
                i, start, ln = q.get_nowait()
            except queue.Empty:
                break
            for off in range(start, start + ln, req):
                want = min(req, start + ln - off)
                if direct:  # whole blocks; the file's end makes the last one short
                    want = min(req, (want + 4095) & ~4095)
                n += min(os.preadv(fds[i], [mv[:want]], off), start + ln - off)
        with lock:
            total[0] += n
        mv.release()
        buf.close()
        for fd in fds:
            os.close(fd)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert total[0] == sum(sizes), (total[0], sum(sizes))


def scrub(files):
    """Read every byte of files with O_DIRECT (nothing enters the guest's
    page cache); returns the seconds it took."""
    t0 = time.perf_counter()
    read_pattern(files, 16, 16 * MiB, True, False)
    return time.perf_counter() - t0


def make_cold(files, scrub_with=()):
    """drop_caches(files), after scrubbing with scrub_with when given."""
    return make_cold_timed(files, scrub_with)[0]


def make_cold_timed(files, scrub_with=()):
    """make_cold, and the seconds the scrub took (None without one): the
    disk's O_DIRECT rate just before a cold pass, the same bytes read the
    same way before every loader, so a pass that met a slow disk shows it."""
    took = scrub(scrub_with) if scrub_with else None
    return drop_caches(files) + (" + scrub" if scrub_with else ""), took
