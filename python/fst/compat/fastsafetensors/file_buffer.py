"""fastsafetensors.file_buffer: FilesBufferOnDevice, the files loaded by
SafeTensorsFileLoader.copy_files_to_device.

With a torch.distributed group of several ranks each file was read by its
owning rank only, and get_tensor, get_sharded, get_multi_cols, push_tensor
and as_dict are collectives: every rank must call them in the same order
(SPDMD), as in fastsafetensors."""
import logging
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import fst
from fst._errors import _raise_agreed, _rank_status

from . import _support
from .frameworks import FrameworkOpBase, ProcessGroupBase, TensorBase
from .st_types import Device, DType
from .tensor_factory import LazyTensorFactory

logger = logging.getLogger("fst.compat.fastsafetensors")

# Offsets of tensors inside a coalesced broadcast: fst's own alignment, so
# every dtype view of a slice is aligned as a load of fst's would be.
_RUN_ALIGN = 256


class FilesBufferOnDevice:
    """Tensors by name from files loaded on their owning ranks.

    Tensors handed out stay valid after close(): single-rank ones are views
    of fst's allocation (one per file) and keep it alive; multi-rank ones
    are this rank's own copies."""

    def __init__(self, rank_loaders: Dict[int, List[LazyTensorFactory]], pg: ProcessGroupBase,
                 framework: FrameworkOpBase, auto_mem_delete: bool = True,
                 keep_tensor: Optional[Callable[[str], bool]] = None,
                 borrowed_tensors: bool = False):
        self.framework = framework
        self.pg = pg
        self.borrowed_tensors = borrowed_tensors
        self._load_error: Optional[BaseException] = None
        self.rank_loaders = rank_loaders
        self.key_to_rank_lidx: Dict[str, Tuple[int, int]] = {}
        self.instantiated: Dict[int, Dict[int, Dict[str, bool]]] = {}
        where: Dict[str, str] = {}
        self._counts: Dict[Tuple[int, int], int] = {}
        for rank, loaders in rank_loaders.items():
            self.instantiated[rank] = {}
            for lidx, loader in enumerate(loaders):
                self.instantiated[rank][lidx] = {}
                for key in loader.metadata.tensors:
                    if keep_tensor is not None and not keep_tensor(key):
                        continue
                    if key in self.key_to_rank_lidx:
                        raise _support.usage(
                            f"FilesBufferOnDevice: key {key} must be unique among files "
                            f"({where[key]} and {loader.metadata.src})")
                    self.key_to_rank_lidx[key] = (rank, lidx)
                    where[key] = loader.metadata.src
                    self._counts[(rank, lidx)] = self._counts.get((rank, lidx), 0) + 1
        # fastsafetensors frees a file once every tensor of it went out over
        # the group: the copies are the ranks' own, the buffer is not needed.
        # Where nothing goes over a group the tensors are views of the load,
        # so dropping it would free nothing.
        self.auto_mem_delete = auto_mem_delete and bool(getattr(pg, "collective", False))

    # ---- errors on any rank are errors on every rank

    def _agree(self, error: Optional[BaseException]) -> None:
        """Raise on every rank if loading failed on any: the owner's error
        here, the same class naming the rank elsewhere, instead of the
        other ranks waiting forever in the next collective."""
        if not getattr(self.pg, "collective", False):
            if error is not None:
                raise error
            return
        statuses = self.pg.all_gather_object(_rank_status(error))
        _raise_agreed(error, statuses, "failed to load its files")

    # ---- lookups

    def _get_rank_lidx(self, tensor_name: str) -> Tuple[int, int]:
        if tensor_name not in self.key_to_rank_lidx:
            raise _support.unknown("FilesBufferOnDevice", tensor_name)
        return self.key_to_rank_lidx[tensor_name]

    def _factory(self, tensor_name: str,
                 live: bool = True) -> Tuple[int, int, LazyTensorFactory]:
        rank, lidx = self._get_rank_lidx(tensor_name)
        try:
            loader = self.rank_loaders[rank][lidx]
        except (KeyError, IndexError):
            raise _support.UnknownTensorError(
                f"FilesBufferOnDevice: {tensor_name}: the buffer is closed", -1) from None
        if live:
            loader.check_live(tensor_name)
        return rank, lidx, loader

    def get_keys(self) -> List[str]:
        return list(self.key_to_rank_lidx)

    def get_filename(self, tensor_name: str) -> str:
        """The file holding the tensor; "" for a name the files lack (as
        fastsafetensors before 0.5 answered; 0.5 raises ValueError)."""
        if tensor_name not in self.key_to_rank_lidx:
            return ""
        return self._factory(tensor_name, live=False)[2].metadata.src

    def get_shape(self, tensor_name: str) -> List[int]:
        """The safetensors shape (F4 counts values, not bytes)."""
        return self._factory(tensor_name, live=False)[2].shape(tensor_name)

    # ---- handing out

    def _done(self, rank: int, lidx: int, names: List[str]) -> None:
        if not self.auto_mem_delete:
            return
        seen = self.instantiated[rank][lidx]
        for n in names:
            seen[n] = True
        if len(seen) >= self._counts.get((rank, lidx), 0):
            self.rank_loaders[rank][lidx].free_dev_ptrs()

    def _to(self, t: TensorBase, device: Any, dtype: Any) -> TensorBase:
        return t.to(device=_support.to_device(device),
                    dtype=_support.to_dtype(dtype, self.framework))

    def get_sharded_wrapped(self, tensor_name: str, dim: int, device: Optional[Device] = None,
                            dtype: Any = DType.AUTO) -> TensorBase:
        rank, lidx, loader = self._factory(tensor_name)
        t = loader.shuffle(self.pg, tensor_name, dim)
        self._done(rank, lidx, [tensor_name])
        return self._to(t, device, dtype)

    def get_sharded(self, tensor_name: str, dim: int, device: Optional[Device] = None,
                    dtype: Any = DType.AUTO) -> Any:
        """This rank's block of the tensor along dim (ceil(size / world) a
        rank, the last ones shorter or empty), scattered by its owner.
        dim -1 is the whole tensor on every rank (get_tensor)."""
        return self.get_sharded_wrapped(tensor_name, dim, device, dtype).get_raw()

    def get_tensor_wrapped(self, tensor_name: str, device: Optional[Device] = None,
                           dtype: Any = DType.AUTO) -> TensorBase:
        return self.get_sharded_wrapped(tensor_name, -1, device, dtype)

    def get_tensor(self, tensor_name: str, device: Optional[Device] = None,
                   dtype: Any = DType.AUTO) -> Any:
        """The tensor, broadcast by its owner to every rank; with one rank a
        view of fst's load (the same object on every call)."""
        return self.get_tensor_wrapped(tensor_name, device, dtype).get_raw()

    def push_tensor(self, tensor_name: str, dst_rank: int, device: Optional[Device] = None,
                    dtype: Any = DType.AUTO) -> Optional[Any]:
        """The tensor on dst_rank, sent by its owner; None on the others.
        A push does not count toward releasing the file (auto_mem_delete):
        the owner keeps its copy, so every rank may still get_tensor it."""
        rank, lidx, loader = self._factory(tensor_name)
        t = loader.push(self.pg, tensor_name, dst_rank, rank)
        # Not _done: only dst_rank (and the owner) take part in a push, so
        # counting it would release the file on some ranks and not on
        # others, and a later get_tensor of it would fail on some while the
        # rest wait in the broadcast. fastsafetensors never frees the
        # owner's copy for a push either.
        if t is None:
            return None
        return self._to(t, device, dtype).get_raw()

    def get_multi_cols(self, tensor_names: List[str], dim: int, device: Optional[Device] = None,
                       dtype: Any = DType.AUTO) -> TensorBase:
        """This rank's blocks along dim of every tensor, concatenated along
        dim in the order of the files (rank, then file), then of the names;
        a wrapped tensor, as fastsafetensors returns it (.get_raw())."""
        groups: Dict[Tuple[int, int], List[str]] = {}
        for name in tensor_names:
            groups.setdefault(self._get_rank_lidx(name), []).append(name)
        parts = []
        for (rank, lidx), names in sorted(groups.items()):
            loader = self._factory(names[0])[2]
            parts.append(loader.shuffle_multi_cols(self.pg, names, dim))
            self._done(rank, lidx, names)
        if not parts:
            raise _support.usage("get_multi_cols: no tensor names")
        t = parts[0] if len(parts) == 1 else self.framework.concat_tensors(parts, dim=dim)
        return self._to(t, device, dtype)

    def as_dict(self, tensor_shard_dim: "OrderedDict[str, int]") -> Dict[str, TensorBase]:
        """{name: this rank's part along its dim (-1: whole)}, as wrapped
        tensors."""
        out: Dict[str, TensorBase] = {}
        for name, dim in tensor_shard_dim.items():
            rank, lidx, loader = self._factory(name)
            out[name] = loader.shuffle(self.pg, name, dim)
            self._done(rank, lidx, [name])
        return out

    def iter_local_tensors(self, tensor_names: List[str]) -> Iterator[Tuple[str, Any]]:
        """(name, tensor) for tensors of this rank's own files, with no
        group call: a single-process group only."""
        if self.pg.size() != 1:
            raise fst.UsageError("iter_local_tensors requires a single-process group", -1)
        for name in tensor_names:
            yield name, self._factory(name)[2]._local(name).get_raw()

    def _runs(self, tensor_names: List[str], max_bytes: int,
              max_tensors: int) -> Iterator[List[str]]:
        """Consecutive names of one file, at most max_bytes and max_tensors
        a run (a larger tensor alone)."""
        run: List[str] = []
        where, size = None, 0
        for name in tensor_names:
            here = self._get_rank_lidx(name)
            n = self._factory(name)[2].nbytes(name)
            if run and (here != where or size + n > max_bytes or len(run) >= max_tensors):
                yield run
                run, size = [], 0
            run.append(name)
            where, size = here, size + n
        if run:
            yield run

    def _iter_tensors(self, tensor_names: List[str], max_bytes: int, max_tensors: int,
                      drain_runs: bool = False) -> Iterator[Tuple[str, Any]]:
        """(name, tensor) for every name, a run of a file's tensors at a time
        in one broadcast: far fewer collectives than a broadcast a tensor.
        The tensors of a run share one allocation of this rank's."""
        if not getattr(self.pg, "collective", False) or max_bytes <= 0 or max_tensors <= 0:
            for name in tensor_names:
                yield name, self.get_tensor(name)
            return
        import torch
        for run in self._runs(tensor_names, max_bytes, max_tensors):
            rank, lidx, loader = self._factory(run[0])
            offsets, total = [], 0
            for name in run:
                offsets.append(total)
                total += -(-loader.nbytes(name) // _RUN_ALIGN) * _RUN_ALIGN
            flat = loader._empty_bytes(total)
            if self.pg.rank() == rank:
                for name, off in zip(run, offsets):
                    src = loader._local(name).byte_view()
                    flat[off: off + src.numel()].copy_(src)
            self.pg.broadcast_bytes(flat, rank)
            for name, off in zip(run, offsets):
                n = loader.nbytes(name)
                t = self.framework.from_bytes(flat[off: off + n], loader.dtypes[name],
                                              loader.shape(name), loader.device)
                yield name, t.get_raw()
            self._done(rank, lidx, run)
            del flat
            if drain_runs and torch.cuda.is_available():
                self.framework.synchronize(loader.device)

    def close(self) -> None:
        """Drop the buffer's references to the loads; tensors handed out
        stay valid."""
        for loaders in self.rank_loaders.values():
            for loader in loaders:
                loader.free_dev_ptrs()
        self.rank_loaders = {}

    def __del__(self):
        # a buffer collected unclosed holds nothing any more: get_mem_used says so
        try:
            self.close()
        except Exception:
            pass
