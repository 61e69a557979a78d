"""Concurrency and streaming in the fst package: loads from several Python
threads at once, the GIL released while bytes move, and fst.iter_tensors
(every tensor exactly once, right values, progress bars with and without
tqdm, early exit)."""
import gc
import sys
import threading
import time
import types

import numpy as np
import pytest

import fsttest
from fsttest import Header, file_bytes, write_safetensors

MiB = 1 << 20


def expected(path_or_dir):
    """{name: bytes} over the checkpoint's files, parsed here."""
    from pathlib import Path
    p = Path(path_or_dir)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    out = {}
    for f in files:
        h, blob = Header(f), file_bytes(f)
        for name, info in h.tensors.items():
            b, e = info["data_offsets"]
            assert name not in out
            out[name] = blob[h.data_offset + b:h.data_offset + e]
    return out


@pytest.fixture(scope="module")
def ckpt(gen_dir):
    return gen_dir(shards=3, seed=31, size="3MiB", misaligned=True)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    rng = np.random.default_rng(5)
    p = tmp_path_factory.mktemp("gil") / "big.safetensors"
    a = rng.integers(0, 256, 96 * MiB, dtype=np.uint8)
    return write_safetensors(p, [("big", "U8", a.shape, a.tobytes())])


# ---------------------------------------------------------------- threads

