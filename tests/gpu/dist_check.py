"""Description: tensor-parallel loads on the GPUs of one host, one process a
GPU (run with torchrun): every rank's shards byte-equal to the reference
loader's tensors cut the same way and to a single-GPU load; a rank that
fails to read, a rank whose NCCL call fails (after which both load again
over a new communicator), and a rank that vanishes, make every rank fail
within the timeout; and, in bench mode, time and bytes read per rank against every rank
loading everything with the reference loader.

With node communicators (fst.node_comm, nodes of NODE_SIZE consecutive ranks,
default 2, standing for hosts): nodes checks the shards as check does and
that each node's ranks read every broadcast tensor once and their own shards,
no more, no less; nodes-fail that a rank that fails to read makes every rank
fail; nodes-vanish that a rank that leaves makes every rank fail within the
timeout.

SAME_GPU=1 puts every rank on cuda:0. NCCL refuses two ranks on one GPU of
one host, so each rank gets a host id of its own (NCCL_HOSTID) and looks like
a host apart: NCCL then carries the traffic over its socket transport, on
loopback (NCCL_SOCKET_IFNAME=lo; NCCL_IB_DISABLE=1, so that a machine's
InfiniBand does not stand in for the sockets). Every mode runs that way, so
several ranks, and several "nodes", fit on one GPU.

  torchrun --nproc_per_node 2 tests/gpu/dist_check.py CKPT \
      check|fail|nccl|vanish|bench|nodes|nodes-fail|nodes-vanish
"""
import json
import os
import re
import sys
import time

SAME_GPU = os.environ.get("SAME_GPU", "0") == "1"
if SAME_GPU:
    # before anything (torch included) can start NCCL, which reads these once
    os.environ["NCCL_HOSTID"] = f"fst-rank-{os.environ['RANK']}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fst  # noqa: E402
from safetensors.torch import load_file as ref_load  # noqa: E402


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


def contiguous(shape, nbytes, d):
    """The layout's rule: a shard read by its own rank, never broadcast."""
    if d is None:
        return False
    outer = 1
    for n in shape[:d]:
        outer *= n
    return outer == 1 or nbytes == 0


