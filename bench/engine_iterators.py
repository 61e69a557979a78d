#!/usr/bin/env python3
"""What an inference engine sees: each weights iterator it can use, driven
by a consumer that copies every tensor into a preallocated parameter (what
vLLM's load_weights does), against fst.load of the same files, in
alternating rounds in one process. Files in the page cache (read once
before); one CUDA device.

  python3 bench/vllm_extract.py vllm-0.33.0-*.whl .vllm-extract   # once
  python3 bench/engine_iterators.py CKPT_DIR --device cuda:0 --rounds 3 \\
      --vllm .vllm-extract [--peer-site /tmp/peers] [--json out.json]

Modes:
  fst.load               fst.load(dir) (the target: no consumer, no copy)
  fst.load+copy          fst.load(dir), then every tensor copied
  fst.iter_tensors       fst.iter_tensors(dir), every tensor copied
  fst.iter_tensors/files fst.iter_tensors(list of shard files), copied
  plugin                 the vLLM plugin's fst_weights_iterator (what
                         `--load-format fst` iterates), copied
  vllm-fastsafetensors   vLLM 0.33's own fastsafetensors_weights_iterator
                         (taken from its wheel) with `fastsafetensors` being
                         fst.compat.fastsafetensors, copied
  peer:fastsafetensors   the same vLLM function over the real fastsafetensors
                         0.5 (--peer-site; run in a child process, since
                         both are imported as `fastsafetensors`)

Before the timed rounds every mode runs once with a check: every tensor
name exactly once, every tensor's bytes equal to safetensors' load_file of
the same file.
"""
import argparse
import glob
import importlib
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import time


def alias_fastsafetensors():
    """`import fastsafetensors...` gives fst.compat.fastsafetensors...:
    the import shim that code written for fastsafetensors needs."""
    ours = "fst.compat.fastsafetensors"

    class Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name != "fastsafetensors" and not name.startswith("fastsafetensors."):
                return None
            return importlib.util.spec_from_loader(name, self)

        def create_module(self, spec):
            return importlib.import_module(ours + spec.name[len("fastsafetensors"):])

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Alias())


def files_of(path):
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vllm", required=True, help="folder made by bench/vllm_extract.py")
    ap.add_argument("--peer-site", default=None, help="site folder with fastsafetensors 0.5")
    ap.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    sys.path.insert(0, os.path.abspath(a.vllm))
    if a.peer_child:
        sys.path.insert(0, os.path.abspath(a.peer_site))
    else:
        alias_fastsafetensors()

    import torch
    from safetensors.torch import load_file as ref_load
    from vllm.model_executor.model_loader import weight_utils

    files = files_of(a.path)
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(a.device))

    def sync():
        if cuda:
            torch.cuda.synchronize()
    for f in files:  # into the page cache
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass

    # the reference bytes, and the parameters a model would have
    ref = {}
    for f in files:
        ref.update(ref_load(f, device=a.device))
    params = {n: torch.empty_like(t) for n, t in ref.items()}
    nbytes = sum(t.numel() * t.element_size() for t in ref.values())
    sync()

    def consume(it, check):
        seen = set()
        first = None
        t0 = time.perf_counter()
        for name, t in it:
            if first is None:
                first = time.perf_counter() - t0
            if check:
                assert name not in seen, f"{name} twice"
                seen.add(name)
                r = ref[name]
                assert t.dtype == r.dtype and tuple(t.shape) == tuple(r.shape), name
                assert torch.equal(t.reshape(-1).view(torch.uint8),
                                   r.reshape(-1).view(torch.uint8)), f"{name}: bytes differ"
            params[name].copy_(t)
        sync()
        if check:
            assert seen == set(ref), f"missing {sorted(set(ref) - seen)[:3]}"
        return first

    modes = {}
    if a.peer_child:
        modes["peer:fastsafetensors"] = lambda check: consume(
            weight_utils.fastsafetensors_weights_iterator(files, False), check)
    else:
        import fst
        from fst.integrations.vllm import fst_weights_iterator

        def fst_load(check):
            d = fst.load(a.path, device=a.device)
            sync()
            if check:
                consume(d.items(), True)
            del d

        def fst_load_copy(check):
            d = fst.load(a.path, device=a.device)
            consume(d.items(), check)
            del d

        modes["fst.load"] = fst_load
        modes["fst.load+copy"] = fst_load_copy
        modes["fst.iter_tensors"] = lambda check: consume(
            fst.iter_tensors(a.path, device=a.device), check)
        modes["fst.iter_tensors/files"] = lambda check: consume(
            fst.iter_tensors(files, device=a.device), check)
        modes["plugin"] = lambda check: consume(fst_weights_iterator(files, False), check)
        if cuda:  # vLLM's function takes the current CUDA device
            modes["vllm-fastsafetensors"] = lambda check: consume(
                weight_utils.fastsafetensors_weights_iterator(files, False), check)

    results = {m: [] for m in modes}
    firsts = {m: [] for m in modes}
    for m, fn in modes.items():
        fn(True)
        print(f"check {m}: {len(ref)} tensors, bytes equal", flush=True)
    names = list(modes)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for m in order:
            t0 = time.perf_counter()
            first = modes[m](False)
            dt = time.perf_counter() - t0
            results[m].append(dt)
            firsts[m].append(first)
            print(f"round {r + 1} {m}: {dt:.3f} s {nbytes / dt / 1e9:.2f} GB/s"
                  + (f" (first tensor after {first * 1e3:.1f} ms)" if first else ""), flush=True)

    out = {"path": a.path, "bytes": nbytes, "tensors": len(ref), "files": len(files),
           "device": torch.cuda.get_device_name() if cuda else "cpu", "seconds": results,
           "first_tensor_s": firsts}
    if a.peer_site and not a.peer_child:
        child = subprocess.run([sys.executable, os.path.abspath(__file__), a.path,
                                "--device", a.device, "--rounds", str(a.rounds), "--vllm", a.vllm,
                                "--peer-site", a.peer_site, "--peer-child",
                                "--json", "/dev/stdout"], capture_output=True, text=True)
        sys.stderr.write(child.stderr[-4000:])
        if child.returncode == 0:
            peer = json.loads(child.stdout.strip().splitlines()[-1])
            for m, v in peer["seconds"].items():
                results[m] = v
                print("\n".join(f"round {i + 1} {m}: {dt:.3f} s {nbytes / dt / 1e9:.2f} GB/s"
                                for i, dt in enumerate(v)))
        else:
            print(f"peer run failed (exit {child.returncode})")

    base = min(results["fst.load"]) if "fst.load" in results else None
    print(f"\n{a.path}: {len(ref)} tensors, {nbytes / 1e9:.2f} GB in {len(files)} files, "
          f"best of {a.rounds} rounds")
    print("| mode | best s | GB/s | rounds GB/s | vs fst.load |")
    print("|---|---|---|---|---|")
    for m, v in results.items():
        best = min(v)
        ratio = f"{base / best:.3f}" if base else "-"
        rounds = ", ".join(f"{nbytes / x / 1e9:.1f}" for x in v)
        print(f"| {m} | {best:.3f} | {nbytes / best / 1e9:.2f} | {rounds} | {ratio} |")
    if a.json:
        with open(a.json, "w") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
