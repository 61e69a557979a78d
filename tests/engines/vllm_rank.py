"""One rank of test_vllm_plugin's tensor-parallel tests: joins vLLM's
distributed environment (gloo), loads through load format "fst", and prints
whether every tensor equals the reference and which files this rank read.
A fifth argument picks a mode: "ep", expert parallelism (rank r holds
experts 2r and 2r + 1; its tensors must be those, as fst gives them in one
process); "fail", rank 1's first data read fails (it must raise, and so
must every other rank, naming it, instead of waiting); "ppdraft", two
pipeline stages of one rank each, and only the last loads (as vLLM loads a
draft model for speculative decoding): it must finish alone, reading every
file itself, while rank 0 waits for it outside any collective."""
import os
import sys

import torch

rank, world, model_dir, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
mode = sys.argv[5] if len(sys.argv) > 5 else "plain"
shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
if mode == "fail" and rank == 1:
    # each open reads a header in two preads: every shard's header first,
    # then the load opens its file again; the first data read is next
    os.environ["FST_FAULT"] = f"read:{2 * len(shards) + 2 + 1}"

from vllm.distributed import init_distributed_environment  # noqa: E402

init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                             distributed_init_method=f"tcp://127.0.0.1:{port}")
if mode == "ppdraft":
    import time

    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import initialize_model_parallel
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        initialize_model_parallel(tensor_model_parallel_size=1,
                                  pipeline_model_parallel_size=world)
    done = os.path.join(os.environ["FST_TEST_PP_DONE"], "done")
    if rank < world - 1:  # a stage without the draft model: no load, no collective
        for _ in range(1200):
            if os.path.exists(done):
                break
            time.sleep(0.1)
        print("RESULT skipped", flush=True)
        sys.exit(0)

import fst  # noqa: E402

read = []
real_load = fst.load


def spy(ck, *a, **k):  # a path, or a Checkpoint
    read.append(os.path.basename(getattr(ck, "path", ck)))
    return real_load(ck, *a, **k)


fst.load = spy
real_iter = fst.iter_tensors


def spy_iter(path, *a, **k):  # one rank alone streams each file
    read.append(os.path.basename(path))
    return real_iter(path, *a, **k)


fst.iter_tensors = spy_iter

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
if mode == "ppdraft":
    open(os.path.join(os.environ["FST_TEST_PP_DONE"], "done"), "w").close()
