"""stream_bytes from Python: each reader thread reads a stretch of the files
in order (the load's description says "streams of N"), "off" and 0 keep one
queue, the bytes equal the files' whatever the setting, and bad values are
refused before anything is read."""
import pytest

import fst
from test_package_readahead import evict, expected


@pytest.fixture(scope="module")
def ck(gen_dir):
    return str(gen_dir(shards=3, seed=67, size="8MiB", misaligned=True))


@pytest.mark.parametrize("io", ["pread", "uring", "auto"])
@pytest.mark.parametrize("value, says", [(0, None), ("off", None), (1, "streams of 256 KiB"),
                                         (1 << 20, "streams of 1 MiB"),
                                         (3 << 20, "streams of 3 MiB")])
def test_stream_setting(ck, io, value, says):
    want = expected(ck)
    kw = fst._args._load_kwargs("cpu", "numpy", io=io, chunk_bytes=256 << 10, threads=3,
                                stream_bytes=value)
    kw.pop("torch_allocator")
    try:
        d = fst._fst.load(fst._fst.Checkpoint(ck), **kw).describe()
    except fst.UnsupportedError as e:
        pytest.skip(f"io={io} here: {e}")
    if says:
        assert says in d, d
    else:
        assert "streams" not in d, d
    for cold in (False, True):
        if cold:
            evict(ck)
        got = fst.load(ck, framework="numpy", io=io, chunk_bytes=256 << 10, threads=3,
                       stream_bytes=value)
        assert set(got) == set(want)
        assert all(a.tobytes() == want[n] for n, a in got.items())
    got = dict(fst.iter_tensors(ck, framework="numpy", io=io, threads=3, stream_bytes=value))
    assert set(got) == set(want)
    assert all(got[n].tobytes() == want[n] for n in want)


@pytest.mark.parametrize("value, error", [(-1, fst.UsageError), ("on", fst.ArgumentTypeError),
                                          (1.5, fst.ArgumentTypeError),
                                          (2 ** 64 - 1, fst.UsageError)])
def test_bad_stream(ck, value, error):
    with pytest.raises(error, match="stream_bytes"):
        fst.load(ck, framework="numpy", stream_bytes=value)
