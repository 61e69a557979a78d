"""One rank of test_vllm_plugin's tensor-parallel test: joins vLLM's
distributed environment (gloo), loads through load format "fst", and prints
whether every tensor equals the reference and which files this rank read."""
import os
import sys

import torch

rank, world, model_dir, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

from vllm.distributed import init_distributed_environment  # noqa: E402

init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                             distributed_init_method=f"tcp://127.0.0.1:{port}")

import fst  # noqa: E402

read = []
real_load = fst.load


def spy(ck, *a, **k):
    read.append(os.path.basename(ck.path))
    return real_load(ck, *a, **k)


fst.load = spy

from safetensors.torch import load_file  # noqa: E402
from vllm.config.load import LoadConfig  # noqa: E402
from vllm.model_executor.model_loader import get_model_loader  # noqa: E402
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402

load_general_plugins()
ld = get_model_loader(LoadConfig(load_format="fst"))
got = dict(ld._get_weights_iterator(DefaultModelLoader.Source(model_dir, None)))
ref = {}
for f in sorted(os.listdir(model_dir)):
    ref.update(load_file(os.path.join(model_dir, f)))
same = sorted(got) == sorted(ref) and all(
    got[k].dtype == v.dtype and got[k].shape == v.shape and
    torch.equal(got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
    for k, v in ref.items())
print("RESULT", "equal" if same else "DIFFERENT", ",".join(read), flush=True)
