"""Tensor parallelism over NCCL: Comm, fst's own communicator made over a
torch.distributed group, and load_sharded, each byte read from storage once
in the group."""
from __future__ import annotations

import operator
from typing import Dict, Optional

from . import _fst
from ._args import _IO, _check_target, _choice, _count, _framework, _is_int, _threads
from ._errors import ArgumentTypeError
from ._load import _open
from ._tensors import _check_dtypes, _convert, _need_torch


class Comm:
    """An NCCL communicator for tensor-parallel loads, made over an existing
    torch.distributed process group (any backend): rank 0 makes the NCCL id
    and the group carries it, so no second rendezvous is needed."""

    def __init__(self, group=None, device=None, timeout_ms: int = 0):
        import torch
        import torch.distributed as dist
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        box = [_fst.comm_unique_id() if self.rank == 0 else None]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        if device is None:
            device = torch.cuda.current_device()
        self.device = int(str(device).split(":")[-1]) if not isinstance(device, int) else device
        self._comm = _fst.Comm(self.world, self.rank, box[0], self.device, timeout_ms)


def load_sharded(path, comm: Comm, dims: Optional[Dict[str, Optional[int]]] = None,
                 framework="pt", io="auto", threads=0, staging_bytes=0,
                 stats: Optional[dict] = None) -> Dict[str, object]:
    """Load a checkpoint across the ranks of `comm`, each byte read from
    storage once in the group. dims maps a tensor name to the dimension to
    shard (rank r gets block r of ceil(size / world)), or None to replicate;
    names not in dims are replicated. Every rank must call it alike. A dict
    passed as stats receives "describe" (with the bytes this rank read from
    storage) and "bytes" (this rank's tensor bytes)."""
    fw = _framework(framework)
    # the tensors land on comm's GPU, where numpy cannot take them
    _check_target(f"cuda:{getattr(comm, 'device', 0)}", fw)
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
    _need_torch()  # before the file, as load does
    ck = _open(path)
    _check_dtypes(fw, [ck], None)
    table = [(-1 if dims.get(n) is None else operator.index(dims[n])) for n in ck.keys()]
    buf = _fst.load_sharded(ck._ck, comm._comm, table, io=io_code, threads=nthreads,
                            staging_bytes=staging)
    if stats is not None:
        stats["describe"] = buf.describe()  # says the bytes this rank read
        stats["bytes"] = buf.nbytes()
    return {name: _convert(buf.tensor(name), fw) for name in buf.names()}
