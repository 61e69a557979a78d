"""`fst load`, `fst verify` and `fst bench` on small `fst gen` checkpoints.

Each command runs for every --io method and a few --threads values; the
numbers they print are checked against `fst inspect --json` (the format
layer's view, itself checked against the reference reader elsewhere) and the
files on disk. Error paths check the documented exit codes (docs/cli.md) and
that stderr says what went wrong.

Not covered: verify's exit 3 (a mismatch) needs loaded bytes that differ from
the file, which no honest input produces: the load reads the same file that
verify then reads (an LD_PRELOAD shim corrupting reads would be the way).
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import fsttest
from fsttest import fst, inspect_ok

IOS = ["auto", "pread", "uring", "mmap"]
THREADS = [1, 2, 5]
JSON_KEYS = {"path", "device", "tensors", "bytes", "seconds", "gbps", "path_chosen", "peak_rss"}

SUMMARY = re.compile(
    r"^loaded (?P<path>.+) onto (?P<device>\S+): (?P<tensors>\d+) tensors from "
    r"(?P<files>\d+) files?, (?P<human>[\d.]+ (?:B|KiB|MiB|GiB)) in (?P<secs>[\d.]+) s "
    r"\((?P<gbps>[\d.]+) GB/s\)$"
)


def truth(path):
    """(files, tensors, tensor bytes, file bytes) of a checkpoint per fst inspect."""
    doc = inspect_ok(path)
    tensors = sum(len(f["tensors"]) for f in doc)
    nbytes = sum(t["data_offsets"][1] - t["data_offsets"][0] for f in doc for t in f["tensors"])
    file_bytes = sum(os.path.getsize(f["path"]) for f in doc)
    return len(doc), tensors, nbytes, file_bytes


@pytest.fixture(scope="module")
def small(gen_dir):
    return gen_dir(shards=3, seed=11, size="512KiB")


@pytest.fixture(scope="module")
def misaligned(gen_dir):
    return gen_dir(shards=2, seed=12, size="384KiB", misaligned=True)


def expect_describe(line, io, threads):
    """The "path chosen and why" text for an io method."""
    if io == "mmap":
        assert line.startswith("mmap: read-only views of the files, no copy"), line
        assert "asked for (io=mmap)" in line
        return
    reader = {"pread": "pread", "uring": "uring"}.get(io)
    if reader:
        assert line.startswith(f"{reader}, {threads} thread{'s' if threads > 1 else ''}, "), line
        assert f"asked for (io={io})" in line
    else:
        # auto: the files were just written, so they are in the page cache
        assert re.search(r"^(pread|uring), \d+ threads?, ", line), line
        assert re.search(r"auto: \d+% of the data in the page cache", line), line


# ------------------------------------------------------------------ load

@pytest.mark.parametrize("io", IOS)
@pytest.mark.parametrize("threads", THREADS)
def test_load_summary(small, io, threads):
    files, tensors, nbytes, _ = truth(small)
    # 4 KiB chunks: enough chunks that every thread gets work
    r = fst("load", small, "--io", io, "--threads", threads, "--chunk", "4KiB")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    m = SUMMARY.match(lines[0])
    assert m, lines[0]
    assert m["path"] == str(small)
    assert m["device"] == "cpu"
    assert int(m["tensors"]) == tensors
    assert int(m["files"]) == files
    assert float(m["secs"]) >= 0  # printed to the millisecond
    assert float(m["gbps"]) >= 0
    assert lines[1].startswith("  path: ")
    expect_describe(lines[1][len("  path: "):], io, threads)
    assert re.match(r"^  header parsing [\d.]+ s; peak RSS [\d.]+ (B|KiB|MiB|GiB)$", lines[2]), lines[2]


@pytest.mark.parametrize("io", IOS)
def test_load_json(small, io):
    files, tensors, nbytes, _ = truth(small)
    r = fst("load", small, "--io", io, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert JSON_KEYS <= set(doc), doc
    assert doc["path"] == str(small)
    assert doc["device"] == "cpu"
    assert doc["tensors"] == tensors
    assert doc["bytes"] == nbytes
    assert doc["files"] == files
    assert isinstance(doc["seconds"], float) and doc["seconds"] > 0
    assert isinstance(doc["gbps"], float) and doc["gbps"] >= 0
    assert doc["gbps"] == pytest.approx(nbytes / doc["seconds"] / 1e9, rel=1e-6)
    assert isinstance(doc["peak_rss"], int) and doc["peak_rss"] > 0
    assert 0 <= doc["open_seconds"] <= doc["seconds"]
    if io == "mmap":
        assert doc["allocated"] == 0
    else:
        assert doc["allocated"] >= nbytes
    expect_describe(doc["path_chosen"], io, 2)  # threads unchecked for auto/mmap
    assert r.stderr == ""


def test_load_json_default_threads(small):
    r = fst("load", small, "--io", "pread", "--json")
    doc = json.loads(r.stdout)
    assert re.match(r"^pread, \d+ threads?, 16 MiB chunks: asked for \(io=pread\)$",
                    doc["path_chosen"]), doc["path_chosen"]


def test_load_inputs(small, misaligned):
    """A directory, its index, one shard: each loads what inspect lists."""
    shard = sorted(small.glob("*.safetensors"))[0]
    index = small / "model.safetensors.index.json"
    for path in (small, index, shard, misaligned):
        _, tensors, nbytes, _ = truth(path)
        r = fst("load", path, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert (doc["tensors"], doc["bytes"]) == (tensors, nbytes), path


def test_load_options(small):
    _, tensors, nbytes, _ = truth(small)
    for extra in fsttest.io_cases(["--staging", "1MiB", "--io", "uring", "--chunk", "64KiB"],
                                  ["--pinned", "--io", "pread"],
                                  ["--gds", "off"],
                                  ["--device", "cpu", "--no-progress"],
                                  ["--chunk", "1GiB"],
                                  ["--stream", "8KiB", "--chunk", "4KiB", "--threads", "3"],
                                  ["--stream", "off"]):
        r = fst("load", small, "--json", *extra)
        assert r.returncode == 0, (extra, r.stderr)
        assert json.loads(r.stdout)["bytes"] == nbytes


def test_load_help():
    r = fst("load", "--help")
    assert r.returncode == 0
    for opt in ("--device", "--io", "--threads", "--chunk", "--staging", "--pinned", "--gds",
                "--stream", "--json", "--no-progress"):
        assert opt in r.stdout, opt


# ---------------------------------------------------------------- verify

@pytest.mark.parametrize("io", IOS)
@pytest.mark.parametrize("which", ["small", "misaligned"])
def test_verify_ok(small, misaligned, io, which):
    path = small if which == "small" else misaligned
    _, tensors, nbytes, _ = truth(path)
    r = fst("verify", path, "--io", io, "--threads", "3", "--chunk", "8KiB")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    m = re.match(r"^verified (.+): (\d+) tensors, (.+) byte-identical to the files "
                 r"\(load [\d.]+ s, (.+)\)$", r.stdout.strip())
    assert m, r.stdout
    assert m[1] == str(path)
    assert int(m[2]) == tensors
    expect_describe(m[4], io, 3)


# ------------------------------------------------------------ exit codes

@pytest.mark.parametrize("cmd", ["load", "verify", "bench"])
@pytest.mark.parametrize("args,needle", [
    (["--io", "fast"], '--io "fast"'),
    (["--threads", "0"], '--threads "0"'),
    (["--threads", "65"], '--threads "65"'),
    (["--chunk", "1"], '--chunk "1"'),
    (["--chunk", "2GiB"], '--chunk "2GiB"'),
    (["--staging", "1K"], '--staging "1K"'),
    (["--gds", "maybe"], '--gds "maybe"'),
    (["--stream", "0"], '--stream "0"'),
    (["--stream", "on"], '--stream "on"'),
    (["--bogus"], "usage:"),
])
def test_usage_errors(small, cmd, args, needle):
    r = fst(cmd, small, *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("cmd", ["load", "verify", "bench"])
def test_path_count(small, cmd):
    r = fst(cmd)
    assert r.returncode == 1
    assert "no PATH given" in r.stderr
    r = fst(cmd, small, small)
    assert r.returncode == 1
    assert "one PATH expected" in r.stderr


@pytest.mark.parametrize("cmd", ["load", "verify"])
def test_bad_device(small, cmd):
    r = fst(cmd, small, "--device", "gpu")
    assert r.returncode == 1
    assert 'device "gpu"' in r.stderr
    # no GPU target (or no GPU) here: a clean unsupported / device error
    r = fst(cmd, small, "--device", "cuda:0")
    if r.returncode != 0:
        assert r.returncode in (6, 7), r.stderr
        assert "cuda" in r.stderr


@pytest.mark.parametrize("cmd", ["load", "verify", "bench"])
def test_invalid_inputs(tmp_path, small, cmd):
    shard = sorted(small.glob("*.safetensors"))[0]
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(shard.read_bytes()[:-5])
    r = fst(cmd, cut)
    assert r.returncode == 2, r.stderr
    assert str(cut) in r.stderr
    empty = tmp_path / "nothing"
    empty.mkdir()
    r = fst(cmd, empty)
    assert r.returncode == 2
    assert "holds no *.safetensors files" in r.stderr
    r = fst(cmd, tmp_path / "missing.safetensors")
    assert r.returncode == 4
    assert "cannot open" in r.stderr


@pytest.mark.parametrize("cmd", ["load", "verify"])
def test_faults(small, cmd):
    files, _, _, _ = truth(small)
    # the first read is a header's length
    r = fst(cmd, small, env={"FST_FAULT": "read:1"})
    assert r.returncode == 4, r.stderr
    assert "Input/output error" in r.stderr
    # one read of the index, two per file at open; the next one is tensor data
    index = len(list(Path(small).glob("*.safetensors.index.json")))
    r = fst(cmd, small, "--io", "pread",
            env={"FST_FAULT": f"read:{index + 2 * files + 1}:ENOSPC"})
    assert r.returncode == 4, r.stderr
    assert re.search(r"read of \d+ bytes at offset \d+ failed: No space left on device", r.stderr)
    r = fst(cmd, small, "--io", "pread", env={"FST_FAULT": "short_read:1"})
    assert r.returncode == 8, r.stderr
    assert "truncated during the load" in r.stderr
    if not fsttest.uring_unavailable():
        r = fst(cmd, small, "--io", "uring", env={"FST_FAULT": "uring_complete:1"})
        assert r.returncode == 4, r.stderr
    r = fst(cmd, small, "--io", "mmap", env={"FST_FAULT": "mmap:1"})
    assert r.returncode == 4, r.stderr
    assert "mmap failed" in r.stderr
    r = fst(cmd, small, env={"FST_FAULT": "host_alloc:1"})
    assert r.returncode == 5, r.stderr
    assert "host memory" in r.stderr
    r = fst(cmd, small, "--pinned", env={"FST_FAULT": "pin:1:ENOMEM"})
    assert r.returncode == 5, r.stderr
    assert "page-lock" in r.stderr


@pytest.mark.parametrize("cmd", ["load", "verify", "bench"])
def test_bad_fault_spec(small, cmd):
    r = fst(cmd, small, env={"FST_FAULT": "bogus:1"})
    assert r.returncode == 1
    assert "unknown fault site" in r.stderr
    r = fst(cmd, small, env={"FST_FAULT": "read:zero"})
    assert r.returncode == 1
    assert "positive integer" in r.stderr


# ----------------------------------------------------------------- bench

WARM_ROWS = ["plain sequential read (warm)", "parallel pread limit (warm)",
             "fst load (warm, first)", "fst load (warm)"]
COLD_ROWS = ["O_DIRECT read limit (cold)", "fst load (cold)"]


def assert_in_order(names, wanted):
    """wanted appear in names, in this order (other rows may sit between)."""
    at = [names.index(w) if w in names else -1 for w in wanted]
    assert -1 not in at and at == sorted(at), (names, wanted)


def test_bench_text(small):
    r = fst("bench", small, "--runs", "1", "--no-cold", timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"bench {small} on cpu: ")
    assert "cold runs not measured" in out
    for row in WARM_ROWS + ["reference safetensors (warm)"]:
        assert re.search(rf"^{re.escape(row)} +[\d.]+ +[\d.]+  ", out, re.M), (row, out)
    assert "(cold)" not in out
    assert re.search(r"^ratios:.* fst_warm_vs_pread_limit=[\d.]+", out, re.M), out


def test_bench_json(small):
    _, _, nbytes, file_bytes = truth(small)
    r = fst("bench", small, "--runs", "2", "--no-cold", "--no-reference", "--threads", "2",
            "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["path"] == str(small)
    assert doc["device"] == "cpu"
    assert doc["tensor_bytes"] == nbytes
    assert doc["file_bytes"] == file_bytes
    assert doc["threads"] == 2
    assert doc["runs"] == 2
    assert doc["cold_resident"] == -1
    assert 0 <= doc["warm_resident"] <= 1
    rows = {row["name"]: row for row in doc["rows"]}
    assert_in_order(list(rows), WARM_ROWS)
    assert not [n for n in rows if "cold" in n or "reference" in n], list(rows)
    for row in rows.values():
        assert set(row) == {"name", "seconds", "gbps", "notes"}
    for name in ("fst load (warm)", "parallel pread limit (warm)"):
        assert rows[name]["gbps"] > 0, rows[name]
        assert rows[name]["seconds"] > 0
    fst_row = rows["fst load (warm)"]
    assert fst_row["gbps"] == pytest.approx(nbytes / fst_row["seconds"] / 1e9, rel=1e-6)
    assert "2 threads" in rows["parallel pread limit (warm)"]["notes"]
    assert fst_row["notes"].startswith(("pread", "uring"))
    ratio = doc["ratios"]["fst_warm_vs_pread_limit"]
    pl = rows["parallel pread limit (warm)"]["gbps"]
    assert ratio == pytest.approx(fst_row["gbps"] / pl, rel=1e-6)


def test_bench_cold(small):
    """With the cold runs: the files are evicted (only these small files)."""
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(small)], capture_output=True, text=True)
    if fs.stdout.strip() in ("tmpfs", "ramfs"):
        pytest.skip(f"{small} is on {fs.stdout.strip()}: nothing can be evicted there "
                    "(test_cli_output.py checks the skipped cold rows)")
    r = fst("bench", small, "--runs", "1", "--no-reference", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    names = [row["name"] for row in doc["rows"]]
    assert_in_order(names, WARM_ROWS + COLD_ROWS)
    assert not [n for n in names if "reference" in n], names
    assert 0 <= doc["cold_resident"] <= 1
    cold = {row["name"]: row for row in doc["rows"]}["fst load (cold)"]
    assert cold["gbps"] > 0
    assert "fst_cold_vs_odirect_limit" in doc["ratios"]


def test_bench_load_failure_reported(small):
    """A failed fst load shows in the row's note and the exit code."""
    r = fst("bench", small, "--runs", "1", "--no-cold", "--no-reference", "--json",
            env={"FST_FAULT": "host_alloc:1"}, timeout=120)
    assert r.returncode == 5, r.stderr
    doc = json.loads(r.stdout)
    row = {x["name"]: x for x in doc["rows"]}["fst load (warm)"]
    assert row["notes"].startswith("failed: cannot allocate")
    assert row["gbps"] == 0


