#!/usr/bin/env python3
"""fst beside every peer loader that is importable, on one checkpoint, in
one run: warm (page cache) and cold (caches dropped), alternating rounds,
each loader in a process of its own (so its peak RSS and device memory are
its own), each loader's bytes checked against the file in its first round,
and each figure as a ratio to the machine's limits measured by `fst bench`
in the same round. A markdown table on stdout, JSON with --json.

  python3 bench/make_checkpoints.py /tmp/ck          # 16 GB dense, 13.8 GB MXFP4
  python3 bench/peers.py /tmp/ck/llama3-8b --device cuda:0 --rounds 2 \\
      [--peer-site DIR] [--only fst.load,fastsafetensors] [--no-cold | --no-warm]
      [--scrub DIR] [--check first|none|LOADER,...] [--settle S] [--passes N]
      [--json out.json [--append]]

Loaders (a peer that does not import is reported and left out; LOADER+NAME=VALUE
runs LOADER with one more environment variable, e.g. fst.load+FST_STAGING_PAGES=driver;
an fst loader takes load options after colons, e.g. fst.load:staging_bytes=268435456):
  fst.load, fst.iter_tensors   this package (iter_tensors collected into a dict)
  fst.iter_into_params         fst.iter_tensors with the consumer an engine's load_weights
                               is: each tensor copied into a parameter allocated before the
                               clock starts (torch.empty of the header's dtype and shape)
  safetensors                  the reference: safetensors.torch.load_file per file
  fastsafetensors              SafeTensorsFileLoader(nogds=True) and copy_files_to_device
  instanttensor                instanttensor.safe_open(files, device=N), f.tensors()
                               (its default backend: direct I/O)
  instanttensor.buffered       the same with backend=BackendPolicy.BUFFERED
  runai                        runai_model_streamer's SafetensorsStreamer to the CPU, then .to(device)
Read patterns (cold passes only; the parent reads every byte into host memory, nothing
onto the device; the best of them is what the disk gives, and each loader's cold figure
is also a ratio to it):
  read:direct                  16 threads x 64 MiB preads with O_DIRECT
  read:buffered                16 threads x 64 MiB buffered preads
  read:willneed                16 threads x 4 MiB buffered preads, WILLNEED 1 GiB ahead
  read:willneed-16m            the same in 16 MiB preads (fst's into host memory)
  read:willneed-fresh          the same 16 MiB preads, each into its own place of one new
                               mapping the size of the files (huge pages advised): the
                               faults fst's load into host memory pays, without its plan
  read:direct-small            16 threads x 512 KiB preads with O_DIRECT, one queue
  read:direct-small-huge       the same, each thread's buffer of huge pages (as fst's
                               landing slots are)
  read:direct-small-fresh      the same, each into its own place of one new mapping the
                               size of the files (huge pages advised): what the faults
                               cost fst's O_DIRECT load into host memory
  read:direct-streams          16 threads, each reading a 256 MiB block in order with
                               512 KiB O_DIRECT preads, then the next block (fastsafetensors')
  read:buffered-streams        the same, buffered, 4 MiB preads
Cold needs root for /proc/sys/vm/drop_caches; otherwise each file is evicted
with posix_fadvise(DONTNEED).

Onto the CPU, every loader's clock also covers reading one byte of each 4 KiB page
of its tensors: a loader that returns views of a file mapping (safetensors) reads
the file only then.

Below the table, the share of all CPUs' time the hypervisor took (/proc/stat's steal)
during each round's timed loads: on a virtual machine whose host runs other guests, a
round where that is not near zero says why its figures moved.

The warm limits are measured twice a round, before its first warm pass and after its
last, and each ratio is to their mean: a machine whose copies drift within a round shows
it in the line of limits (start -> end) and in the spread printed below the table (every
warm pass's GB/s and every measurement of each limit, slowest to fastest: which of a loader
and its limit moved). Runs
before 2026-12-06e measured them once, at the start of each round. With --passes N
they are also measured before each sweep after the first (the JSON's `pread_between`,
`pinned_copy_between`), and the round's limit is the median of its N + 1
measurements.

Each loader's modules are imported before its clock starts, as an engine
imports its loader at start-up (the pread limit has no import either); the
import's own time is reported beside the table. Runs before 2026-12-04c
timed the import with the load (fst's: 8-12 ms on the H200).

--settle S makes every loader's process wait S seconds after its CUDA context,
its imports and (fst.iter_into_params) its parameters are ready, before its clock
starts: whether a load that starts at once after its process set up the GPU is the
slower one. Each pass records S (`settle`) and the seconds from its process's
CUDA context being made (on the CPU, the same point: torch imported) to its
clock (`since_setup_seconds`) in the JSON's passes.

--passes N runs each warm round as N sweeps over its loaders (every loader once a
sweep, each pass a fresh process, the sweeps in the round's order) and gives each
loader's round figure as the median of its N passes, so that a round's ratios are
not one pass against one: a warm pass moves by several percent with the machine's
moment on the GPU machines. Every pass's own seconds are in the JSON's passes
(`timed_seconds`, `sweep`); cold rounds stay one pass a loader (each needs the caches
emptied again).
"""
import argparse
import glob
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from coldcache import (make_cold_timed, read_ahead_pattern, read_pattern, read_stream_pattern,
                       scrub_files)

