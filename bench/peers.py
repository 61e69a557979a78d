#!/usr/bin/env python3
"""fst beside every peer loader that is importable, on one checkpoint, in
one run: warm (page cache) and cold (caches dropped), alternating rounds,
each loader in a process of its own (so its peak RSS and device memory are
its own), each loader's bytes checked against the file in its first round,
and each figure as a ratio to the machine's limits measured by `fst bench`
in the same round. A markdown table on stdout, JSON with --json.

  python3 bench/make_checkpoints.py /tmp/ck          # 16 GB dense, 13.8 GB MXFP4
  python3 bench/peers.py /tmp/ck/llama3-8b --device cuda:0 --rounds 2 \\
      [--peer-site DIR] [--only fst.load,fastsafetensors] [--no-cold] [--json out.json]

Loaders (a peer that does not import is reported and left out; LOADER+NAME=VALUE
runs LOADER with one more environment variable, e.g. fst.load+FST_STAGING_PAGES=driver):
  fst.load, fst.iter_tensors   this package
  safetensors                  the reference: safetensors.torch.load_file per file
  fastsafetensors              SafeTensorsFileLoader(nogds=True) and copy_files_to_device
  instanttensor                instanttensor.safe_open(files, device=N), f.tensors()
  runai                        runai_model_streamer's SafetensorsStreamer to the CPU, then .to(device)
Cold needs root for /proc/sys/vm/drop_caches; otherwise each file is evicted
with posix_fadvise(DONTNEED).
"""
import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from coldcache import make_cold, scrub_files

LOADERS = ["fst.load", "fst.iter_tensors", "safetensors", "fastsafetensors", "instanttensor",
           "runai"]


def files_of(path):
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def warm(files):
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


# ---- the child: one loader, one load, optionally checked

def load_with(name, path, files, device):
    """{tensor name: tensor} (or an iterator of pairs) by loader `name`."""
    import torch
    dev_index = (torch.device(device).index or 0) if device.startswith("cuda") else None
    if name == "fst.load":
        import fst
        return fst.load(path, device=device)
    if name == "fst.iter_tensors":
        import fst
        return dict(fst.iter_tensors(path, device=device))
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
    if name == "instanttensor":
        import instanttensor
        out = {}
        with instanttensor.safe_open(files, framework="pt",
                                     device=dev_index if dev_index is not None else "cpu") as f:
            for k, t in f.tensors():
                out[k] = t.clone()  # its tensors are views of a reused buffer
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


def check(tensors, files):
    """Every tensor of the files present once, with the file's bytes."""
    import numpy as np
    import struct
    seen = 0
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            base = 8 + n
            for k, meta in header.items():
                if k == "__metadata__":
                    continue
                if k not in tensors:
                    return f"{k} missing"
                a, b = meta["data_offsets"]
                t = tensors[k]
                got = t.detach().contiguous().reshape(-1).view(__import__("torch").uint8)
                got = got.cpu().numpy()
                fh.seek(base + a)
                want = np.frombuffer(fh.read(b - a), dtype=np.uint8)
                if got.shape != want.shape or not np.array_equal(got, want):
                    return f"{k}: bytes differ"
                seen += 1
    if seen != len(tensors):
        return f"{len(tensors) - seen} tensors not in the files"
    return "bytes equal"


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
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    got = load_with(a.child.split("+")[0], a.path, files, a.device)
    keep = None
    if isinstance(got, tuple):
        got, keep = got
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    out = {"seconds": dt,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "rss_before_bytes": rss0 * 1024}
    if cuda:
        out["device_bytes"] = free0 - torch.cuda.mem_get_info(torch.device(a.device))[0]
    if a.check:
        out["check"] = check(got, files)
    if keep is not None:
        keep[0].close()
        keep[1].close()
    print("RESULT " + json.dumps(out), flush=True)


# ---- the parent

def limits(fst_bin, path, device, cold):
    """The machine's limits of this round, from `fst bench --json`."""
    if not fst_bin:
        return {}
    cmd = [fst_bin, "bench", path, "--device", device, "--runs", "1", "--json",
           "--no-reference"] + ([] if cold else ["--no-cold"])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return {"error": r.stderr.strip()[-300:]}
    rows = {row["name"]: row["gbps"] for row in json.loads(r.stdout)["rows"]}
    return {"pread": rows.get("parallel pread limit (warm)"),
            "pinned_copy": rows.get("pinned host-to-device copy limit"),
            "odirect": rows.get("O_DIRECT read limit (cold)")}


