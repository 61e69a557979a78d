"""One rank of the multi-rank tests of fst.compat.fastsafetensors
(test_compat_fastsafetensors.py runs two of these over gloo on the CPU).

    python compat_fs_child.py SCENARIO RANK WORLD PORT DIR OUT.json

fst.load and fst.iter_tensors are wrapped to record which files this rank
reads tensor data from; every tensor a rank gets is compared, bytes, dtype
and shape, with safetensors.torch.load_file's. OUT.json gets
{"reads": [...], "failures": [...], "error": ...}."""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import fst

SCENARIO, RANK, WORLD, PORT, DIR, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    sys.argv[4], sys.argv[5], sys.argv[6]
FILES = [os.path.join(DIR, f"model-0000{i}.safetensors") for i in range(3)]
reads, failures = [], []

_load, _iter = fst.load, fst.iter_tensors


def recording_load(path, *args, **kwargs):
    reads.append(os.path.basename(path.path if isinstance(path, fst.Checkpoint) else path))
    if SCENARIO == "error" and RANK == 1:
        raise fst.FileError(f"{reads[-1]}: cannot read: injected on rank 1", -3)
    return _load(path, *args, **kwargs)


def recording_iter(paths, *args, **kwargs):
    for p in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        reads.append(os.path.basename(os.fspath(p)))
    return _iter(paths, *args, **kwargs)


fst.load, fst.iter_tensors = recording_load, recording_iter

REF = {}
for f in FILES:
    REF.update(load_file(f))