def test_loads_from_four_threads(fst_pkg, ckpt):
    want = expected(ckpt)
    files = sorted(str(f) for f in ckpt.glob("*.safetensors"))
    errors, done = [], []
    start = threading.Barrier(4)
    ios = fsttest.io_cases("auto", "pread", "uring", "mmap")

    def worker(k):
        try:
            start.wait()
            for i in range(10):
                io = ios[(k + i) % len(ios)]
                if i % 3 == 2:
                    got = dict(fst_pkg.iter_tensors(files, framework="numpy", io=io))
                elif i % 3 == 1:
                    got = fst_pkg.load(ckpt, framework="numpy", io=io, threads=1 + k)
                else:
                    got = fst_pkg.load_file(files[(k + i) % 3], framework="numpy", io=io)
                    got.update(fst_pkg.load(ckpt, framework="numpy",
                                            names=[n for n in want if n not in got]))
                assert set(got) == set(want), (k, i)
                for n, a in got.items():
                    assert a.tobytes() == want[n], (k, i, n)
            done.append(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(done) == [0, 1, 2, 3]


def test_one_checkpoint_shared_by_threads(fst_pkg, ckpt):
    """A Checkpoint may be read from several threads at once (fst.h)."""
    want = expected(ckpt)
    ck = fst_pkg.Checkpoint(ckpt)
    results = [None] * 4

    def worker(k):
        results[k] = [fst_pkg.load(ck, framework="numpy") for _ in range(5)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for per_thread in results:
        assert per_thread is not None and len(per_thread) == 5
        for got in per_thread:
            assert {n: a.tobytes() for n, a in got.items()} == want


def test_gil_released_during_load(fst_pkg, big):
    """A pure-Python thread keeps running while the main thread is inside
    one load call: it records timestamps well inside the call's window,
    which it could not do if the call held the GIL."""
    ck = fst_pkg._fst.Checkpoint(str(big))
    fst_pkg._fst.load(ck, io=1, threads=1)  # page cache warm
    stamps, stop = [], threading.Event()

    def counter():
        i = 0
        while not stop.is_set():
            i += 1
            if i % 200 == 0:
                stamps.append(time.perf_counter())

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    th = threading.Thread(target=counter)
    th.start()
    try:
        windows = []
        for _ in range(6):
            time.sleep(0.005)
            t0 = time.perf_counter()
            buf = fst_pkg._fst.load(ck, io=1, threads=1)  # one C call
            t1 = time.perf_counter()
            windows.append((t0, t1))
            del buf
        # the streaming form too: next() blocks without the GIL
        loader = fst_pkg._fst.start(ck, io=1, threads=1)
        t0 = time.perf_counter()
        while loader.next() is not None:
            pass
        loader.finish()
        windows.append((t0, time.perf_counter()))
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    inside = 0
    long_windows = 0
    for t0, t1 in windows:
        # with a 1 ms switch interval a call that held the GIL could let
        # the counter run at most ~1 ms past t0
        if t1 - t0 < 0.008:
            continue
        long_windows += 1
        inside += sum(1 for s in stamps if t0 + 0.003 < s < t1 - 0.002)
    if long_windows == 0:
        pytest.skip("loads too fast here to observe (each under 8 ms)")
    assert inside > 10 * long_windows, (inside, long_windows, windows)


# ------------------------------------------------------------- iter_tensors

def test_iter_tensors_every_tensor_once(fst_pkg, ckpt):
    want = expected(ckpt)
    files = sorted(ckpt.glob("*.safetensors"))
    for target in (ckpt, [str(f) for f in files], files, ckpt / "model.safetensors.index.json"):
        seen = []
        for name, a in fst_pkg.iter_tensors(target, framework="numpy"):
            assert isinstance(a, np.ndarray)
            assert a.tobytes() == want[name], name
            seen.append(name)
        assert sorted(seen) == sorted(want) and len(seen) == len(set(seen)), target


@pytest.mark.parametrize("io", ["auto", "pread", "uring", "mmap"])
def test_iter_tensors_io_and_names(fst_pkg, ckpt, io):
    want = expected(ckpt)
    names = sorted(want)[::4]
    got = list(fst_pkg.iter_tensors(ckpt, framework="numpy", io=io, names=names, threads=2))
    assert sorted(n for n, _ in got) == names
    for n, a in got:
        assert a.tobytes() == want[n]


def test_iter_tensors_order_follows_the_files(fst_pkg, ckpt):
    """Checkpoint after checkpoint: with a list of shards, every tensor of
    the first shard comes before any of the second."""
    files = sorted(ckpt.glob("*.safetensors"))
    owner = {}
    for i, f in enumerate(files):
        for n in Header(f).tensors:
            owner[n] = i
    order = [owner[n] for n, _ in fst_pkg.iter_tensors(files, framework="numpy")]
    assert order == sorted(order)


def test_iter_tensors_early_exit(fst_pkg, ckpt):
    want = expected(ckpt)
    it = fst_pkg.iter_tensors(ckpt, framework="numpy")
    first = [next(it) for _ in range(3)]
    it.close()  # cancels and frees the load
    with pytest.raises(StopIteration):
        next(it)
    gc.collect()
    for n, a in first:
        assert a.tobytes() == want[n]
    # breaking out of a for loop does the same
    for n, a in fst_pkg.iter_tensors(ckpt, framework="numpy"):
        break
    assert a.tobytes() == want[n]


def test_iter_tensors_errors_are_raised_lazily_but_checked_first(fst_pkg, ckpt, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 4)
    # every path is opened (and checked) before the first tensor
    with pytest.raises(fst_pkg.FormatError):
        next(fst_pkg.iter_tensors([ckpt, bad], framework="numpy"))


class FakeTqdm:
    instances = []

    def __init__(self, total=None, unit=None, unit_scale=None, desc=None, **kw):
        self.total, self.n, self.closed, self.desc = total, 0, False, desc
        FakeTqdm.instances.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


def test_progress_without_tqdm(fst_pkg, ckpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    want = expected(ckpt)
    got = dict(fst_pkg.iter_tensors(ckpt, framework="numpy", progress=True))
    assert {n: a.tobytes() for n, a in got.items()} == want


def test_progress_with_a_tqdm(fst_pkg, ckpt, monkeypatch):
    """The bar is sized in bytes, advanced by each tensor's bytes and closed,
    also when the loop stops early."""
    FakeTqdm.instances = []
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    want = expected(ckpt)
    total = sum(len(v) for v in want.values())
    got = dict(fst_pkg.iter_tensors(ckpt, framework="numpy", progress=True))
    assert len(got) == len(want)
    bar = FakeTqdm.instances[-1]
    assert (bar.total, bar.n, bar.closed) == (total, total, True)
    names = sorted(want)[:5]
    list(fst_pkg.iter_tensors(ckpt, framework="numpy", progress=True, names=names))
    bar = FakeTqdm.instances[-1]
    assert bar.total == bar.n == sum(len(want[n]) for n in names)
    it = fst_pkg.iter_tensors(ckpt, framework="numpy", progress=True)
    next(it)
    it.close()
    assert FakeTqdm.instances[-1].closed


def test_progress_with_real_tqdm(fst_pkg, ckpt, capsys):
    pytest.importorskip("tqdm")
    want = expected(ckpt)
    got = dict(fst_pkg.iter_tensors(ckpt, framework="numpy", progress=True))
    assert {n: a.tobytes() for n, a in got.items()} == want
    assert "fst" in capsys.readouterr().err


def test_low_level_loader_progress_and_cancel(fst_pkg, big):
    _fst = fst_pkg._fst
    ck = _fst.Checkpoint(str(big))
    loader = _fst.start(ck, io=1, threads=1, chunk_bytes=1 << 20)
    done, total = loader.progress()
    assert total == 96 * MiB and 0 <= done <= total
    loader.cancel()
    # after cancel, next() ends early (None or CancelledError) and finish()
    # reports the cancellation
    with pytest.raises(fst_pkg.CancelledError):
        try:
            while loader.next() is not None:
                pass
        except fst_pkg.CancelledError:
            pass
        loader.finish()
    # a cancelled loader can still be dropped cleanly, and the next load works
    del loader
    buf = _fst.load(ck)
    assert buf.tensor("big").nbytes == 96 * MiB