def test_bench_runs_usage(small):
    for runs in ("0", "101", "x"):
        r = fst("bench", small, "--runs", runs)
        assert r.returncode == 1
        assert "--runs" in r.stderr


def test_fst_gds_environment(gen_dir, cuda_double):
    """FST_GDS decides the GDS policy where the caller left the default: on
    fails with the probe's reason (the double machine has no cuFile), off and
    auto load, a bad value is a usage error naming it."""
    ck = gen_dir(shards=2, seed=3, size="1MiB", tag="-gdsenv")
    base = {"FST_CUDA_LIBRARY": cuda_double, "FST_CUFILE_LIBRARY": "/nonexistent/libcufile.so.0"}
    r = fsttest.fst("load", ck, "--device", "cuda:0", "--no-progress", env=dict(base, FST_GDS="on"))
    assert r.returncode == 7 and "gds=on" in r.stderr and "no cuFile library" in r.stderr
    for policy in ("off", "auto"):
        r = fsttest.fst("load", ck, "--device", "cuda:0", "--no-progress",
                        env=dict(base, FST_GDS=policy))
        assert r.returncode == 0, r.stderr
    r = fsttest.fst("load", ck, "--device", "cuda:0", "--no-progress", env=dict(base, FST_GDS="bogus"))
    assert r.returncode == 1 and 'FST_GDS="bogus"' in r.stderr
    # an explicit --gds wins over the environment
    r = fsttest.fst("load", ck, "--device", "cuda:0", "--gds", "off", "--no-progress",
                    env=dict(base, FST_GDS="on"))
    assert r.returncode == 0, r.stderr