def importable(name, env):
    mod = {"fst.load": "fst", "fst.iter_tensors": "fst", "safetensors": "safetensors",
           "fastsafetensors": "fastsafetensors", "instanttensor": "instanttensor",
           "runai": "runai_model_streamer"}[name.split("+")[0]]
    r = subprocess.run([sys.executable, "-c", f"import {mod}"], env=env, capture_output=True,
                       text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def run_child(a, name, env, checked):
    cmd = [sys.executable, os.path.abspath(__file__), a.path, "--device", a.device,
           "--child", name] + (["--check"] if checked else [])
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
    ap.add_argument("--peer-site", default=None, help="a folder with the peers' packages")
    ap.add_argument("--fst-bin", default=shutil.which("fst") or "build/fst")
    ap.add_argument("--json", default=None)
    ap.add_argument("--scrub", default=None,
                    help="a file or folder read with O_DIRECT before each cold pass, to empty "
                         "caches below the guest's (bench/coldcache.py)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    scrub_with = scrub_files(a.scrub)
    if a.child:
        return child(a)

    files = files_of(a.path)
    if not files:
        sys.exit(f"{a.path}: no *.safetensors files")
    nbytes = sum(os.path.getsize(f) for f in files)
    env = dict(os.environ)
    if a.peer_site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), a.peer_site]))
    wanted = a.only.split(",") if a.only else LOADERS
    loaders = []
    for name in wanted:
        ok, why = importable(name, env)
        if ok:
            loaders.append(name)
        else:
            print(f"left out {name}: {why}")
    fst_bin = a.fst_bin if a.fst_bin and os.path.exists(a.fst_bin) else shutil.which(a.fst_bin)
    modes = ["warm"] + ([] if a.no_cold else ["cold"])
    results = {n: {m: [] for m in modes} for n in loaders}
    info = {n: {} for n in loaders}
    lims = []
    evict = None
    for r in range(a.rounds):
        lim = limits(fst_bin, a.path, a.device, not a.no_cold)
        lims.append(lim)
        print(f"round {r + 1} limits: {lim}", flush=True)
        order = loaders if r % 2 == 0 else loaders[::-1]
        for mode in modes:
            for name in order:
                if mode == "warm":
                    warm(files)
                else:
                    evict = make_cold(files, scrub_with)
                res = run_child(a, name, env, checked=(r == 0 and mode == "warm"))
                if "error" in res:
                    print(f"round {r + 1} {mode} {name}: {res['error']}", flush=True)
                    info[name].setdefault("errors", []).append(res["error"])
                    continue
                results[name][mode].append(res["seconds"])
                for k in ("peak_rss_bytes", "device_bytes", "check"):
                    if k in res:
                        info[name][k] = max(info[name].get(k, 0), res[k]) if k != "check" \
                            else res[k]
                print(f"round {r + 1} {mode} {name}: {res['seconds']:.3f} s "
                      f"{nbytes / res['seconds'] / 1e9:.2f} GB/s", flush=True)

    def best_limit(key):
        v = [x.get(key) for x in lims if x.get(key)]
        return max(v) if v else None

    pread, copy, odirect = best_limit("pread"), best_limit("pinned_copy"), best_limit("odirect")
    print(f"\n{a.path}: {nbytes / 1e9:.2f} GB in {len(files)} files onto {a.device}, "
          f"{a.rounds} rounds; cold by {evict or '-'}")
    def gbps(x):
        return "-" if x is None else f"{x:.2f}"
    print(f"limits (best of the rounds): pread {gbps(pread)} GB/s, pinned copy {gbps(copy)} GB/s, "
          f"O_DIRECT {gbps(odirect)} GB/s")
    print("| loader | warm GB/s (rounds) | × pread | × pinned copy | cold GB/s (rounds) | "
          "× O_DIRECT | peak RSS | device bytes | bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in loaders:
        w = [nbytes / s / 1e9 for s in results[n]["warm"]]
        c = [nbytes / s / 1e9 for s in results[n].get("cold", [])]
        bw, bc = (max(w) if w else None), (max(c) if c else None)

        def ratio(x, lim):
            return f"{x / lim:.2f}" if x and lim else "-"
        print(f"| {n} | {', '.join(f'{x:.2f}' for x in w) or '-'} | {ratio(bw, pread)} | "
              f"{ratio(bw, copy)} | {', '.join(f'{x:.2f}' for x in c) or '-'} | "
              f"{ratio(bc, odirect)} | {gb(info[n].get('peak_rss_bytes', 0))} GB | "
              f"{gb(info[n].get('device_bytes', 0))} GB | {info[n].get('check', '-')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"path": a.path, "bytes": nbytes, "device": a.device, "limits": lims,
                       "seconds": results, "info": info, "evicted_by": evict}, f, indent=1)


if __name__ == "__main__":
    main()
