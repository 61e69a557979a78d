#!/usr/bin/env python3
"""Pull vLLM's own weight-iterator functions out of a downloaded vLLM wheel
into a minimal `vllm` package, for machines where vLLM cannot be installed
(the GPU machine reaches no registry and vLLM's wheel is too large to carry).

  pip download vllm==0.33.0 --no-deps -d /tmp/whl
  python3 bench/vllm_extract.py /tmp/whl/vllm-0.33.0-*.whl .vllm-extract

The output folder is git-ignored and is never committed: it is vLLM's code,
taken from its wheel at run time. What is taken, unchanged, function by
function (found by name with ast, so nothing else of vLLM comes along):

  vllm/model_executor/model_loader/weight_utils.py:
      fastsafetensors_weights_iterator, enable_tqdm, _natural_sort_key
  vllm/model_executor/model_loader/ep_weight_filter.py:
      every function and module-level constant

Above them this script writes the few names they use from the rest of vLLM
(current_platform.current_device, envs.VLLM_FASTSAFETENSORS_QUEUE_SIZE read
from the environment as vLLM reads it, logger.warning_once), so that
`fastsafetensors_weights_iterator` runs exactly as in vLLM: it imports
`fastsafetensors.parallel_loader.ParallelLoader` and drives it.
"""
import ast
import os
import sys
import zipfile

WEIGHT_UTILS = "vllm/model_executor/model_loader/weight_utils.py"
EP_FILTER = "vllm/model_executor/model_loader/ep_weight_filter.py"
WANTED = ("fastsafetensors_weights_iterator", "enable_tqdm", "_natural_sort_key")

PRELUDE_WEIGHT_UTILS = '''\
# Functions taken unchanged from vLLM {version}'s {path} by
# bench/vllm_extract.py; the names above them stand in for the rest of vLLM.
import logging
import os
try:
    import regex as re
except ImportError:
    import re
from collections.abc import Generator

import torch
from tqdm.auto import tqdm

from fastsafetensors import SingleGroup


class _Logger(logging.LoggerAdapter):
    def warning_once(self, msg, *args):
        self.warning(msg, *args)

    def info_once(self, msg, *args):
        self.info(msg, *args)


logger = _Logger(logging.getLogger("vllm"), {{}})


class _Platform:
    @staticmethod
    def current_device():
        return torch.cuda.current_device()


current_platform = _Platform()


class _Envs:
    @property
    def VLLM_FASTSAFETENSORS_QUEUE_SIZE(self):
        return int(os.getenv("VLLM_FASTSAFETENSORS_QUEUE_SIZE", "0"))


envs = _Envs()

from .ep_weight_filter import should_skip_weight  # noqa: E402,F401

'''

PRELUDE_EP = '''\
# Taken unchanged from vLLM {version}'s {path} by bench/vllm_extract.py.
try:
    import regex as re
except ImportError:
    import re

'''


def segments(src, keep):
    tree = ast.parse(src)
    out = []
    for node in tree.body:
        if keep(node):
            out.append(ast.get_source_segment(src, node))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, outdir = sys.argv[1], sys.argv[2]
    with zipfile.ZipFile(wheel) as z:
        wu = z.read(WEIGHT_UTILS).decode()
        ep = z.read(EP_FILTER).decode()
        version = "unknown"
        for n in z.namelist():
            if n.endswith(".dist-info/METADATA"):
                for line in z.read(n).decode().splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
    funcs = segments(wu, lambda n: isinstance(n, ast.FunctionDef) and n.name in WANTED)
    found = [s.split("(")[0].split()[-1] for s in funcs]
    missing = set(WANTED) - set(found)
    if missing:
        sys.exit(f"{wheel}: {WEIGHT_UTILS} has no {', '.join(sorted(missing))}: this script "
                 f"was written for vLLM 0.33")
    ep_parts = segments(ep, lambda n: isinstance(n, (ast.FunctionDef, ast.Assign)))
    pkg = os.path.join(outdir, "vllm")
    loader = os.path.join(pkg, "model_executor", "model_loader")
    os.makedirs(loader, exist_ok=True)
    for d in (pkg, os.path.join(pkg, "model_executor")):
        with open(os.path.join(d, "__init__.py"), "w") as f:
            f.write(f'__version__ = "{version}"\n' if d == pkg else "")
    with open(os.path.join(loader, "__init__.py"), "w") as f:
        f.write("")
    with open(os.path.join(loader, "weight_utils.py"), "w") as f:
        f.write(PRELUDE_WEIGHT_UTILS.format(version=version, path=WEIGHT_UTILS))
        f.write("\n\n".join(funcs) + "\n")
    with open(os.path.join(loader, "ep_weight_filter.py"), "w") as f:
        f.write(PRELUDE_EP.format(version=version, path=EP_FILTER))
        f.write("\n\n".join(ep_parts) + "\n")
    print(f"vLLM {version}: {', '.join(found)} and {len(ep_parts)} definitions of "
          f"ep_weight_filter -> {outdir}")


if __name__ == "__main__":
    main()
