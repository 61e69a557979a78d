"""Tensor parallelism over NCCL: Comm, fst's own communicator made over a
torch.distributed group; node_comm, one over the ranks of this rank's node;
and load_sharded, each byte read from storage once in the group, or once in
each node."""
from __future__ import annotations

import operator
import os
from typing import Dict, Optional

from . import _fst
from ._args import _IO, _check_target, _choice, _count, _framework, _is_int, _threads
from ._errors import ArgumentTypeError, UsageError, _raise_agreed, _rank_status
from ._load import _open
from ._tensors import _check_dtypes, _convert, _need_torch


class Comm:
    """An NCCL communicator for tensor-parallel loads, made over an existing
    torch.distributed process group (any backend): rank 0 makes the NCCL id
    and the group carries it, so no second rendezvous is needed. Where rank
    0 cannot make it (no NCCL there), every rank raises its error: rank 0
    its own, the others the same class naming rank 0 and the cause."""

    def __init__(self, group=None, device=None, timeout_ms: int = 0):
        import torch
        import torch.distributed as dist
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        uid, error = None, None
        if self.rank == 0:
            try:
                uid = _fst.comm_unique_id()
            except Exception as e:  # sent to the others, who wait for the id
                error = e
        box = [(uid, _rank_status(error))]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        uid, status = box[0]
        _raise_agreed(error, [status], "of the group could not make the NCCL id")
        if device is None:
            device = torch.cuda.current_device()
        self.device = int(str(device).split(":")[-1]) if not isinstance(device, int) else device
        self._comm = _fst.Comm(self.world, self.rank, uid, self.device, timeout_ms)


def _ranks_per_node(ranks_per_node) -> int:
    """ranks_per_node as an int >= 1; None is LOCAL_WORLD_SIZE (torchrun's)."""
    if ranks_per_node is None:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        if env is None:
            raise UsageError("ranks_per_node=None and LOCAL_WORLD_SIZE is not set: pass "
                             "ranks_per_node (torchrun sets LOCAL_WORLD_SIZE to the ranks it "
                             "starts on each node)", -1)
        if not env.strip().isdigit() or int(env) < 1:
            raise UsageError(f"LOCAL_WORLD_SIZE={env!r}: expected a number of ranks >= 1", -1)
        return int(env)
    if not _is_int(ranks_per_node):
        raise ArgumentTypeError(f"ranks_per_node={ranks_per_node!r}: expected an int >= 1, or "
                                "None for LOCAL_WORLD_SIZE", -1)
    n = operator.index(ranks_per_node)
    if n < 1:
        raise UsageError(f"ranks_per_node={ranks_per_node!r}: expected an int >= 1, or None "
                         "for LOCAL_WORLD_SIZE", -1)
    return n


def node_comm(ranks_per_node: Optional[int] = None, group=None, device=None,
              timeout_ms: int = 0) -> Comm:
    """A Comm over the ranks of this rank's node, for load_sharded(node=):
    the ranks of `group` (default: the world) in nodes of ranks_per_node
    consecutive ranks (default: LOCAL_WORLD_SIZE, which torchrun sets).

    torch.distributed.new_group must be entered by every process of the job
    for every group, in one order: so every process calls node_comm alike
    (each with its own group, when groups are given), the processes share
    their groups' ranks, and each makes every node's group of every one of
    them, in the same order, then its Comm over its own node's. A
    ranks_per_node that does not divide a group's size is a UsageError on
    every process (after the sharing, so no process is left waiting)."""
    n = _ranks_per_node(ranks_per_node)
    said = f"ranks_per_node={n}" if ranks_per_node is not None else f"LOCAL_WORLD_SIZE={n}"
    _count("timeout_ms", timeout_ms, "milliseconds >= 0 (0: FST_DIST_TIMEOUT_MS, else 300000)",
           2 ** 31 - 1)
    import torch.distributed as dist
    if group is None:
        ranks = list(range(dist.get_world_size()))
    else:
        ranks = list(dist.get_process_group_ranks(group))
    # every process's group and node size, so that all agree on the groups
    # to make, or all raise the same error
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (ranks, n, said))
    for their_ranks, their_n, their_said in everyone:
        if len(their_ranks) % their_n:
            raise UsageError(f"node_comm: {their_said} does not divide the group of "
                             f"{len(their_ranks)} ranks: a node is that many consecutive ranks "
                             "of the group", -1)
    nodes = sorted({tuple(r[i:i + k]) for r, k, _ in everyone for i in range(0, len(r), k)})
    me = dist.get_rank()
    mine_at = ranks.index(me) // n * n
    mine = tuple(ranks[mine_at:mine_at + n])
    made = None
    for node in nodes:
        pg = dist.new_group(list(node))
        if node == mine:
            made = pg
    return Comm(group=made, device=device, timeout_ms=timeout_ms)


