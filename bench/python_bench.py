#!/usr/bin/env python3
"""The Python layer's cost: in one process and one run, load a checkpoint
onto a device with fst.load_file, fst.iter_tensors and the reference
safetensors.torch.load_file, and time the `fst load` CLI on the same files.
Warm page cache; best of --runs. Prints a markdown table and JSON.

  python3 bench/python_bench.py CHECKPOINT_DIR --device cuda:0 --fst-bin build/fst
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time


def best_of(runs, fn):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fst-bin", default="build/fst")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch
    import fst
    from safetensors.torch import load_file as ref_load

    files = sorted(glob.glob(os.path.join(a.path, "*.safetensors")))
    nbytes = sum(fst.Checkpoint(f).info(n)[2] for f in files for n in fst.Checkpoint(f).keys())
    for f in files:  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    if a.device.startswith("cuda"):
        torch.zeros(1, device=a.device)
        torch.cuda.synchronize()

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    def fst_load_file():
        d = fst.load_file(a.path, device=a.device)
        sync()
        assert len(d) > 0
        del d

    def fst_iter():
        n = 0
        for _name, _t in fst.iter_tensors(a.path, device=a.device):
            n += 1
        sync()
        assert n > 0

    def reference():
        n = 0
        for f in files:
            d = ref_load(f, device=a.device)
            n += len(d)
            del d
        sync()

    def cli():
        out = subprocess.run([a.fst_bin, "load", a.path, "--device", a.device, "--json",
                              "--no-progress"], check=True, capture_output=True, text=True)
        return json.loads(out.stdout)["seconds"]

    results = {}
    results["fst.load_file"] = best_of(a.runs, fst_load_file)
    results["fst.iter_tensors"] = best_of(a.runs, fst_iter)
    results["safetensors.torch.load_file"] = best_of(a.runs, reference)
    cli_times = [cli() for _ in range(a.runs)]
    results["fst load (CLI, in-process time)"] = (min(cli_times), cli_times)

    base = results["fst load (CLI, in-process time)"][0]
    print(f"checkpoint {a.path}: {len(files)} files, {nbytes / 1e9:.2f} GB, device {a.device}, "
          f"best of {a.runs}")
    print("| loader | seconds | GB/s | vs fst load CLI |")
    print("|---|---|---|---|")
    out = {"path": a.path, "device": a.device, "bytes": nbytes, "rows": []}
    for name, (best, all_times) in results.items():
        print(f"| {name} | {best:.3f} | {nbytes / best / 1e9:.2f} | {best / base:.3f}x |")
        out["rows"].append({"name": name, "seconds": best, "all": all_times,
                            "gbps": nbytes / best / 1e9})
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
