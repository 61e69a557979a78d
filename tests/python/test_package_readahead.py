"""readahead_bytes from Python: cold files read by pread ask the kernel ahead
(the load's description says how far), "off" never asks, the bytes equal the
files' whatever the setting, and bad values are refused before anything is
read."""
import os

import numpy as np
import pytest

import fst
from fsttest import Header, file_bytes


def evict(ckdir):
    for name in os.listdir(ckdir):
        if name.endswith(".safetensors"):
            fd = os.open(os.path.join(ckdir, name), os.O_RDONLY)
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def expected(ckdir):
    out = {}
    for name in sorted(os.listdir(ckdir)):
        if name.endswith(".safetensors"):
            p = os.path.join(ckdir, name)
            h, blob = Header(p), file_bytes(p)
            for t, info in h.tensors.items():
                b, e = info["data_offsets"]
                out[t] = blob[h.data_offset + b:h.data_offset + e]
    return out


@pytest.fixture(scope="module")
def ck(gen_dir):
    return str(gen_dir(shards=2, seed=61, size="8MiB", misaligned=True))


def cached_fraction_known(ck):
    evict(ck)
    buf = fst._fst.load(fst._fst.Checkpoint(ck), io=1, chunk_bytes=1 << 20)
    return "readahead" in buf.describe()


@pytest.mark.parametrize("value, says", [(0, "readahead 1024 MiB"), (1 << 20, "readahead 1 MiB"),
                                         ("off", None)])
def test_readahead_setting(ck, value, says):
    if not cached_fraction_known(ck):
        pytest.skip("page-cache residency cannot be told here (or eviction is refused)")
    want = expected(ck)
    evict(ck)
    kw = fst._args._load_kwargs("cpu", "numpy", io="pread", chunk_bytes=1 << 20,
                                readahead_bytes=value)
    kw.pop("torch_allocator")
    buf = fst._fst.load(fst._fst.Checkpoint(ck), **kw)
    d = buf.describe()
    if says:
        assert says in d, d
    else:
        assert "readahead" not in d, d
    evict(ck)
    got = fst.load(ck, framework="numpy", io="pread", readahead_bytes=value)
    assert set(got) == set(want)
    for name, a in got.items():
        assert a.tobytes() == want[name], name
    evict(ck)
    got = dict(fst.iter_tensors(ck, framework="numpy", readahead_bytes=value))
    assert all(got[n].tobytes() == want[n] for n in want)


@pytest.mark.parametrize("value, error", [(-1, fst.UsageError), ("on", fst.ArgumentTypeError),
                                          (1.5, fst.ArgumentTypeError),
                                          (2 ** 64 - 1, fst.UsageError)])
def test_bad_readahead(ck, value, error):
    with pytest.raises(error, match="readahead_bytes"):
        fst.load(ck, framework="numpy", readahead_bytes=value)


def test_numpy_bytes_default(ck):
    """The default (cold files read ahead by io=auto) changes no byte."""
    want = expected(ck)
    evict(ck)
    got = fst.load(ck, framework="numpy")
    assert all(np.array_equal(np.frombuffer(got[n].tobytes(), np.uint8),
                              np.frombuffer(want[n], np.uint8)) for n in want)
