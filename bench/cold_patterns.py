#!/usr/bin/env python3
"""Which access pattern does this disk reward when nothing is cached? Reads
every file of a checkpoint, caches dropped before each pass, with a set of
patterns (threads x request size, O_DIRECT or buffered, requests taken in
file order or one stream per file), and the loaders themselves (fst.load,
fastsafetensors 0.5, InstantTensor 0.2) onto the GPU, in alternating rounds
in one process. Root is needed to drop caches (/proc/sys/vm/drop_caches);
otherwise every file is evicted with posix_fadvise(DONTNEED).

  python3 bench/cold_patterns.py CKPT_DIR --rounds 2 [--peer-site DIR] [--json out.json]
      [--only SUBSTR,...] [--fst-cli build/fst --variant "NAME=ARGS" ...]

--variant runs `fst load CKPT --device DEV --json ARGS` (e.g. "pread+ra1G=--io pread
--readahead 1G") and times the load the command reports.
"""
import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import time

from coldcache import make_cold, read_ahead_pattern, read_pattern, scrub_files

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--peer-site", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--scrub", default=None,
                    help="a file or folder read with O_DIRECT before each cold pass, to empty "
                         "caches below the guest's (bench/coldcache.py)")
    ap.add_argument("--only", default=None,
                    help="comma-separated substrings: keep the modes whose name holds one")
    ap.add_argument("--fst-cli", default=None)
    ap.add_argument("--variant", action="append", default=[])
    a = ap.parse_args()
    scrub_with = scrub_files(a.scrub)
    files = sorted(glob.glob(os.path.join(a.path, "*.safetensors")))
    nbytes = sum(os.path.getsize(f) for f in files)

    modes = {}
    for direct in (True, False):
        for threads, req in ((16, 64 * MiB), (8, 16 * MiB), (32, 4 * MiB), (64, 1 * MiB),
                             (128, 1 * MiB)):
            if not direct and req < 4 * MiB:
                continue
            name = f"{'direct' if direct else 'buffered'} {threads}x{req // MiB}MiB"
            modes[name] = (lambda t=threads, r=req, d=direct:
                           read_pattern(files, t, r, d, False))
        modes[f"{'direct' if direct else 'buffered'} 16x16MiB per-file"] = (
            lambda d=direct: read_pattern(files, 16, 16 * MiB, d, True))
    for req, ahead in ((4 * MiB, 1 << 30), (16 * MiB, 1 << 30), (4 * MiB, 4 << 30)):
        modes[f"buffered+willneed 16x{req // MiB}MiB {ahead >> 30}GiB ahead"] = (
            lambda r=req, h=ahead: read_ahead_pattern(files, 16, r, h))

    import torch
    import fst
    torch.zeros(1, device=a.device)

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
    sync()

    def fst_load():
        d = fst.load(a.path, device=a.device)
        sync()
        del d
    modes["fst.load"] = fst_load

    if a.peer_site:
        sys.path.insert(0, a.peer_site)
        try:
            from fastsafetensors import SafeTensorsFileLoader, SingleGroup

            def fastsafetensors_load():
                ld = SafeTensorsFileLoader(SingleGroup(), a.device, nogds=True)
                ld.add_filenames({0: files})
                fb = ld.copy_files_to_device()
                sync()
                fb.close()
                ld.close()
            modes["fastsafetensors 0.5 nogds"] = fastsafetensors_load
        except ImportError as e:
            print(f"no fastsafetensors: {e}")
        try:
            import instanttensor

            def instanttensor_load():
                with instanttensor.safe_open(files, framework="pt", device=0) as f:
                    for _name, _t in f.tensors():
                        pass
                sync()
            modes["instanttensor 0.2 default"] = instanttensor_load
        except ImportError as e:
            print(f"no instanttensor: {e}")

    for v in a.variant:
        label, _, args = v.partition("=")

        def cli_load(args=args):
            out = subprocess.run([a.fst_cli, "load", a.path, "--device", a.device, "--json",
                                  "--no-progress"] + shlex.split(args), check=True,
                                 capture_output=True, text=True).stdout
            return json.loads(out)["seconds"]
        modes[f"fst {label}"] = cli_load

    if a.only:
        keep = a.only.split(",")
        modes = {m: f for m, f in modes.items() if any(k in m for k in keep)}
    results = {m: [] for m in modes}
    names = list(modes)
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for m in order:
            make_cold(files, scrub_with)
            t0 = time.perf_counter()
            reported = modes[m]()
            dt = time.perf_counter() - t0
            if isinstance(reported, float):
                dt = reported  # the load's own time, without process start
            results[m].append(dt)
            print(f"round {r + 1} {m}: {dt:.2f} s {nbytes / dt / 1e9:.2f} GB/s", flush=True)
    print(f"\n{a.path}: {nbytes / 1e9:.2f} GB in {len(files)} files, cold, {a.rounds} rounds")
    print("| pattern | GB/s each round | best |")
    print("|---|---|---|")
    for m, v in results.items():
        print(f"| {m} | {', '.join(f'{nbytes / x / 1e9:.2f}' for x in v)} | "
              f"{nbytes / min(v) / 1e9:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"path": a.path, "bytes": nbytes, "seconds": results}, f)


if __name__ == "__main__":
    main()