def test_unified_cli_and_doctor(gen_dir, cuda_double):
    """The double as each platform: fst doctor names the class and the path a
    load takes there; fst load --unified and FST_UNIFIED pick the path (the
    load's description says which), --unified on fails on a discrete GPU;
    and without a GPU doctor states each capability with its reason."""
    ck = gen_dir(shards=2, seed=5, size="1MiB", tag="-unified")
    base = {"FST_CUDA_LIBRARY": cuda_double, "FST_CUFILE_LIBRARY": "/nonexistent/libcufile.so.0",
            "FST_DOUBLE_DEVICES": "1"}
    for plat, cls, path in (("discrete", "discrete", "discrete path"),
                            ("integrated", "integrated", "unified memory"),
                            ("coherent", "coherent", "discrete path into the GPU's own memory")):
        env = dict(base, FST_DOUBLE_PLATFORM=plat)
        r = fsttest.fst("doctor", "--no-copy-test", "--json", env=env)
        assert r.returncode == 0, r.stderr
        dev = json.loads(r.stdout)["cuda"]["devices"][0]
        assert dev["platform"] == cls and dev["load_path"].startswith(path), dev
        r = fsttest.fst("doctor", ck, "--no-copy-test", env=env)
        assert r.returncode == 0 and f"platform: {cls}" in r.stdout, r.stdout
    env = dict(base, FST_DOUBLE_PLATFORM="integrated")
    r = fsttest.fst("doctor", ck, "--no-copy-test", "--json", env=env)
    assert "straight into host memory mapped for the GPU" in json.loads(r.stdout)["load"]["plan"]
    r = fsttest.fst("doctor", ck, "--no-copy-test", "--json", env=dict(env, FST_UNIFIED="off"))
    assert "unified=off" in json.loads(r.stdout)["load"]["plan"]
    for flag in ("auto", "off", "on"):
        r = fsttest.fst("load", ck, "--device", "cuda:0", "--unified", flag, "--no-progress",
                        env=env)
        assert r.returncode == 0, r.stderr
    r = fsttest.fst("load", ck, "--device", "cuda:0", "--unified", "on", "--no-progress",
                    env=dict(base, FST_DOUBLE_PLATFORM="discrete"))
    assert r.returncode == 7 and "unified=on" in r.stderr, r.stderr
    r = fsttest.fst("load", ck, "--device", "cuda:0", "--unified", "maybe", "--no-progress",
                    env=env)
    assert r.returncode == 1 and "--unified" in r.stderr
    # no GPU: every capability, with its reason
    r = fsttest.fst("doctor", "--json", env={"FST_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    host = json.loads(r.stdout)["host"]
    for cap in ("io_uring", "O_DIRECT", "huge pages", "CUDA", "GPUDirect Storage"):
        assert cap in host and host[cap]["reason"], (cap, host)
    assert host["CUDA"]["available"] is False and host["GPUDirect Storage"]["available"] is False