LOADERS = ["fst.load", "fst.iter_tensors", "fst.iter_into_params", "safetensors",
           "fastsafetensors", "instanttensor", "instanttensor.buffered", "runai",
           "read:direct", "read:buffered", "read:willneed", "read:willneed-16m",
           "read:willneed-fresh", "read:direct-small", "read:direct-small-huge", "read:direct-small-fresh",
           "read:direct-streams", "read:buffered-streams"]
MiB = 1 << 20
PATTERNS = {"read:direct": lambda f: read_pattern(f, 16, 64 * MiB, True, False),
            "read:buffered": lambda f: read_pattern(f, 16, 64 * MiB, False, False),
            "read:willneed": lambda f: read_ahead_pattern(f, 16, 4 * MiB, 1 << 30),
            "read:willneed-16m": lambda f: read_ahead_pattern(f, 16, 16 * MiB, 1 << 30),
            "read:willneed-fresh": lambda f: read_ahead_pattern(f, 16, 16 * MiB, 1 << 30,
                                                                fresh=True),
            "read:direct-small": lambda f: read_pattern(f, 16, 512 << 10, True, False),
            "read:direct-small-huge": lambda f: read_pattern(f, 16, 512 << 10, True, False,
                                                             huge=True),
            "read:direct-small-fresh": lambda f: read_pattern(f, 16, 512 << 10, True, False,
                                                              fresh=True),
            "read:direct-streams": lambda f: read_stream_pattern(f, 16, 512 << 10, 256 * MiB,
                                                                 True),
            "read:buffered-streams": lambda f: read_stream_pattern(f, 16, 4 * MiB, 256 * MiB,
                                                                   False)}

# safetensors dtype names as torch dtypes (for the preallocated parameters)
TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                "U16": "uint16", "U32": "uint32", "U64": "uint64"}


