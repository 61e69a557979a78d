"""bench/peers.py, the side-by-side of fst and the peer loaders, run end to
end on the CPU with the peers this venv has (safetensors, fastsafetensors and
InstantTensor come with vLLM): every loader that can load onto the CPU has its
bytes checked against the files, one that cannot is reported with its own
error, one that does not import is left out by name, and the JSON can be
printed again. Its checker and its page toucher are tried on their own."""
import errno
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("fst")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PEERS = os.path.join(REPO, "bench", "peers.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import peers  # noqa: E402


@pytest.fixture
def ckpt(tmp_path):
    """Two shards, odd sizes and several dtypes: (folder, {name: tensor})."""
    g = torch.Generator().manual_seed(7)
    first = {"a.weight": torch.randn(37, 1001, generator=g),
             "a.scale": torch.randn(7, 513, generator=g).to(torch.bfloat16),
             "b.blocks": torch.randint(0, 256, (12345,), dtype=torch.uint8, generator=g)}
    second = {"c.weight": torch.randn(300, 2049, generator=g).to(torch.float16),
              "c.bias": torch.randn(3, generator=g), "d.empty": torch.zeros(0, 4)}
    d = tmp_path / "ck"
    d.mkdir()
    st_torch.save_file(first, str(d / "model-00001-of-00002.safetensors"))
    st_torch.save_file(second, str(d / "model-00002-of-00002.safetensors"))
    return str(d), {**first, **second}


def run_peers(*args):
    return subprocess.run([sys.executable, PEERS, *args], capture_output=True, text=True,
                          timeout=600)


def test_side_by_side_on_the_cpu(ckpt, tmp_path):
    path, _ = ckpt
    out = tmp_path / "peers.json"
    fst_bin = os.environ.get("FST_BIN", "build/fst")
    wanted = ["fst.load", "fst.iter_tensors", "fst.iter_into_params", "safetensors",
              "fastsafetensors", "instanttensor", "runai"]
    r = run_peers(path, "--device", "cpu", "--rounds", "2", "--no-cold", "--fst-bin", fst_bin,
                  "--only", ",".join(wanted), "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    # a peer that does not import (Run:ai's streamer is not in this venv) is
    # left out by name, saying why
    if "runai" not in doc["seconds"]:
        assert "left out runai: ModuleNotFoundError" in r.stdout, r.stdout
    assert doc["device"] == "cpu" and doc["modes"] == ["warm"]
    assert doc["bytes"] == sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    # the limits of each round, measured by fst bench before its first warm
    # pass and after its last
    assert len(doc["limits"]) == 2 and all(x["pread"] > 0 and x["pread_end"] > 0
                                           for x in doc["limits"]), doc["limits"]
    assert "limits at the start and the end of each round's warm passes: pread " in r.stdout
    # the share of the CPUs' time the host took during each timed load (none
    # where the load took less than one clock tick of /proc/stat)
    assert all("steal" in p for p in doc["passes"]), doc["passes"]
    # without --settle a process's clock starts once its imports are done (a
    # loader that failed, InstantTensor on the CPU, has no such figure)
    ready = [p for p in doc["passes"] if p["since_setup_seconds"] is not None]
    assert {p["loader"] for p in ready} >= {"fst.load", "safetensors"}, doc["passes"]
    assert all(p["settle"] == 0 and 0 <= p["since_setup_seconds"] < 0.4 for p in ready), ready
    stolen = [p["steal"] for p in doc["passes"] if p["steal"] is not None]
    assert all(0 <= x <= 1 for x in stolen), doc["passes"]
    if stolen:
        assert "warm, CPU time stolen by the host during the loads: round " in r.stdout
    for name in ("fst.load", "fst.iter_tensors", "fst.iter_into_params", "safetensors",
                 "fastsafetensors"):
        secs = doc["seconds"][name]["warm"]
        assert len(secs) == 2 and all(s and s > 0 for s in secs), (name, secs, r.stdout)
        assert doc["info"][name]["check"] == "bytes equal", (name, doc["info"][name])
        assert f"| {name} |" in r.stdout
    # InstantTensor loads onto CUDA devices only: its own error, no figure
    it = doc["info"].get("instanttensor")
    if it is not None:
        assert it.get("errors") and "CUDA" in it["errors"][0], it
        assert not any(doc["seconds"]["instanttensor"]["warm"])
    assert "warm, over the rounds: fst.load " in r.stdout
    assert "fst.iter_into_params" in r.stdout and "x fst.load" in r.stdout
    # the finished run's tables again, from its JSON alone
    again = run_peers(path, "--device", "cpu", "--rounds", "0", "--no-cold", "--append",
                      "--fst-bin", fst_bin, "--only", "fst.load", "--json", str(out))
    assert again.returncode == 0, again.stderr
    table = [line for line in r.stdout.splitlines() if line.startswith("| fst.load |")]
    assert table and table[0] in again.stdout.splitlines()
    # --append refuses another device's file
    other = run_peers(path, "--device", "cuda:0", "--rounds", "0", "--no-cold", "--append",
                      "--fst-bin", fst_bin, "--only", "fst.load", "--json", str(out))
    assert other.returncode != 0 and "another checkpoint, device or modes" in other.stderr


def test_settle_waits_before_every_clock(ckpt, tmp_path):
    """--settle S: each loader's process waits S seconds, ready, before its
    clock starts; the wait is in since_setup_seconds, not in the timed seconds."""
    out = tmp_path / "peers.json"
    r = run_peers(ckpt[0], "--device", "cpu", "--rounds", "1", "--no-cold", "--settle", "0.4",
                  "--fst-bin", os.environ.get("FST_BIN", "build/fst"),
                  "--only", "fst.load,safetensors", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    passes = json.loads(out.read_text())["passes"]
    assert [p["loader"] for p in passes] == ["fst.load", "safetensors"], passes
    for p in passes:
        assert p["settle"] == 0.4 and p["since_setup_seconds"] >= 0.4, p
    secs = json.loads(out.read_text())["seconds"]
    assert all(s["warm"][0] < 0.4 for s in secs.values()), secs
    assert "waited before its clock (--settle), s: 0.4" in r.stdout


def test_passes_give_each_round_the_median_of_its_sweeps(ckpt, tmp_path):
    """--passes N: N sweeps over the loaders in a warm round, each pass a fresh
    process; a loader's round figure is the median of its passes."""
    out = tmp_path / "peers.json"
    r = run_peers(ckpt[0], "--device", "cpu", "--rounds", "1", "--no-cold", "--passes", "3",
                  "--fst-bin", os.environ.get("FST_BIN", "build/fst"),
                  "--only", "fst.load,safetensors", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    passes = doc["passes"]
    assert [(p["sweep"], p["loader"]) for p in passes] == \
        [(k, n) for k in (1, 2, 3) for n in ("fst.load", "safetensors")], passes
    for name in ("fst.load", "safetensors"):
        timed = [p["timed_seconds"] for p in passes if p["loader"] == name]
        assert len(timed) == 3 and all(t > 0 for t in timed), timed
        assert doc["seconds"][name]["warm"] == [statistics.median(timed)], (name, doc)
        # bytes checked once, in the loader's first pass
        assert doc["info"][name]["check"] == "bytes equal", doc["info"][name]
    assert r.stdout.count("round 1 warm fst.load: ") == 3, r.stdout
    assert "the median of a loader's passes in its round (--passes, at most 3)" in r.stdout
    # the limits measured at the round's start, before sweeps 2 and 3 and at
    # its end; the round's limit is the median of the four (onto the CPU there
    # is no pinned copy limit)
    lim = doc["limits"][0]
    assert lim.get("pinned_copy") is None and "pinned_copy_between" not in lim, lim
    got = [lim["pread"], *lim["pread_between"], lim["pread_end"]]
    assert len(got) == 4 and all(x > 0 for x in got), lim
    assert peers.limit_of(lim, "pread") == statistics.median(got), lim
    assert r.stdout.index("round 1 limits before sweep 2: ") < \
        r.stdout.index("round 1 limits before sweep 3: ") < r.stdout.index("round 1 limits at the end")
    # below the table, every pass's spread beside every limit measurement's
    spread = next(x for x in r.stdout.splitlines() if x.startswith("warm, every pass"))
    fastest = doc["bytes"] / min(p["timed_seconds"] for p in passes if p["loader"] == "fst.load")
    assert "fst.load " in spread and f"-{fastest / 1e9:.2f} (" in spread, spread
    assert f"pread limit {min(got):.2f}-{max(got):.2f} (" in spread, spread


def test_limits_between_sweeps_when_a_read_pattern_leads_the_order(ckpt, tmp_path):
    """A read pattern (cold only) first in the order: the limits are still
    measured before the second sweep."""
    out = tmp_path / "peers.json"
    r = run_peers(ckpt[0], "--device", "cpu", "--rounds", "1", "--no-cold", "--passes", "2",
                  "--fst-bin", os.environ.get("FST_BIN", "build/fst"),
                  "--only", "read:willneed,fst.load", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    lim = json.loads(out.read_text())["limits"][0]
    assert len(lim["pread_between"]) == 1 and lim["pread_between"][0] > 0, lim
    assert "round 1 limits before sweep 2: " in r.stdout, r.stdout


def test_passes_below_one_are_refused(ckpt):
    r = run_peers(ckpt[0], "--device", "cpu", "--no-cold", "--only", "fst.load", "--passes", "0")
    assert r.returncode != 0 and "--passes: 0: 1 or more" in r.stderr, r.stderr
    assert "round 1" not in r.stdout


@pytest.mark.parametrize("settle", ["-1", "nan"])
def test_a_settle_that_is_not_seconds_is_refused(ckpt, settle):
    r = run_peers(ckpt[0], "--device", "cpu", "--no-cold", "--only", "fst.load",
                  "--settle", settle)
    assert r.returncode != 0 and "--settle: " in r.stderr and "0 or more" in r.stderr, r.stderr
    assert "round 1" not in r.stdout


def test_a_rounds_limit_is_the_median_of_its_measurements():
    assert peers.limit_of({"pread": 40.0, "pread_end": 50.0}, "pread") == 45.0
    assert peers.limit_of({"pread": 40.0, "pread_between": [47.0, 44.0], "pread_end": 50.0},
                          "pread") == 45.5
    assert peers.limit_of({"pread": 40.0, "pread_between": [47.0], "pread_end": 50.0},
                          "pread") == 47.0
    # runs that measured only at the start, or where one pass failed
    assert peers.limit_of({"pread": 40.0}, "pread") == 40.0
    assert peers.limit_of({"pread_end": 50.0}, "pread") == 50.0
    assert peers.limit_of({}, "pread") is None
    drift = peers.limits_drift([{"pread": 40.0, "pread_end": 50.0, "pinned_copy": 54.0},
                                {"pread": 50.0, "pread_end": 45.0, "pinned_copy": 54.0}])
    assert "pread 40.00->50.00, 50.00->45.00 GB/s (end / start 0.900-1.250x)" in drift, drift
    assert "pinned copy" not in drift  # no end measured for it
    assert peers.limits_drift([{"pread": 40.0}]) == ""


def test_warm_spread_names_the_loader_and_the_limit_that_moved():
    gb = 1e9
    passes = [{"mode": "warm", "loader": "fst.load", "timed_seconds": t} for t in (0.5, 0.4)]
    passes += [{"mode": "warm", "loader": "once", "timed_seconds": 1.0},
               {"mode": "cold", "loader": "fst.load", "timed_seconds": 10.0},
               {"mode": "warm", "loader": "failed", "timed_seconds": None},
               {"mode": "warm", "loader": "failed", "timed_seconds": None}]
    lims = [{"pread": 40.0, "pread_between": [60.0], "pread_end": 50.0, "pinned_copy": 54.0},
            {"pread": 45.0, "pinned_copy": 55.0, "pinned_copy_end": 0}]
    line = peers.warm_spread(passes, lims, 20 * gb)
    # a loader with one warm pass, cold passes and failed passes are left out
    assert line == ("warm, every pass over the rounds, slowest-fastest GB/s (fastest / slowest): "
                    "fst.load 40.00-50.00 (1.250x); pread limit 40.00-60.00 (1.500x); "
                    "pinned copy limit 54.00-55.00 (1.019x)"), line
    # nothing to compare: no loader with two warm passes
    assert peers.warm_spread(passes[2:], lims, 20 * gb) == ""


def test_rounds_where_the_pread_ratio_was_out_of_reach(capsys):
    # round 2's pinned copy limit (54) is below 0.98x its pread limit (58):
    # no loader onto a GPU passes the copy limit, so none reaches 0.98x there
    pread, copy = [48.0, 58.0, 50.0], [55.0, 54.0, None]
    assert peers.beyond_reach([0, 1, 2], pread, copy) == (
        " (out of any loader's reach in 1: the pinned copy limit below 0.98x the pread limit)")
    assert peers.beyond_reach([0, 2], pread, copy) == ""  # not a round of these
    figures = {"fst.load": [49.0, 51.0, None], "peer": [40.0, 42.0, 41.0]}
    peers.summarize(["warm"], 3, ["fst.load", "peer"], lambda n, mode: figures[n], pread, copy)
    out = capsys.readouterr().out
    # round 3 has no fst figure, so two rounds count, one of them out of reach
    assert ("warm, over the rounds: fst.load ahead of every peer in 2 of 2 rounds, "
            "1.214-1.225x the fastest; 0.879-1.021x the pread limit, >= 0.98x in 1 of 2 "
            "rounds (out of any loader's reach in 1: the pinned copy limit below 0.98x the "
            "pread limit)") in out, out


def test_stolen_cpu_time_from_proc_stat():
    before = peers.cpu_ticks()
    assert before and before[0] > 0 and 0 <= before[1] <= before[0]
    assert peers.stolen_share((1000, 10), (1400, 110)) == 0.25
    # no sample, or no time between the two: no figure
    assert peers.stolen_share(None, (1400, 110)) is None
    assert peers.stolen_share((1000, 10), (1000, 10)) is None
    lines = peers.steal_lines([{"round": 1, "mode": "warm", "steal": 0.0},
                               {"round": 1, "mode": "warm", "steal": 0.25},
                               {"round": 2, "mode": "warm", "steal": None},
                               {"round": 2, "mode": "cold", "steal": 0.01}],
                              ["warm", "cold"])
    assert lines == ["warm, CPU time stolen by the host during the loads: round 1 0.0%-25.0%",
                     "cold, CPU time stolen by the host during the loads: round 2 1.0%-1.0%"]


def test_check_names_what_differs(ckpt):
    path, tensors = ckpt
    files = peers.files_of(path)
    assert peers.check(dict(tensors), files) == "bytes equal"
    flipped = dict(tensors)
    t = flipped["c.weight"].clone()
    t.view(torch.uint8).reshape(-1)[4097] ^= 1
    flipped["c.weight"] = t
    assert peers.check(flipped, files).endswith("c.weight: bytes differ")
    missing = {k: v for k, v in tensors.items() if k != "a.scale"}
    assert peers.check(missing, files).endswith("a.scale missing")
    extra = dict(tensors, stray=torch.zeros(1))
    assert peers.check(extra, files) == "1 tensors not in the files"


def test_touch_pages_reads_every_page_of_every_tensor(ckpt):
    _, tensors = ckpt
    want = sum(int(np.frombuffer(t.contiguous().view(torch.uint8).numpy().tobytes(),
                                 dtype=np.uint8)[::4096].sum())
               for t in tensors.values() if t.numel())
    assert want > 0
    assert peers.touch_pages(tensors) == want


@pytest.mark.parametrize("only, says", [
    ("fst.load,no.such.loader", "no loader or read pattern 'no.such.loader'"),
    ("safetensors:io=pread", "load options (after ':') are fst's only"),
    ("read:sideways", "no loader or read pattern 'read:sideways'"),
])
def test_a_wrong_loader_name_is_refused_before_anything_runs(ckpt, only, says):
    r = run_peers(ckpt[0], "--device", "cpu", "--no-cold", "--only", only)
    assert r.returncode != 0 and says in r.stderr, r.stdout + r.stderr
    assert "round 1" not in r.stdout


def test_cold_round_with_a_read_pattern(ckpt, tmp_path):
    """Cold: the caches emptied before each pass (drop_caches as root, else
    each file evicted), a read pattern beside the loaders, and each loader's
    figure as a ratio to the round's best pattern."""
    path, _ = ckpt
    out = tmp_path / "cold.json"
    r = run_peers(path, "--device", "cpu", "--rounds", "1", "--no-warm",
                  "--only", "fst.load,safetensors,read:buffered,read:willneed-fresh", "--json",
                  str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["modes"] == ["cold"] and doc["evicted_by"] in ("drop_caches", "posix_fadvise")
    for name in ("fst.load", "safetensors"):
        assert doc["info"][name]["check"] == "bytes equal", doc["info"][name]
        assert doc["seconds"][name]["cold"][0] > 0
    assert doc["seconds"]["read:buffered"]["cold"][0] > 0
    assert doc["seconds"]["read:willneed-fresh"]["cold"][0] > 0
    assert "check" not in doc["info"]["read:buffered"]  # a pattern loads nothing
    row = next(line for line in r.stdout.splitlines() if line.startswith("| fst.load |"))
    assert row.split("|")[6].strip() not in ("", "-"), row  # × best read


def test_cold_scrub_rate_before_every_pass(ckpt, tmp_path):
    """--scrub: the other files read with O_DIRECT before each cold pass, and
    that read's rate recorded with the pass and printed, loader by loader: the
    disk each loader met."""
    path, _ = ckpt
    scrub = tmp_path / "scrub.bin"
    scrub.write_bytes(os.urandom(8 << 20))
    out = tmp_path / "cold.json"
    r = run_peers(path, "--device", "cpu", "--rounds", "2", "--no-warm", "--scrub", str(scrub),
                  "--only", "fst.load,safetensors", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["evicted_by"].endswith(" + scrub"), doc["evicted_by"]
    passes = doc["passes"]
    assert [(p["round"], p["loader"]) for p in passes] == \
        [(1, "fst.load"), (1, "safetensors"), (2, "safetensors"), (2, "fst.load")], passes
    for p in passes:
        assert p["scrub_seconds"] > 0, p
        # each rounded in the JSON (seconds to 4 places, GB/s to 3)
        assert p["scrub_gbps"] == pytest.approx((8 << 20) / p["scrub_seconds"] / 1e9,
                                                rel=0.03, abs=0.002), p
        line = next(x for x in r.stdout.splitlines()
                    if x.startswith(f"round {p['round']} cold {p['loader']}: "))
        assert f"scrub {p['scrub_gbps']:.2f} GB/s" in line, line
    summary = next(x for x in r.stdout.splitlines() if x.startswith("cold, the scrub's"))
    assert f"round 2 safetensors {passes[2]['scrub_gbps']:.2f}, " \
        f"fst.load {passes[3]['scrub_gbps']:.2f}" in summary, summary


def test_no_scrub_no_scrub_rate(ckpt, tmp_path):
    out = tmp_path / "cold.json"
    r = run_peers(ckpt[0], "--device", "cpu", "--rounds", "1", "--no-warm",
                  "--only", "fst.load", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert all("scrub_gbps" not in p for p in json.loads(out.read_text())["passes"])
    assert ", scrub " not in r.stdout and "cold, the scrub's" not in r.stdout, r.stdout


def test_read_ahead_pattern_into_fresh_memory(ckpt):
    """read:willneed-fresh: every request lands in its own place of one new
    mapping, so the mapping holds the files end to end; the reused-buffer
    way returns nothing to unmap."""
    import coldcache
    path, _ = ckpt
    files = peers.files_of(path)
    whole = b"".join(open(f, "rb").read() for f in files)
    dst = coldcache.read_ahead_pattern(files, 3, 8192, 4 * 8192, fresh=True)
    try:
        assert len(dst) == len(whole)
        assert dst[:] == whole
    finally:
        dst.close()
    assert coldcache.read_ahead_pattern(files, 3, 8192, 4 * 8192) is None


@pytest.mark.parametrize("direct", [False, True])
def test_read_pattern_into_fresh_memory(ckpt, direct):
    """read:direct-small-fresh: every request lands in its own place of one
    new mapping, each file from a request-aligned place, so the mapping
    holds every file whole at its place (with O_DIRECT where the file
    system takes it)."""
    import coldcache
    path, _ = ckpt
    files = peers.files_of(path)
    req = 8192
    try:
        kept = coldcache.read_pattern(files, 3, req, direct, False, fresh=True)
    except OSError as e:
        if direct and e.errno == errno.EINVAL:
            pytest.skip(f"no O_DIRECT on this file system: {e}")
        raise
    dst, bases = kept
    try:
        assert len(bases) == len(files)
        for f, base in zip(files, bases):
            want = open(f, "rb").read()
            assert base % req == 0
            assert dst[base:base + len(want)] == want, f
    finally:
        dst.close()
    assert coldcache.read_pattern(files, 3, req, direct, False) is None


def test_huge_buffer_and_read_pattern_into_it(ckpt):
    """read:direct-small-huge: each thread's buffer starts at a 2 MiB boundary
    and holds the request; the pattern reads every byte through it (its own
    count checks) and, reusing it, returns nothing."""
    import ctypes
    import coldcache
    m, mv = coldcache.huge_buffer(3 * 8192)
    try:
        assert len(mv) == 3 * 8192
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        assert addr % (2 << 20) == 0
        mv[:5] = b"bytes"
        assert bytes(mv[:5]) == b"bytes"
    finally:
        mv.release()
        m.close()
    path, _ = ckpt
    files = peers.files_of(path)
    assert coldcache.read_pattern(files, 3, 8192, False, False, huge=True) is None
