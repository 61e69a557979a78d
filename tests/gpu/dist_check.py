"""Description: tensor-parallel loads on the GPUs of one host, one process a
GPU (run with torchrun): every rank's shards byte-equal to the reference
loader's tensors cut the same way and to a single-GPU load; a rank that
fails to read, a rank whose NCCL call fails (after which both load again
over a new communicator), and a rank that vanishes, make every rank fail
within the timeout; and, in bench mode, time and bytes read per rank against every rank
loading everything with the reference loader.

  torchrun --nproc_per_node 2 tests/gpu/dist_check.py CKPT check|fail|nccl|vanish|bench
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import fst
from safetensors.torch import load_file as ref_load


def shard_dims(ck):
    """Column- and row-parallel 2-D weights (dims 0 and 1 alternating), some
    1-D tensors split along 0, the rest replicated."""
    dims = {}
    for i, name in enumerate(ck.keys()):
        _dtype, shape, _nbytes = ck.info(name)
        if len(shape) >= 2:
            dims[name] = 0 if i % 2 == 0 else 1
        elif len(shape) == 1 and i % 3 == 0:
            dims[name] = 0
    return dims


def cut(full, d, rank, world):
    if d is None:
        return full
    size = full.shape[d]
    block = -(-size // world)
    start = min(rank * block, size)
    return full.narrow(d, start, min(block, size - start))


def same_bytes(a, b):
    a = a.contiguous().reshape(-1).view(torch.uint8)
    b = b.contiguous().reshape(-1).view(torch.uint8)
    return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def evict(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main():
    path, mode = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo")
    timeout_ms = int(os.environ.get("TIMEOUT_MS", "20000"))
    comm = fst.Comm(device=rank, timeout_ms=timeout_ms)
    ck = fst.Checkpoint(path)
    dims = shard_dims(ck)
    say = lambda *a: print(f"[rank {rank}]", *a, flush=True)

    def expect_failure(note=""):
        """The sharded load must fail: say how fast and why; returns seconds."""
        t0 = time.perf_counter()
        try:
            fst.load_sharded(ck, comm, dims)
        except fst.SafetensorError as e:
            dt = time.perf_counter() - t0
            say(f"OK: failed in {dt:.2f} s{note}: {e}")
            return dt
        say("FAIL: the load succeeded")
        sys.exit(1)

    if mode == "check":
        stats = {}
        got = fst.load_sharded(path, comm, dims, stats=stats)
        single = fst.load_file(path, device=f"cuda:{rank}")
        n = 0
        for f in ck.files():
            for name, full in ref_load(f).items():
                want = cut(full, dims.get(name), rank, world)
                assert tuple(got[name].shape) == tuple(want.shape), (name, got[name].shape,
                                                                     want.shape)
                assert got[name].device == torch.device(f"cuda:{rank}")
                assert same_bytes(got[name], want), f"{name}: bytes differ from the reference"
                assert same_bytes(got[name], cut(single[name], dims.get(name), rank, world)), \
                    f"{name}: bytes differ from a single-GPU load"
                n += 1
        say(f"OK: {n} tensors equal to the reference slices and to a single-GPU load; "
            f"{stats['describe']}")
    elif mode == "fail":
        if rank == 1:
            fst._fst.fault_set("read:1")  # this rank's first tensor read fails
        expect_failure()
    elif mode == "nccl":
        # The real NCCL call of the final agreement fails on rank 1 (an
        # injected fault at the nccl site): both ranks fail, then both load
        # again over a new communicator, with the right bytes.
        if rank == 1:
            fst._fst.fault_set("nccl:1")
        expect_failure()
        fst._fst.fault_set(None)
        dist.barrier()
        comm2 = fst.Comm(device=rank, timeout_ms=timeout_ms)
        got = fst.load_sharded(path, comm2, dims)
        single = fst.load_file(path, device=f"cuda:{rank}")
        for name, t in got.items():
            assert same_bytes(t, cut(single[name], dims.get(name), rank, world)), name
        say(f"OK: loaded again over a new communicator: {len(got)} tensors equal to a "
            f"single-GPU load")
    elif mode == "vanish":
        if rank == 1:
            say("leaving without loading")
            os._exit(0)
        dt = expect_failure(f" (timeout {timeout_ms} ms)")
        assert dt < timeout_ms / 1000 + 15
        os._exit(0)
    elif mode == "bench":
        files = ck.files()
        total = sum(ck.info(n)[2] for n in ck.keys())
        results = {}
        for temp in ("warm", "cold"):
            for who in ("fst", "reference"):
                best = None
                for _ in range(2 if temp == "warm" else 1):
                    if temp == "cold" and rank == 0:
                        evict(files)
                    elif temp == "warm":
                        for f in files:
                            with open(f, "rb") as fh:
                                while fh.read(64 << 20):
                                    pass
                    dist.barrier()
                    t0 = time.perf_counter()
                    stats = {}
                    if who == "fst":
                        out = fst.load_sharded(path, comm, dims, stats=stats)
                    else:
                        out = {}
                        for f in files:
                            out.update(ref_load(f, device=f"cuda:{rank}"))
                    torch.cuda.synchronize()
                    dt = time.perf_counter() - t0
                    del out
                    times = [None] * world
                    dist.all_gather_object(times, dt)
                    slowest = max(times)
                    best = slowest if best is None else min(best, slowest)
                    results[f"{who} {temp}"] = {"seconds": best, "per_rank": times,
                                                "describe": stats.get("describe", "")}
        if rank == 0:
            print(json.dumps({"world": world, "model_bytes": total, "results": results},
                             indent=1))
            print(f"| load ({world} GPUs) | warm s | warm GB/s | cold s | cold GB/s |")
            print("|---|---|---|---|---|")
            for who in ("fst", "reference"):
                w, c = results[f"{who} warm"]["seconds"], results[f"{who} cold"]["seconds"]
                print(f"| {who} | {w:.3f} | {total / w / 1e9:.2f} | {c:.3f} | "
                      f"{total / c / 1e9:.2f} |")
            print("fst bytes read per rank:", results["fst warm"]["describe"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