def files_of(path):
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def warm(files):
    buf = bytearray(64 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


# ---- the child: one loader, one load, optionally checked

def headers(files):
    """(file, offset of its data, {name: meta}) for each file."""
    import struct
    out = []
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            h = json.loads(fh.read(n))
        h.pop("__metadata__", None)
        out.append((f, 8 + n, h))
    return out


# what each loader imports: done before the clock (child)
MODULES = {"fst.load": ["fst"], "fst.iter_tensors": ["fst"], "fst.iter_into_params": ["fst"],
           "safetensors": ["safetensors.torch"], "fastsafetensors": ["fastsafetensors"],
           "instanttensor": ["instanttensor"], "instanttensor.buffered": ["instanttensor"],
           "runai": ["runai_model_streamer"]}


def kind(name):
    """The loader of a row: "fst.load:io=pread+FST_LOG=debug" is fst.load."""
    return name.split("+")[0].split(":")[0]


def prepare(name, files, device):
    """What a loader is given before the clock starts: the parameters
    fst.iter_into_params copies into, as an engine allocates its model first."""
    if kind(name) != "fst.iter_into_params":
        return None
    import torch
    return {k: torch.empty(m["shape"], dtype=getattr(torch, TORCH_DTYPES[m["dtype"]]),
                           device=device)
            for _, _, h in headers(files) for k, m in h.items()}


def fst_options(name):
    """The load options of "fst.load:staging_bytes=268435456:io=pread" (an
    environment variable after "+" is not one)."""
    opts = {}
    for kv in name.split("+")[0].split(":")[1:]:
        k, _, v = kv.partition("=")
        opts[k] = int(v) if v.isdigit() else v
    return opts


def load_with(name, path, files, device, params=None):
    """{tensor name: tensor} (or an iterator of pairs) by loader `name`."""
    import torch
    opts = fst_options(name)
    name = kind(name)
    dev_index = (torch.device(device).index or 0) if device.startswith("cuda") else None
    if name == "fst.load":
        import fst
        return fst.load(path, device=device, **opts)
    if name == "fst.iter_tensors":
        import fst
        return dict(fst.iter_tensors(path, device=device, **opts))
    if name == "fst.iter_into_params":
        import fst
        for k, t in fst.iter_tensors(path, device=device, **opts):
            params[k].copy_(t)
        return params
    if name == "safetensors":
        from safetensors.torch import load_file
        out = {}
        for f in files:
            out.update(load_file(f, device=device))
        return out
    if name == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup
        ld = SafeTensorsFileLoader(SingleGroup(), device, nogds=True)
        ld.add_filenames({0: files})
        fb = ld.copy_files_to_device()
        out = {k: fb.get_tensor(k) for k in ld.get_keys()}
        return out, (fb, ld)  # kept open until checked
    if name in ("instanttensor", "instanttensor.buffered"):
        import instanttensor
        backend = instanttensor.BackendPolicy.BUFFERED if name.endswith("buffered") else None
        out = {}
        # copy=True (its default): the tensors it yields own their memory
        with instanttensor.safe_open(files, framework="pt", backend=backend,
                                     device=dev_index if dev_index is not None else "cpu") as f:
            for k, t in f.tensors():
                out[k] = t
        return out
    if name == "runai":
        from runai_model_streamer import SafetensorsStreamer
        out = {}
        with SafetensorsStreamer() as s:
            s.stream_files(files)
            for k, t in s.get_tensors():
                out[k] = t.to(device, copy=True)  # CPU views into a reused buffer
        return out
    raise SystemExit(f"unknown loader {name}")


def touch_pages(tensors):
    """One byte of every 4 KiB page of each tensor read (their sum returned
    so the reads cannot be skipped). In host memory a loader may hand back
    views of a file mapping whose bytes are only read on first use
    (safetensors' load_file does): touching every page puts that reading
    inside the clock, as an engine's first use of the weights would. On
    memory that holds its bytes already it costs milliseconds."""
    import torch
    total = 0
    for t in tensors.values():
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if b.numel():
            total += int(b[::4096].sum())
    return total


def check(tensors, files):
    """Every tensor of the files present once, with the file's bytes. Each
    file is read once and copied once to each device its tensors are on, so
    the comparison runs where the tensors are (a tensor-by-tensor copy back
    to the host took longer than most loads)."""
    import numpy as np
    import torch
    seen = 0
    for f, base, header in headers(files):
        whole = torch.from_numpy(np.fromfile(f, dtype=np.uint8))
        on = {torch.device("cpu"): whole}
        for k, meta in header.items():
            if k not in tensors:
                return f"{f}: {k} missing"
            a, b = meta["data_offsets"]
            got = tensors[k].detach().contiguous().reshape(-1).view(torch.uint8)
            if got.device not in on:
                on[got.device] = whole.to(got.device)
            want = on[got.device][base + a:base + b]
            if got.numel() != want.numel() or not torch.equal(got, want):
                return f"{f}: {k}: bytes differ"
            seen += 1
        del on, whole
    if seen != len(tensors):
        return f"{len(tensors) - seen} tensors not in the files"
    return "bytes equal"


def cpu_ticks():
    """All CPUs' time so far from /proc/stat, in clock ticks: (total, stolen),
    stolen being the time the hypervisor ran something else while this
    machine's CPUs had work; None where /proc/stat does not say."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal
    ticks = [int(x) for x in fields[1:9]]
    return sum(ticks), ticks[7]


def stolen_share(before, after):
    """The share of the CPUs' time between two cpu_ticks() samples that the
    hypervisor took, or None."""
    if not before or not after or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def child(a):
    # "LOADER+NAME=VALUE": the loader with one more environment variable,
    # set before anything is imported (e.g. fst.load+FST_STAGING_PAGES=driver)
    for kv in a.child.split("+")[1:]:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    import torch
    files = files_of(a.path)
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=a.device)
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info(torch.device(a.device))[0]
    t_setup = time.perf_counter()
    name = a.child.split("+")[0]  # with its options: load_with reads them
    params = prepare(name, files, a.device)
    t_import = time.perf_counter()
    for m in MODULES[kind(name)]:
        importlib.import_module(m)
    t_import = time.perf_counter() - t_import
    if cuda:
        torch.cuda.synchronize()
    if a.settle:
        time.sleep(a.settle)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ticks0 = cpu_ticks()
    t0 = time.perf_counter()
    got = load_with(name, a.path, files, a.device, params)
    keep = None
    if isinstance(got, tuple):
        got, keep = got
    if cuda:
        torch.cuda.synchronize()
    else:
        touch_pages(got)
    dt = time.perf_counter() - t0
    steal = stolen_share(ticks0, cpu_ticks())
    out = {"seconds": dt, "import_seconds": t_import, "steal": steal,
           "since_setup_seconds": t0 - t_setup,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "rss_before_bytes": rss0 * 1024}
    if cuda:
        out["device_bytes"] = free0 - torch.cuda.mem_get_info(torch.device(a.device))[0]
    if a.check == "child":
        out["check"] = check(got, files)
    if keep is not None:
        keep[0].close()
        keep[1].close()
    print("RESULT " + json.dumps(out), flush=True)


# ---- the parent

def limits(fst_bin, path, device):
    """The machine's warm limits of this round, from `fst bench --json`."""
    if not fst_bin:
        return {}
    cmd = [fst_bin, "bench", path, "--device", device, "--runs", "1", "--json",
           "--no-reference", "--no-cold"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return {"error": r.stderr.strip()[-300:]}
    rows = {row["name"]: row["gbps"] for row in json.loads(r.stdout)["rows"]}
    return {"pread": rows.get("parallel pread limit (warm)"),
            "pinned_copy": rows.get("pinned host-to-device copy limit")}


def measurements(lim, key):
    """A round's measurements of one limit: at the start of its warm passes,
    between its sweeps (--passes) and at their end, those that came out."""
    return [v for v in [lim.get(key), *lim.get(key + "_between", []), lim.get(key + "_end")]
            if v]


def limit_of(lim, key):
    """A round's limit: the median of its measurements (the start alone in
    runs that measured only there); of two, their mean."""
    vals = measurements(lim, key)
    return statistics.median(vals) if vals else None


def importable(name, env):
    if name in PATTERNS:
        return True, ""
    imports = "; ".join(f"import {m}" for m in MODULES[kind(name)])
    r = subprocess.run([sys.executable, "-c", imports], env=env, capture_output=True,
                       text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def run_child(a, name, env, checked):
    if name in PATTERNS:
        files = files_of(a.path)
        ticks0 = cpu_ticks()
        t0 = time.perf_counter()
        kept = PATTERNS[name](files)
        dt = time.perf_counter() - t0
        steal = stolen_share(ticks0, cpu_ticks())
        if isinstance(kept, tuple):
            kept = kept[0]
        if kept is not None:
            kept.close()  # unmapped after the clock, as a loader's memory is
        return {"seconds": dt, "steal": steal}
    cmd = [sys.executable, os.path.abspath(__file__), a.path, "--device", a.device,
           "--child", name, "--settle", str(a.settle)] + (["--check", "child"] if checked else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (r.stderr.strip().splitlines() or ["no result"])[-1][:300]}


def gb(x):
    return f"{x / 1e9:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated loaders")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--peer-site", default=None, help="a folder with the peers' packages")
    ap.add_argument("--fst-bin", default=shutil.which("fst") or "build/fst")
    ap.add_argument("--json", default=None)
    ap.add_argument("--append", action="store_true",
                    help="continue the rounds of --json's file (same checkpoint, device and "
                         "modes), so that one run can span several calls; the table covers "
                         "every round")
    ap.add_argument("--scrub", default=None,
                    help="a file or folder read with O_DIRECT before each cold pass, to empty "
                         "caches below the guest's (bench/coldcache.py); its rate before each "
                         "pass is reported (scrub_gbps in the JSON's passes): the disk each "
                         "loader met")
    ap.add_argument("--check", default="first",
                    help="whose bytes are checked against the file, in their first pass: "
                         "first (every loader's), none, or a comma-separated list of loaders "
                         "(a cold check of a loader that reads with O_DIRECT reads the file "
                         "from the disk again)")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds each loader's process waits, its GPU context, imports and "
                         "parameters ready, before its clock starts (default 0)")
    ap.add_argument("--passes", type=int, default=1,
                    help="warm passes of each loader a round, in sweeps over the loaders; "
                         "the round's figure is their median (default 1)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    scrub_with = scrub_files(a.scrub)
    scrub_bytes = sum(os.path.getsize(f) for f in scrub_with)
    if a.child:
        return child(a)
    if not a.settle >= 0:  # NaN too
        sys.exit(f"--settle: {a.settle:g}: seconds, 0 or more")
    if a.passes < 1:
        sys.exit(f"--passes: {a.passes}: 1 or more")

    files = files_of(a.path)
    if not files:
        sys.exit(f"{a.path}: no *.safetensors files")
    nbytes = sum(os.path.getsize(f) for f in files)
    env = dict(os.environ)
    if a.peer_site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), a.peer_site]))
    wanted = a.only.split(",") if a.only else LOADERS
    for name in (n for n in wanted if n not in PATTERNS):
        if kind(name) not in MODULES:
            sys.exit(f"--only: no loader or read pattern {name!r}; they are: "
                     + ", ".join(LOADERS))
        if ":" in name.split("+")[0] and not kind(name).startswith("fst."):
            sys.exit(f"--only: {name!r}: load options (after ':') are fst's only")
    loaders = []
    for name in wanted:
        ok, why = importable(name, env)
        if ok:
            loaders.append(name)
        else:
            print(f"left out {name}: {why}")
    def checks(name):
        return a.check == "first" or (a.check != "none" and name in a.check.split(","))
    fst_bin = a.fst_bin if a.fst_bin and os.path.exists(a.fst_bin) else shutil.which(a.fst_bin)
    modes = ([] if a.no_warm else ["warm"]) + ([] if a.no_cold else ["cold"])
    if not modes:
        sys.exit("--no-warm and --no-cold leave nothing to run")
    results = {n: {m: [] for m in modes} for n in loaders}
    info = {n: {} for n in loaders}
    lims = []
    evict = None
    passes = []
    if a.append and a.json and os.path.exists(a.json):
        with open(a.json) as f:
            old = json.load(f)
        if (old.get("path"), old.get("device"), old.get("modes")) != (a.path, a.device, modes):
            sys.exit(f"--append: {a.json} holds another checkpoint, device or modes "
                     f"({old.get('path')}, {old.get('device')}, {old.get('modes')})")
        lims, evict, passes = old["limits"], old.get("evicted_by"), old.get("passes", [])
        for n in old["seconds"]:
            results[n] = {m: old["seconds"][n].get(m, []) for m in modes}
            info[n] = old["info"].get(n, {})
        loaders_shown = list(old["seconds"]) + [n for n in loaders if n not in old["seconds"]]
    else:
        loaders_shown = list(loaders)
    first_round = len(lims)

    def record(name, mode, r, secs):
        # one entry per round, None where a pass failed or was not run; with
        # several passes a round, the median of those that ran so far
        lst = results[name][mode]
        lst += [None] * (r + 1 - len(lst))
        lst[r] = statistics.median(secs)

    def warm_limits(lim):
        return lim and "error" not in lim

    def again(label):
        """The warm limits measured once more within a round, printed: those
        that came out, by key."""
        got = limits(fst_bin, a.path, a.device)
        print(f"{label}: {got}", flush=True)
        return {k: got[k] for k in ("pread", "pinned_copy") if got.get(k)}

    def dump():
        # after every pass, so that a run cut short keeps what it measured
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"path": a.path, "bytes": nbytes, "device": a.device, "modes": modes,
                           "limits": lims, "seconds": results, "info": info,
                           "evicted_by": evict, "passes": passes}, f, indent=1)
    for r in range(first_round, first_round + a.rounds):
        # the warm limits (fst bench); the cold one is the read patterns' best
        lim = limits(fst_bin, a.path, a.device) if "warm" in modes else {}
        lims.append(lim)
        print(f"round {r + 1} limits: {lim}", flush=True)
        order = loaders if r % 2 == 0 else loaders[::-1]
        for mode in modes:
            timed = {}  # this round's seconds of each loader, pass by pass
            sweeps = a.passes if mode == "warm" else 1
            for sweep, name in ((k, n) for k in range(sweeps) for n in order):
                if sweep and name == order[0] and warm_limits(lim):
                    # the limits again before each sweep after the first (its
                    # first loader, whether or not it runs warm), so that the
                    # round's limit, as its loaders' figures, is a median over
                    # the same stretch of time
                    for k, v in again(f"round {r + 1} limits before sweep {sweep + 1}").items():
                        lim.setdefault(k + "_between", []).append(v)
                if mode == "warm" and name in PATTERNS:
                    continue
                t_pass = time.perf_counter()
                scrubbed = None
                if mode == "warm":
                    warm(files)
                else:
                    evict, scrubbed = make_cold_timed(files, scrub_with)
                # each loader checked in its first pass of the first mode
                first = mode == modes[0] and "check" not in info[name] and \
                    not any(x is not None for x in results[name][mode])
                res = run_child(a, name, env, checked=first and checks(name))
                # a whole pass (cache preparation, the child, its check): for planning runs
                passes.append({"round": r + 1, "mode": mode, "loader": name,
                               "seconds": round(time.perf_counter() - t_pass, 1),
                               "steal": res.get("steal"),
                               "since_setup_seconds": res.get("since_setup_seconds"),
                               "settle": a.settle, "sweep": sweep + 1,
                               "timed_seconds": res.get("seconds")})
                if scrubbed:
                    passes[-1]["scrub_seconds"] = round(scrubbed, 4)
                    passes[-1]["scrub_gbps"] = round(scrub_bytes / scrubbed / 1e9, 3)
                if "error" in res:
                    print(f"round {r + 1} {mode} {name}: {res['error']}", flush=True)
                    info[name].setdefault("errors", []).append(res["error"])
                    dump()
                    continue
                timed.setdefault(name, []).append(res["seconds"])
                record(name, mode, r, timed[name])
                for k in ("peak_rss_bytes", "device_bytes", "import_seconds", "check"):
                    if k in res:
                        info[name][k] = max(info[name].get(k, 0), res[k]) if k != "check" \
                            else res[k]
                stolen = "" if res.get("steal") is None else f", {res['steal']:.1%} stolen"
                disk = f", scrub {passes[-1]['scrub_gbps']:.2f} GB/s" if scrubbed else ""
                print(f"round {r + 1} {mode} {name}: {res['seconds']:.3f} s "
                      f"{nbytes / res['seconds'] / 1e9:.2f} GB/s (pass {passes[-1]['seconds']} s"
                      f"{disk}{stolen})", flush=True)
                dump()
            if mode == "warm" and warm_limits(lim):
                # again after the round's last warm pass (before any cold one
                # empties the page cache): how far the machine moved meanwhile
                for k, v in again(f"round {r + 1} limits at the end").items():
                    lim[k + "_end"] = v
                dump()

    nrounds = len(lims)
    for n in results:
        for m in modes:
            results[n][m] += [None] * (nrounds - len(results[n][m]))

    def rate(n, mode):
        return [None if x is None else nbytes / x / 1e9 for x in results[n][mode]]

    def listed(xs):
        return ", ".join("-" if x is None else f"{x:.2f}" for x in xs) or "-"

    def per_round(xs, lims_of_rounds):
        return [x / b if x and b else None for x, b in zip(xs, lims_of_rounds)]

    # each round's limits: the warm ones by fst bench, the cold one the
    # fastest read pattern of that round
    pread = [limit_of(x, "pread") for x in lims]
    copy = [limit_of(x, "pinned_copy") for x in lims]
    pats = [n for n in loaders_shown if n in PATTERNS]
    best_read = [max([x for x in (rate(p, "cold")[r] for p in pats) if x] or [None])
                 for r in range(nrounds)] if "cold" in modes else []
    print(f"\n{a.path}: {nbytes / 1e9:.2f} GB in {len(files)} files onto {a.device}, "
          f"{nrounds} rounds; cold by {evict or '-'}")
    print(f"limits (rounds): pread {listed(pread)} GB/s, pinned copy {listed(copy)} GB/s; "
          f"best read pattern cold {listed(best_read)} GB/s")
    drift = limits_drift(lims)
    if drift:
        print(drift)
    print("| loader | warm GB/s (rounds) | × pread | × pinned copy | cold GB/s (rounds) | "
          "× best read | peak RSS | device bytes | bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in loaders_shown:
        w = rate(n, "warm") if "warm" in modes else []
        c = rate(n, "cold") if "cold" in modes else []
        print(f"| {n} | {listed(w)} | {listed(per_round(w, pread))} | "
              f"{listed(per_round(w, copy))} | {listed(c)} | {listed(per_round(c, best_read))} | "
              f"{gb(info[n].get('peak_rss_bytes', 0))} GB | "
              f"{gb(info[n].get('device_bytes', 0))} GB | {info[n].get('check', '-')} |")
    imports = [f"{n} {info[n]['import_seconds'] * 1e3:.1f}" for n in loaders_shown
               if "import_seconds" in info[n]]
    if imports:
        print("imports before the clock, ms (the slowest of the passes): " + ", ".join(imports))
    sweeps = max([p.get("sweep", 1) for p in passes] or [1])
    if sweeps > 1:
        print(f"each warm figure: the median of a loader's passes in its round (--passes, "
              f"at most {sweeps}); each limit the median of its measurements in the round")
    settled = sorted({p["settle"] for p in passes if p.get("settle")})
    if settled:
        print("each loader's process waited before its clock (--settle), s: "
              + ", ".join(f"{x:g}" for x in settled))
    for mode in modes:
        for r in range(nrounds):
            ranked = sorted(((rate(n, mode)[r], n) for n in loaders_shown
                             if n not in PATTERNS and rate(n, mode)[r]), reverse=True)
            print(f"{mode} round {r + 1}, fastest first: " +
                  ", ".join(f"{n} {x:.2f}" for x, n in ranked))
            peers = [(x, n) for x, n in ranked if not kind(n).startswith("fst.")]
            ours = [(x, n) for x, n in ranked if kind(n).startswith("fst.")]
            if peers and ours:
                print(f"{mode} round {r + 1}, against the fastest peer ({peers[0][1]}): " +
                      ", ".join(f"{n} {x / peers[0][0]:.3f}x" for x, n in ours))
    summarize(modes, nrounds, [n for n in loaders_shown if n not in PATTERNS], rate, pread,
              copy)
    spread = warm_spread(passes, lims, nbytes)
    if spread:
        print(spread)
    for line in steal_lines(passes, modes):
        print(line)
    disk = scrub_lines(passes)
    if disk:
        print(disk)
    dump()


def scrub_lines(passes):
    """Cold, the rate of the scrub just before each loader's pass, round by
    round: the same bytes read the same way (O_DIRECT) before every loader,
    so a loader that met a slower disk than the others in its round shows it
    here, beside its figure."""
    rounds = {}
    for p in passes:
        if p.get("scrub_gbps"):
            rounds.setdefault(p["round"], []).append(f"{p['loader']} {p['scrub_gbps']:.2f}")
    if not rounds:
        return ""
    return "cold, the scrub's O_DIRECT read just before each pass, GB/s: " + "; ".join(
        f"round {r} " + ", ".join(v) for r, v in sorted(rounds.items()))


def steal_lines(passes, modes):
    """Per mode, the share of the CPUs' time the hypervisor took during the
    timed loads of each round (the least and the most of its loads): a round
    whose loads lost CPU time to another guest says so here."""
    lines = []
    for mode in modes:
        rounds = {}
        for p in passes:
            if p["mode"] == mode and p.get("steal") is not None:
                rounds.setdefault(p["round"], []).append(p["steal"])
        if rounds:
            lines.append(f"{mode}, CPU time stolen by the host during the loads: " + ", ".join(
                f"round {r} {min(v):.1%}-{max(v):.1%}" for r, v in sorted(rounds.items())))
    return lines


def limits_drift(lims):
    """Each round's warm limits at its start and its end, and how far they moved
    within the rounds (end / start): the spread a ratio to them carries."""
    parts = []
    for k, label in (("pread", "pread"), ("pinned_copy", "pinned copy")):
        pairs = [(x.get(k), x.get(k + "_end")) for x in lims]
        moved = [e / s for s, e in pairs if s and e]
        if not moved:
            continue
        ends = ", ".join(f"{s:.2f}->{e:.2f}" if s and e else "-" for s, e in pairs)
        parts.append(f"{label} {ends} GB/s (end / start {min(moved):.3f}-{max(moved):.3f}x)")
    return "limits at the start and the end of each round's warm passes: " + \
        "; ".join(parts) if parts else ""


def warm_spread(passes, lims, nbytes):
    """Over every round, the slowest and the fastest warm pass of each loader
    and the lowest and the highest measurement of each warm limit: a ratio to
    a limit whose measurements spread wider than the loader's passes moves
    with the limit, and this line shows which of the two moved. Empty where
    no loader has two warm passes."""
    by_loader = {}
    for p in passes:
        if p["mode"] == "warm" and p.get("timed_seconds"):
            by_loader.setdefault(p["loader"], []).append(nbytes / p["timed_seconds"] / 1e9)
    parts = [(n, v) for n, v in by_loader.items() if len(v) > 1]
    if not parts:
        return ""
    for k, label in (("pread", "pread limit"), ("pinned_copy", "pinned copy limit")):
        vals = [v for x in lims for v in measurements(x, k)]
        if len(vals) > 1:
            parts.append((label, vals))
    return "warm, every pass over the rounds, slowest-fastest GB/s (fastest / slowest): " + \
        "; ".join(f"{n} {min(v):.2f}-{max(v):.2f} ({max(v) / min(v):.3f}x)" for n, v in parts)


def summarize(modes, nrounds, loaders, rate, pread, copy):
    """Over the rounds, each fst loader's standing: in how many rounds it was
    ahead of every peer that ran, the range of its ratio to the round's
    fastest peer, warm, to the round's pread limit (and in how many of those
    rounds 0.98x of it was out of any loader's reach), and for fst's other
    loaders (the iterator), to fst.load in the same round. Rounds where it or
    every peer has no figure are left out and the count says so."""
    for mode in modes:
        for n in (n for n in loaders if kind(n).startswith("fst.")):
            vs_peer = []
            for r in range(nrounds):
                ours = rate(n, mode)[r]
                peers = [x for x in (rate(p, mode)[r] for p in loaders
                                     if not kind(p).startswith("fst.")) if x]
                if ours and peers:
                    vs_peer.append(ours / max(peers))
            timed = [r for r, (x, b) in enumerate(zip(rate(n, mode), pread)) if x and b] \
                if mode == "warm" else []
            vs_pread = [rate(n, mode)[r] / pread[r] for r in timed]
            parts = []
            if vs_peer:
                parts.append(f"ahead of every peer in {sum(v > 1 for v in vs_peer)} of "
                             f"{len(vs_peer)} rounds, {min(vs_peer):.3f}-{max(vs_peer):.3f}x "
                             "the fastest")
            if vs_pread:
                parts.append(f"{min(vs_pread):.3f}-{max(vs_pread):.3f}x the pread limit, "
                             f">= 0.98x in {sum(v >= 0.98 for v in vs_pread)} of "
                             f"{len(vs_pread)} rounds" + beyond_reach(timed, pread, copy))
            vs_load = [x / b for x, b in zip(rate(n, mode), rate("fst.load", mode))
                       if x and b] if n != "fst.load" and "fst.load" in loaders else []
            if vs_load:
                parts.append(f"{min(vs_load):.3f}-{max(vs_load):.3f}x fst.load")
            if parts:
                print(f"{mode}, over the rounds: {n} " + "; ".join(parts))


def beyond_reach(rounds, pread, copy):
    """Where a round's pinned copy limit stood below 0.98x its pread limit, no
    loader onto a GPU could read 0.98x the pread limit: every byte crosses the
    copy engine, and none passes that limit. Says in how many of the rounds
    given that was so; empty where in none."""
    n = sum(1 for r in rounds if copy[r] and pread[r] and copy[r] < 0.98 * pread[r])
    return f" (out of any loader's reach in {n}: the pinned copy limit below 0.98x the " \
        "pread limit)" if n else ""


if __name__ == "__main__":
    main()