def _check_node(comm, node) -> None:
    """node= against comm, as libfst checks it, but before anything is read."""
    if node is None:
        return
    if not hasattr(node, "_comm") or not all(_is_int(getattr(node, a, None))
                                             for a in ("rank", "world", "device")):
        raise ArgumentTypeError(f"node={node!r}: expected an fst.Comm over this rank's node's "
                                "ranks (fst.node_comm()), or None", -1)
    world, rank = getattr(comm, "world", None), getattr(comm, "rank", None)
    if not (_is_int(world) and _is_int(rank)):
        return  # a stand-in comm: libfst checks the rest
    if world % node.world:
        raise UsageError(f"node=: a node Comm of {node.world} ranks does not divide the "
                         f"group of {world} ranks", -1)
    if node.rank != rank % node.world:
        raise UsageError(f"node=: rank {rank} of the group is rank {node.rank} of the node "
                         f"Comm, not {rank % node.world}: a node's ranks must be consecutive "
                         "ranks of the group, in order (fst.node_comm() makes it so)", -1)
    if node.device != getattr(comm, "device", node.device):
        raise UsageError(f"node=: the node Comm is on cuda:{node.device}, comm on "
                         f"cuda:{comm.device}: both must be this rank's GPU", -1)


def load_sharded(path, comm: Comm, dims: Optional[Dict[str, Optional[int]]] = None,
                 framework="pt", io="auto", threads=0, staging_bytes=0,
                 stats: Optional[dict] = None, node: Optional[Comm] = None) -> Dict[str, object]:
    """Load a checkpoint across the ranks of `comm`, each byte read from
    storage once in the group. dims maps a tensor name to the dimension to
    shard (rank r gets block r of ceil(size / world)), or None to replicate;
    names not in dims are replicated. Every rank must call it alike. A dict
    passed as stats receives "describe" (with the bytes this rank read from
    storage) and "bytes" (this rank's tensor bytes).

    node: a Comm over the ranks of this rank's node (node_comm()): each byte
    is then read once in each node, and the broadcasts stay inside it; the
    ranks still agree over comm, so all fail together."""
    fw = _framework(framework)
    # the tensors land on comm's GPU, where numpy cannot take them
    _check_target(f"cuda:{getattr(comm, 'device', 0)}", fw)
    _check_node(comm, node)
    io_code = _choice("io", io, _IO)
    nthreads = _threads(threads)
    staging = _count("staging_bytes", staging_bytes, "a byte count >= 0 (0: libfst's default)")
    dims = {} if dims is None else dims
    if not hasattr(dims, "get") or not hasattr(dims, "items"):
        raise ArgumentTypeError(f"dims={dims!r}: expected a dict of tensor name to a dimension "
                                "(int) or None", -1)
    for k, v in dims.items():
        if v is not None and not _is_int(v):
            raise ArgumentTypeError(f"dims[{k!r}]={v!r}: expected a dimension (int) or None", -1)
        if v is not None and not 0 <= operator.index(v) < 2**31:
            # -1 would read as "the last dimension" to a torch user; here
            # dimensions count from the first, and None replicates
            raise UsageError(f"dims[{k!r}]={v!r}: expected a dimension >= 0 (counted from the "
                             "first), or None to replicate", -1)
    _need_torch()  # before the file, as load does
    ck = _open(path)
    _check_dtypes(fw, [ck], None)
    table = [(-1 if dims.get(n) is None else operator.index(dims[n])) for n in ck.keys()]
    buf = _fst.load_sharded(ck._ck, comm._comm, table, io=io_code, threads=nthreads,
                            staging_bytes=staging, node=None if node is None else node._comm)
    if stats is not None:
        stats["describe"] = buf.describe()  # says the bytes this rank read
        stats["bytes"] = buf.nbytes()
    return {name: _convert(buf.tensor(name), fw) for name in buf.names()}