def raw(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def check(what, got, want):
    if not isinstance(got, torch.Tensor):
        failures.append(f"{what}: got {type(got).__name__}")
    elif got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        failures.append(f"{what}: {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                        f"{tuple(want.shape)}")
    elif not torch.equal(raw(got), raw(want)):
        failures.append(f"{what}: bytes differ")


def cut(t, dim, rank=RANK):
    """fastsafetensors' block of rank along dim (of the packed tensor)."""
    size = t.shape[dim]
    block = -(-size // WORLD)
    return t.narrow(dim, min(rank * block, size), max(0, min((rank + 1) * block, size)
                                                      - min(rank * block, size)))


def scenario_loader():
    from fst.compat.fastsafetensors import SafeTensorsFileLoader
    from fst.compat.fastsafetensors.st_types import Device, DType
    loader = SafeTensorsFileLoader(dist.group.WORLD, "cpu", nogds=True)
    loader.add_filenames({0: [FILES[1], FILES[0]], 1: [FILES[2]]})
    fb = loader.copy_files_to_device()
    owners = {k: v for k, v in fb.key_to_rank_lidx.items()}
    for name in sorted(REF):
        check(f"get_tensor({name})", fb.get_tensor(name), REF[name])
    # every tensor went out over the group: fastsafetensors frees the files,
    # and every rank (not only the owner) refuses them
    try:
        fb.get_tensor("w.5x3")
        failures.append("get_tensor after every tensor was handed out: no error")
    except fst.UsageError as e:
        if "released" not in str(e):
            failures.append(f"get_tensor after release: {e}")
    if fb.get_shape("w.5x3") != [5, 3] or not fb.get_filename("w.5x3").endswith("00000.safetensors"):
        failures.append("the header's answers went with the released load")
    fb.close()
    fb = loader.copy_files_to_device()
    for name in ("w.5x3", "w.4x6", "f4.4x16", "e8.3x4", "bf.6x2"):
        for dim in (0, 1):
            check(f"get_sharded({name}, {dim})", fb.get_sharded(name, dim), cut(REF[name], dim))
    check("get_sharded(w.5x3, -2)", fb.get_sharded("w.5x3", -2), cut(REF["w.5x3"], 0))
    check("get_tensor(w.4x6, dtype=F16)", fb.get_tensor("w.4x6", dtype=DType.F16),
          REF["w.4x6"].to(torch.float16))
    check("get_tensor(w.4x6, device=Device)",
          fb.get_tensor("w.4x6", device=Device.from_str("cpu")), REF["w.4x6"])
    cols = fb.get_multi_cols(["w.4x6", "x.4x6"], dim=0).get_raw()
    check("get_multi_cols(dim=0)", cols, torch.cat([cut(REF["w.4x6"], 0), cut(REF["x.4x6"], 0)], 0))
    cols = fb.get_multi_cols(["w.4x6", "x.4x6"], dim=1).get_raw()
    check("get_multi_cols(dim=1)", cols, torch.cat([cut(REF["w.4x6"], 1), cut(REF["x.4x6"], 1)], 1))
    fb.close()
    fb = loader.copy_files_to_device()
    pushed = fb.push_tensor("bias.7", 1)
    if RANK == 1:
        check("push_tensor(bias.7, 1)", pushed, REF["bias.7"])
    elif pushed is not None:
        failures.append("push_tensor to rank 1 returned a tensor on rank 0")
    parts = fb.as_dict({"w.5x3": 0, "bias.7": -1})
    check("as_dict w.5x3", parts["w.5x3"].get_raw(), cut(REF["w.5x3"], 0))
    check("as_dict bias.7", parts["bias.7"].get_raw(), REF["bias.7"])
    fb.close()
    loader.close()
    return {"owners": owners}


def scenario_parallel():
    from fst.compat.fastsafetensors.parallel_loader import ParallelLoader
    seen = {}
    runs = []
    for queue_size, run_bytes in ((0, 16 << 20), (-1, 0), (2, 100)):
        pl = ParallelLoader(pg=dist.group.WORLD, hf_weights_files=FILES, queue_size=queue_size,
                            use_tqdm_on_load=False, device="cpu", nogds=False,
                            broadcast_run_bytes=run_bytes)
        seen = {}
        for name, tensor in pl.iterate_weights():
            if name in seen:
                failures.append(f"queue_size={queue_size}: {name} twice")
            seen[name] = tensor
        pl.close()
        if sorted(seen) != sorted(REF):
            failures.append(f"queue_size={queue_size}: names {sorted(seen)}")
        for name, t in seen.items():
            check(f"queue_size={queue_size} run_bytes={run_bytes}: {name}", t, REF[name])
        runs.append(len(seen))
    return {"runs": runs}


def scenario_error():
    from fst.compat.fastsafetensors import SafeTensorsFileLoader
    from fst.compat.fastsafetensors.parallel_loader import ParallelLoader
    errors = []
    loader = SafeTensorsFileLoader(dist.group.WORLD, "cpu")
    loader.add_filenames({0: [FILES[0]], 1: [FILES[1]]})
    try:
        loader.copy_files_to_device()
        errors.append(None)
    except fst.SafetensorError as e:
        errors.append([type(e).__name__, str(e)])
    pl = ParallelLoader(dist.group.WORLD, FILES, use_tqdm_on_load=False)
    try:
        for _ in pl.iterate_weights():
            pass
        errors.append(None)
    except fst.SafetensorError as e:
        errors.append([type(e).__name__, str(e)])
    pl.close()
    return {"errors": errors}


def caught(call):
    """[class name, message] of what call() raised; None if it returned."""
    try:
        call()
        return None
    except Exception as e:
        return [type(e).__name__, str(e)]


def scenario_dtypes_one_rank():
    """numpy without ml_dtypes: only rank 0's file has BF16 and F8 tensors,
    so only rank 0's header check fails; rank 1 must get it too, not wait
    for rank 0 in the agreement."""
    from fst.compat.fastsafetensors import SafeTensorsFileLoader
    sys.modules["ml_dtypes"] = None  # import ml_dtypes raises ImportError
    loader = SafeTensorsFileLoader(dist.group.WORLD, "cpu", nogds=True, framework="numpy")
    loader.add_filenames({0: [FILES[1]], 1: [FILES[2]]})
    try:
        loader.copy_files_to_device()
        return {"errors": [None]}
    except Exception as e:  # with the package to install, on every rank
        return {"errors": [[type(e).__name__, str(e), getattr(e, "name", None)]]}


def scenario_push():
    """push_tensor of every tensor of rank 1's file, to rank 0: the file is
    still there on every rank (fastsafetensors frees nothing for a push),
    so get_tensor of it works on both, and the release after get_tensor of
    every tensor still comes on both."""
    from fst.compat.fastsafetensors import SafeTensorsFileLoader
    loader = SafeTensorsFileLoader(dist.group.WORLD, "cpu", nogds=True)
    loader.add_filenames({0: [FILES[0]], 1: [FILES[2]]})
    fb = loader.copy_files_to_device()
    errors = []
    for name in ("x.4x6", "i.3", "empty"):
        got = fb.push_tensor(name, 0)
        if RANK == 0:
            check(f"push_tensor({name}, 0)", got, REF[name])
        elif got is not None:
            failures.append(f"push_tensor({name}, 0) returned a tensor on rank {RANK}")
    got = fb.push_tensor("x.4x6", 1)  # to the owner itself
    if RANK == 1:
        check("push_tensor(x.4x6, 1)", got, REF["x.4x6"])
    for name in ("x.4x6", "i.3", "empty"):
        errors.append(caught(lambda: check(f"get_tensor({name}) after the pushes",
                                           fb.get_tensor(name), REF[name])))
    errors.append(caught(lambda: fb.get_tensor("x.4x6")))
    fb.close()
    loader.close()
    return {"errors": errors}


def scenario_comm_no_nccl():
    """fst.Comm where rank 0 cannot load NCCL: every rank raises, none waits
    for an id that will not come."""
    if RANK == 0:
        # read once, at NCCL's first use in the process: this one's
        os.environ["FST_NCCL_LIBRARY"] = os.path.join(DIR, "no-such-libnccl.so.2")
    return {"errors": [caught(lambda: fst.Comm(device=0))]}


def main():
    result = {"rank": RANK}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK,
                                world_size=WORLD)
        result.update(globals()["scenario_" + SCENARIO]())
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        result["error"] = traceback.format_exc()
    result["reads"], result["failures"] = reads, failures
    with open(OUT, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