def shard_bytes(shape, nbytes, d, rank, world):
    size = shape[d]
    if size == 0:
        return 0
    block = -(-size // world)
    start = min(rank * block, size)
    return nbytes // size * min(block, size - start)


def expected_reads(ck, dims, world):
    """What the layout says: the bytes of the broadcast tensors (read once
    in each node), and each rank's contiguous shards (read by that rank)."""
    bcast, own = 0, [0] * world
    for name in ck.keys():
        _dtype, shape, nbytes = ck.info(name)
        d = dims.get(name)
        if contiguous(shape, nbytes, d):
            for r in range(world):
                own[r] += shard_bytes(shape, nbytes, d, r, world)
        else:
            bcast += nbytes
    return bcast, own


def read_bytes(stats):
    m = re.search(r"read (\d+) bytes from storage", stats["describe"])
    assert m, stats["describe"]
    return int(m.group(1))


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
    gpu = 0 if SAME_GPU else rank
    device = f"cuda:{gpu}"
    torch.cuda.set_device(gpu)
    dist.init_process_group("gloo")
    timeout_ms = int(os.environ.get("TIMEOUT_MS", "20000"))
    comm = fst.Comm(device=gpu, timeout_ms=timeout_ms)
    node = None
    if mode.startswith("nodes"):
        node_size = int(os.environ.get("NODE_SIZE", "2"))
        node = fst.node_comm(node_size, device=gpu, timeout_ms=timeout_ms)
    ck = fst.Checkpoint(path)
    dims = shard_dims(ck)
    say = lambda *a: print(f"[rank {rank}]", *a, flush=True)

    def expect_failure(note="", want=None):
        """The sharded load must fail (with want in its message, when given):
        say how fast and why; returns seconds."""
        t0 = time.perf_counter()
        try:
            fst.load_sharded(ck, comm, dims, node=node)
        except fst.SafetensorError as e:
            dt = time.perf_counter() - t0
            if want and want not in str(e):
                say(f"FAIL: failed in {dt:.2f} s, but not with {want!r}: {e}")
                sys.exit(1)
            say(f"OK: failed in {dt:.2f} s{note}: {e}")
            return dt
        say("FAIL: the load succeeded")
        sys.exit(1)

    def check_shards(got):
        """got against the reference loader's tensors and a single-GPU load,
        cut the same way; returns how many tensors."""
        single = fst.load_file(path, device=device)
        n = 0
        for f in ck.files():
            for name, full in ref_load(f).items():
                want = cut(full, dims.get(name), rank, world)
                assert tuple(got[name].shape) == tuple(want.shape), (name, got[name].shape,
                                                                     want.shape)
                assert got[name].device == torch.device(device)
                assert same_bytes(got[name], want), f"{name}: bytes differ from the reference"
                assert same_bytes(got[name], cut(single[name], dims.get(name), rank, world)), \
                    f"{name}: bytes differ from a single-GPU load"
                n += 1
        return n

    if mode == "check":
        stats = {}
        got = fst.load_sharded(path, comm, dims, stats=stats)
        n = check_shards(got)
        say(f"OK: {n} tensors equal to the reference slices and to a single-GPU load; "
            f"{stats['describe']}")
    elif mode == "nodes":
        stats = {}
        got = fst.load_sharded(path, comm, dims, stats=stats, node=node)
        n = check_shards(got)
        say(f"OK: {n} tensors equal to the reference slices and to a single-GPU load; "
            f"{stats['describe']}")
        reads = [None] * world
        dist.all_gather_object(reads, read_bytes(stats))
        bcast, own = expected_reads(ck, dims, world)
        if rank == 0:
            total = sum(ck.info(name)[2] for name in ck.keys())
            print(f"{world} ranks in nodes of {node_size}; checkpoint {total} bytes, "
                  f"{bcast} of them broadcast (read once in each node)")
            for r in range(world):
                print(f"  rank {r} (node {r // node_size}): read {reads[r]} bytes "
                      f"({own[r]} its own shards)")
        for first in range(0, world, node_size):
            ranks = range(first, first + node_size)
            got_bytes, want = sum(reads[r] for r in ranks), bcast + sum(own[r] for r in ranks)
            if rank == 0:
                print(f"  node {first // node_size} (ranks {first}..{first + node_size - 1}): "
                      f"read {got_bytes} bytes, the layout says {want}")
            assert got_bytes == want, (first, got_bytes, want)
        total_reads = sum(reads)
        assert total_reads == sum(own) + world // node_size * bcast, total_reads
        say(f"OK: every node read each broadcast tensor once and its ranks' own shards "
            f"({world // node_size} nodes, {total_reads} bytes read in all)")
    elif mode == "fail" or mode == "nodes-fail":
        if rank == 1:
            fst._fst.fault_set("read:1")  # this rank's first tensor read fails
        # the ranks agree on the failure: all of them at once, not by timing out
        dt = expect_failure(want="read of" if rank == 1 else "could not read its share")
        assert dt < timeout_ms / 1000 / 2, f"{dt:.2f} s: the ranks timed out instead of agreeing"
    elif mode == "nccl":
        # The real NCCL call of the final agreement fails on rank 1 (an
        # injected fault at the nccl site): both ranks fail, then both load
        # again over a new communicator, with the right bytes.
        if rank == 1:
            fst._fst.fault_set("nccl:1")
        expect_failure()
        fst._fst.fault_set(None)
        dist.barrier()
        comm2 = fst.Comm(device=gpu, timeout_ms=timeout_ms)
        got = fst.load_sharded(path, comm2, dims)
        single = fst.load_file(path, device=device)
        for name, t in got.items():
            assert same_bytes(t, cut(single[name], dims.get(name), rank, world)), name
        say(f"OK: loaded again over a new communicator: {len(got)} tensors equal to a "
            f"single-GPU load")
    elif mode == "vanish" or mode == "nodes-vanish":  # node (above) comes from the mode
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
                            out.update(ref_load(f, device=device))
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
