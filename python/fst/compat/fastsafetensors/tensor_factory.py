"""fastsafetensors.tensor_factory: LazyTensorFactory, one file of a
FilesBufferOnDevice: its header, the rank that owns it, and, on that rank
alone, its tensors as fst loaded them. The other ranks get them over the
process group (broadcast, scatter, send), so that no rank reads a file it
does not own."""
import logging
from typing import Any, Dict, List, Optional, Tuple

import fst

from . import _support
from .common import SafeTensorsMetadata
from .frameworks import FrameworkOpBase, ProcessGroupBase, TensorBase
from .st_types import Device, DType

logger = logging.getLogger("fst.compat.fastsafetensors")

_PACKED = (DType.F4, DType.F6_E2M3, DType.F6_E3M2)


def shard_range(size: int, world: int, rank: int) -> Tuple[int, int]:
    """[start, stop) of rank's block along a dimension of `size`:
    ceil(size / world) a block, the last ones shorter or empty."""
    block = -(-size // world)
    return min(rank * block, size), min((rank + 1) * block, size)


def shard_dim(dim: int, st_shape: List[int]) -> Optional[int]:
    """The dimension a get_sharded(dim) cuts; None for the whole tensor
    (dim -1, fastsafetensors' broadcast, and any dim of a 0-d tensor).
    Other negative dims count from the end."""
    if dim == -1 or not st_shape:
        return None
    d = dim + len(st_shape) if dim < 0 else dim
    if not 0 <= d < len(st_shape):
        raise _support.usage(f"dim {dim}: the tensor has {len(st_shape)} dimensions "
                             f"(shape {list(st_shape)})")
    return d


class LazyTensorFactory:
    def __init__(self, metadata: SafeTensorsMetadata, device: Device, rank: int,
                 local_rank: bool, factory_idx_bits: int, lidx: int, copier: Any,
                 framework: FrameworkOpBase, disable_cache: bool = True,
                 group: Optional[ProcessGroupBase] = None,
                 options: Optional[Dict[str, Any]] = None,
                 names: Optional[List[str]] = None):
        """fastsafetensors' arguments, of which factory_idx_bits (for its
        message tags), copier and disable_cache (its reader and its cache
        of shuffled tensors) have no use here; `local_rank` says whether
        this rank reads the file, `options` are fst.load's."""
        self.framework = framework
        self.metadata = metadata
        self.device = device
        self.rank = rank
        self.local_rank = local_rank
        self.lidx = lidx
        self.group = group
        self.options = dict(options or {})
        # the tensors to read; None: all of them
        self.names = names
        self.tensors: Dict[str, TensorBase] = {}
        self.loaded = False
        # set on every rank alike, so that all refuse a released file before
        # any collective instead of the others waiting for the owner
        self.released = False
        self._nbytes = 0
        # dtype of each tensor as handed out (after a copy_files_to_device
        # dtype conversion), the same on every rank
        self.dtypes: Dict[str, Any] = {k: t.dtype for k, t in metadata.tensors.items()}

    # ---- what every rank knows from the header

    def shape(self, name: str) -> List[int]:
        return list(self.metadata.tensors[name].shape)

    def nbytes(self, name: str, st_shape: Optional[List[int]] = None) -> int:
        return self.framework.nbytes(self.dtypes[name], self.shape(name) if st_shape is None
                                     else st_shape)

    def _torch_device(self) -> str:
        return "cpu" if self.framework.fst_framework == "numpy" else _support.fst_device(self.device)

    def _empty_bytes(self, n: int):
        import torch
        return torch.empty(n, dtype=torch.uint8, device=self._torch_device())

    # ---- loading, on the owner

    @property
    def gbuf(self):
        """The loaded tensors while this factory holds them, else None
        (fastsafetensors' device buffer, released by free_dev_ptrs)."""
        return self.tensors if self.loaded and self.tensors else None

    def submit_io(self) -> None:
        """Read the file with fst (names= when a filter or a chunk keeps
        part of it) and keep its tensors; does nothing on other ranks."""
        if not self.local_rank:
            return
        names = self.names if self.names is not None else list(self.metadata.tensors)
        if names:
            source = self.metadata.src
            whole = self.names is None or len(names) == len(self.metadata.tensors)
            loaded = fst.load(source, _support.fst_device(self.device),
                              framework=self.framework.fst_framework,
                              names=None if whole else names, **self.options)
            for name in names:
                frame = self.metadata.tensors[name]
                t = self.framework.from_fst(loaded[name], frame.dtype, frame.shape, self.device)
                # counted a tensor at a time, into both at once: a conversion
                # that fails part way leaves free_dev_ptrs to take back
                # exactly what was added
                n = t.get_nbytes()
                self._nbytes += n
                self.framework.mem_used += n
                if self.dtypes[name] != frame.dtype:
                    t = self._converted(name, t)
                self.tensors[name] = t
        self.loaded = True
        logger.debug("loaded %s on rank %d: %d tensors", self.metadata.src, self.rank,
                     len(self.tensors))

    def _converted(self, name: str, t: TensorBase) -> TensorBase:
        want = self.dtypes[name]
        try:
            return t.to(dtype=want)
        except (NotImplementedError, RuntimeError, TypeError, ValueError) as e:
            have = self.metadata.tensors[name].dtype
            raise fst.UnsupportedError(
                f"{self.metadata.src}: tensor {name}: {self.framework.get_name()} cannot convert "
                f"{have.value} to {getattr(want, 'value', want)} ({e})", -6) from None

    def convert(self, dtype: Any) -> None:
        """Hand out every tensor as `dtype` (fastsafetensors converts every
        tensor of the files, integers included). Every rank calls it."""
        if dtype is not None and dtype != DType.AUTO:
            for name in self.dtypes:
                self.dtypes[name] = dtype

    def check_live(self, name: str) -> None:
        if self.released:
            raise _support.usage(f"tensor {name}: released: every tensor of "
                                 f"{self.metadata.src} was handed out over the group already")

    def _local(self, name: str) -> TensorBase:
        self.check_live(name)
        t = self.tensors.get(name)
        if t is None:
            raise _support.unknown("LazyTensorFactory", name)
        return t

    def free_dev_ptrs(self) -> None:
        """Drop this factory's references: the memory goes when the last
        tensor handed out from it goes too."""
        if self._nbytes:
            self.framework.mem_used -= self._nbytes
            self._nbytes = 0
        self.tensors = {}
        self.released = True

    # ---- handing out

    def _collective(self) -> bool:
        return bool(getattr(self.group, "collective", False))

    def _cut(self, name: str, d: int, rank: int):
        """(index of the loaded tensor, safetensors shape) of rank's block
        along dim d."""
        dtype, st_shape = self.dtypes[name], self.shape(name)
        start, stop = shard_range(st_shape[d], self.group.size(), rank)
        shard = list(st_shape)
        shard[d] = stop - start
        index = (slice(None),) * d + (slice(start, stop, 1),)
        if dtype in _PACKED:
            if list(self.framework.loaded_shape(dtype, st_shape))[:-1] != st_shape[:-1]:
                raise _support.usage(f"tensor {name}: {dtype.value} {st_shape} is held as flat "
                                     "bytes (its rows split bytes) and cannot be sharded")
            if d == len(st_shape) - 1:
                if dtype != DType.F4:
                    raise _support.usage(f"tensor {name}: {dtype.value} cannot be sharded along "
                                         "its last dimension")
                # every rank's block, not only `rank`'s: so that every rank
                # refuses the tensor alike, before any collective
                world = self.group.size()
                for r in range(world):
                    s, e = shard_range(st_shape[d], world, r)
                    if s % 2 or e % 2:
                        raise _support.usage(
                            f"tensor {name} of {self.metadata.src}: F4 {st_shape} cannot be "
                            f"sharded along dim {d} over {world} ranks: rank {r}'s block is "
                            f"values [{s}, {e}), and bounds must be even: a byte holds two F4 "
                            "values")
                index = self.framework.get_native_slices(dtype, st_shape, index)
        return index, shard

    def shuffle(self, pg: ProcessGroupBase, tensor_name: str, dim: int) -> TensorBase:
        """This rank's part of a tensor: all of it for dim -1, else its block
        along dim, from the owner (broadcast or scatter) when the group is
        a torch.distributed one."""
        self.group = pg
        if pg.size() == 1:
            return self._local(tensor_name)  # every dim means the whole tensor here
        st_shape = self.shape(tensor_name)
        d = shard_dim(dim, st_shape)
        if not self._collective():
            t = self._local(tensor_name)
            return t if d is None else t[self._cut(tensor_name, d, pg.rank())[0]]
        me, dtype = pg.rank(), self.dtypes[tensor_name]
        if d is None:
            if me == self.rank:
                flat = self._local(tensor_name).byte_view().clone()
            else:
                flat = self._empty_bytes(self.nbytes(tensor_name))
            pg.broadcast_bytes(flat, self.rank)
            return self.framework.from_bytes(flat, dtype, st_shape, self.device)
        cuts = [self._cut(tensor_name, d, r) for r in range(pg.size())]
        sizes = [self.nbytes(tensor_name, shard) for _, shard in cuts]
        chunks = None
        if me == self.rank:
            t = self._local(tensor_name)
            chunks = [self._padded(t[index].byte_view(), max(sizes)) for index, _ in cuts]
        out = self._empty_bytes(max(sizes))
        pg.scatter_bytes(out, chunks, self.rank)
        return self.framework.from_bytes(out[: sizes[me]], dtype, cuts[me][1], self.device)

    def _padded(self, flat, n: int):
        """`flat` as n bytes: scatter moves blocks of one size, and the last
        ranks' blocks may be shorter."""
        if flat.numel() == n:
            return flat.contiguous()
        out = self._empty_bytes(n)
        out[: flat.numel()].copy_(flat)
        out[flat.numel():].zero_()
        return out

    def push(self, pg: ProcessGroupBase, tensor_name: str, dst_rank: int,
             src_rank: int) -> Optional[TensorBase]:
        """The tensor on dst_rank (sent by the owner), None on other ranks."""
        self.group = pg
        if pg.size() == 1:
            return self._local(tensor_name)
        me = pg.rank()
        if me != dst_rank and (me != src_rank or not self._collective()):
            return None
        if not self._collective():
            return self._local(tensor_name)
        if me == dst_rank and src_rank == dst_rank:
            return self._local(tensor_name).clone()
        if me == src_rank:
            pg.send_bytes(self._local(tensor_name).byte_view(), dst_rank, tag=self.lidx)
            return None
        flat = self._empty_bytes(self.nbytes(tensor_name))
        pg.recv_bytes(flat, src_rank, tag=self.lidx)
        return self.framework.from_bytes(flat, self.dtypes[tensor_name], self.shape(tensor_name),
                                         self.device)

    def shuffle_multi_cols(self, pg: ProcessGroupBase, tensor_names: List[str],
                           dim: int) -> TensorBase:
        """This rank's blocks along dim of each tensor, concatenated along
        dim. The tensors must agree on every other dimension."""
        self.group = pg
        first = self.shape(tensor_names[0])
        d = shard_dim(dim, first)
        if d is None:
            raise _support.usage(f"get_multi_cols: dim {dim} does not name a dimension of "
                                 f"{tensor_names[0]} {first}")
        for name in tensor_names[1:]:
            shape = self.shape(name)
            if len(shape) != len(first) or any(a != b for i, (a, b) in
                                               enumerate(zip(shape, first)) if i != d):
                raise _support.usage(f"get_multi_cols: {name} {shape} and {tensor_names[0]} "
                                     f"{first} differ outside dim {d}")
        world, me = pg.size(), pg.rank()

        def rank_shape(r):
            shape = list(first)
            shape[d] = sum(self._cut(n, d, r)[1][d] for n in tensor_names)
            return shape

        def rank_part(r):
            parts = [self._local(n)[self._cut(n, d, r)[0]] for n in tensor_names]
            return self.framework.concat_tensors(parts, dim=d)

        if not self._collective():
            return rank_part(me)
        sizes = [self.framework.nbytes(self.dtypes[tensor_names[0]], rank_shape(r))
                 for r in range(world)]
        chunks = None
        if me == self.rank:
            chunks = [self._padded(rank_part(r).byte_view(), max(sizes)) for r in range(world)]
        out = self._empty_bytes(max(sizes))
        pg.scatter_bytes(out, chunks, self.rank)
        return self.framework.from_bytes(out[: sizes[me]], self.dtypes[tensor_names[0]],
                                         rank_shape(me), self.device)
