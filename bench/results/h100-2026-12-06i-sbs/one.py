"""One warm load of a checkpoint onto cuda:0 in this process, timed (calls 3 and 4).

python3 one.py load|iter DIR: `load` is fst.load; `iter` copies each tensor of
fst.iter_tensors into a parameter allocated before the clock, as an engine's
load_weights does (bench/peers.py's fst.iter_into_params, whose parameters this
takes). Prints the checkpoint's bytes over the seconds.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from peers import files_of, prepare  # noqa: E402 (bench/)

torch.zeros(1, device="cuda:0")
torch.cuda.synchronize()
import fst  # noqa: E402

mode, path = sys.argv[1], sys.argv[2]
files = files_of(path)
nbytes = sum(os.path.getsize(f) for f in files)
params = prepare("fst.iter_into_params", files, "cuda:0") if mode == "iter" else None
torch.cuda.synchronize()
t = time.perf_counter()
if mode == "load":
    d = fst.load(path, device="cuda:0")
else:
    for k, v in fst.iter_tensors(path, device="cuda:0"):
        params[k].copy_(v)
torch.cuda.synchronize()
dt = time.perf_counter() - t
print(f"{mode} {nbytes / dt / 1e9:.2f} GB/s {dt * 1000:.0f} ms", flush=True)
