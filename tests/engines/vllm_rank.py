"""One rank of test_vllm_plugin's tensor-parallel tests: joins vLLM's
distributed environment (gloo), loads through load format "fst", and prints
whether every tensor equals the reference and which files this rank read.
A fifth argument picks a mode: "ep", expert parallelism (rank r holds
experts 2r and 2r + 1; its tensors must be those, as fst gives them in one
process); "fail", rank 1's first data read fails (it must raise, and so
must every other rank, naming it, instead of waiting)."""
import os
import sys

import torch

rank, world, model_dir, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
mode = sys.argv[5] if len(sys.argv) > 5 else "plain"
shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
if mode == "fail" and rank == 1:
    # each open reads a header in two preads: the first data read is next
    os.environ["FST_FAULT"] = f"read:{2 * len(shards) + 1}"

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
mine = {2 * rank, 2 * rank + 1}
if mode == "ep":
    ld.local_expert_ids = mine
try:
    got = dict(ld._get_weights_iterator(DefaultModelLoader.Source(model_dir, None)))
except Exception as e:
    print("FAILED", type(e).__name__, str(e).replace("\n", " ")[:400], flush=True)
    sys.exit(3)
ref = {}
for f in shards:
    if mode == "ep":  # fst's own tensors in one process (F4 has no reference form)
        from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight
        ref.update({k: v for k, v in real_load(os.path.join(model_dir, f)).items()
                    if not should_skip_weight(k, mine)})
    else:
        ref.update(load_file(os.path.join(model_dir, f)))
same = sorted(got) == sorted(ref) and all(
    got[k].dtype == v.dtype and got[k].shape == v.shape and
    torch.equal(got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
    for k, v in ref.items())
print("RESULT", "equal" if same else "DIFFERENT", ",".join(read), flush=True)
