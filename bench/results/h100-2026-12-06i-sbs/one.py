"""One warm load of a checkpoint onto cuda:0 in this process, timed (calls 3 and 4).

python3 one.py load|iter DIR: `load` is fst.load; `iter` copies each tensor of
fst.iter_tensors into a parameter allocated before the clock, as an engine's
load_weights does. Prints the checkpoint's bytes over the seconds.
"""
import glob
import json
import os
import struct
import sys
import time

import torch

torch.zeros(1, device="cuda:0")
torch.cuda.synchronize()
import fst  # noqa: E402

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
          "U8": torch.uint8, "I64": torch.int64}
mode, path = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
nbytes = sum(os.path.getsize(f) for f in files)
params = {}
if mode == "iter":
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        for k, m in header.items():
            params[k] = torch.empty(m["shape"], dtype=DTYPES[m["dtype"]], device="cuda:0")
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
