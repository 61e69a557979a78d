"""fastsafetensors.parallel_loader: ParallelLoader (and PipelineParallel),
what vLLM's fastsafetensors weights iterator drives:

    pl = ParallelLoader(pg, hf_weights_files, queue_size=..., device="cuda:0", nogds=...)
    for name, tensor in pl.iterate_weights(): ...
    pl.close()

With a torch.distributed group of W ranks the files go W at a time, one a
rank: rank r reads file r of each batch (with fst.load) while the previous
batch goes out, and every rank yields every tensor, broadcast by its
owner a run of tensors at a time. With one rank (or all_local) each file
streams through fst.iter_tensors: tensors are yielded as they land, while
the rest of the file is still being read."""
import logging
import queue
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple

import fst

from . import _support
from .common import SafeTensorsMetadata, SingleGroup
from .loader import BaseSafeTensorsFileLoader, SafeTensorsFileLoader
from .st_types import DType

logger = logging.getLogger("fst.compat.fastsafetensors")

_BAR_FORMAT = ("{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} "
               "[{elapsed}<{remaining}, {rate_fmt}]\n")


def enable_tqdm(use_tqdm_on_load: bool, framework=None) -> bool:
    """A progress bar only on global rank 0, and only with tqdm installed."""
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    rank = framework.get_global_rank() if framework is not None else 0
    return bool(use_tqdm_on_load) and rank == 0


def _progress(items: List[Any], enabled: bool):
    if not enabled:
        return items
    from tqdm.auto import tqdm
    return tqdm(items, desc="Loading safetensors checkpoint shards (fst)", bar_format=_BAR_FORMAT)


def _chunks(meta: SafeTensorsMetadata, names: List[str], max_bytes: int) -> List[List[str]]:
    """The names in data-offset order, cut into spans of at most max_bytes
    of the file; a tensor is never split, so none may be larger."""
    out: List[List[str]] = []
    start = None
    for name in names:
        s, e = meta.tensors[name].data_offsets
        if e - s > max_bytes:
            raise _support.usage(f"max_batch_bytes={max_bytes}: tensor {name} of {meta.src} "
                                 f"has {e - s} bytes")
        if start is None or e - start > max_bytes:
            out.append([])
            start = s
        out[-1].append(name)
    return out


class PipelineParallel:
    """The pipeline of ParallelLoader over a given loader."""

    def __init__(self, pg: Optional[Any], loader: BaseSafeTensorsFileLoader,
                 hf_weights_files: List[str], max_concurrent_producers: int = 1,
                 queue_size: int = 0, use_tqdm_on_load: bool = True,
                 tensor_filter: Optional[Callable[[str], bool]] = None,
                 max_batch_bytes: Optional[int] = None,
                 use_chunk_budget_as_allocation_size: bool = False,
                 device_memory_budget: Optional[int] = None, accumulate_resident: bool = True,
                 resident_tensor: Optional[Callable[[str], bool]] = None,
                 broadcast_run_bytes: int = 16 << 20, broadcast_run_tensors: int = 64,
                 overlap_io: bool = True, borrowed_tensors: bool = False, **kwargs):
        if max_concurrent_producers != 1:
            raise _support.usage(f"max_concurrent_producers must be 1 (got "
                                 f"{max_concurrent_producers}): the ranks take batches in "
                                 "one order")
        self.loader = loader
        self.pg = loader.pg if pg is None else loader.framework.get_process_group(pg)
        if tensor_filter is not None and (self.pg.size() > 1 or loader.pg.size() > 1):
            raise _support.usage("tensor_filter requires a single-process loader group "
                                 "(ParallelLoader(all_local=True) or pg=None): the ranks "
                                 "would otherwise be sent tensors they filtered out")
        if use_chunk_budget_as_allocation_size and max_batch_bytes is None and \
                device_memory_budget is None:
            raise _support.usage("use_chunk_budget_as_allocation_size requires max_batch_bytes "
                                 "or device_memory_budget")
        if resident_tensor is not None and not accumulate_resident:
            raise _support.usage("resident_tensor requires accumulate_resident=True")
        if borrowed_tensors and accumulate_resident:
            raise _support.usage("borrowed_tensors requires accumulate_resident=False: its "
                                 "tensors die when the iterator moves on")
        if borrowed_tensors and (self.pg.size() != 1 or loader.pg.size() != 1):
            raise _support.usage("borrowed_tensors requires a single-process loader group")
        if broadcast_run_bytes < 0 or broadcast_run_tensors < 0:
            raise _support.usage("broadcast run limits must be non-negative")
        if max_batch_bytes is not None and max_batch_bytes <= 0:
            raise _support.usage(f"max_batch_bytes={max_batch_bytes}: must be positive")
        if tensor_filter is not None:
            loader.set_tensor_filter(tensor_filter)
        self.hf_weights_files = [_support.fspath(f) for f in hf_weights_files]
        self.max_concurrent_producers = max_concurrent_producers
        self.queue_size = queue_size
        self.use_tqdm_on_load = use_tqdm_on_load
        self.max_batch_bytes = max_batch_bytes
        self.borrowed_tensors = borrowed_tensors
        self.broadcast_run_bytes = broadcast_run_bytes
        self.broadcast_run_tensors = broadcast_run_tensors
        self.collective = bool(getattr(loader.pg, "collective", False))
        # fastsafetensors clones each single-rank tensor because its file
        # buffer is freed at close; fst's loads live while any view does,
        # so the views are yielded as they are (docs/python.md: a copy of
        # each tensor cost vLLM's iterator 10-19% of its time on an H200)
        self.weight_files_batches = self._create_batches()
        self.stop_event = threading.Event()

    def _create_batches(self) -> List[List[Optional[Tuple[str, Optional[List[str]]]]]]:
        """Batches of (file, names or None for all) a rank, W a batch for a
        group of W ranks; with max_batch_bytes a file's chunks go over
        successive batches, None once a rank's file has run out."""
        width = self.loader.pg.size() if self.collective else 1
        groups = [self.hf_weights_files[i:i + width]
                  for i in range(0, len(self.hf_weights_files), width)]
        keep = self.loader._tensor_filter
        if self.max_batch_bytes is None and keep is None:
            return [[(f, None) for f in g] for g in groups]
        batches = []
        for group in groups:
            plans = []
            for f in group:
                meta = SafeTensorsMetadata.from_file(f, self.loader.framework)
                names = [k for k in meta.tensors if keep is None or keep(k)]
                plans.append((f, _chunks(meta, names, self.max_batch_bytes)
                              if self.max_batch_bytes is not None else [names]))
            for j in range(max(len(c) for _, c in plans)):
                batches.append([(f, c[j]) if j < len(c) else None for f, c in plans])
        return batches

    # ---- one rank, or ranks that read every file themselves

    def _iterate_local(self) -> Iterator[Tuple[str, Any]]:
        fw, device = self.loader.framework, self.loader.device
        fw.set_device(device)
        options = dict(self.loader._options)
        for batch in _progress(self.weight_files_batches,
                               enable_tqdm(self.use_tqdm_on_load, fw)):
            for entry in batch:
                if entry is None:
                    continue
                path, names = entry
                if names is not None and not names:
                    continue
                ck = fst.Checkpoint(path)
                it = fst.iter_tensors(path, _support.fst_device(device),
                                      framework=fw.fst_framework, names=names, **options)
                try:
                    for name, raw in it:
                        dtype, shape, _ = ck.info(name)
                        try:
                            st_dtype = DType(dtype)
                        except ValueError:
                            st_dtype = dtype
                        t = fw.from_fst(raw, st_dtype, list(shape), device)
                        del raw
                        yield name, t.get_raw()
                        del t
                finally:
                    it.close()

    # ---- a torch.distributed group: each rank reads its own file

    def _producer(self, out: "queue.Queue", slots: threading.Semaphore) -> None:
        for batch in self.weight_files_batches:
            while not slots.acquire(timeout=0.1):
                if self.stop_event.is_set():
                    return
            if self.stop_event.is_set():
                slots.release()
                return
            try:
                self.loader.reset()
                plan = {r: e for r, e in enumerate(batch) if e is not None}
                self.loader.add_filenames({r: [e[0]] for r, e in plan.items()})
                if self.max_batch_bytes is not None or self.loader._tensor_filter is not None:
                    self.loader._set_chunk_plan({e[0]: e[1] for e in plan.values()})
                item = self.loader.copy_files_to_device(_defer_errors=True)
            except Exception as e:  # agreed on by the consumer, with the other ranks
                item = e
            out.put(item)
            if isinstance(item, Exception):
                return

    def _iterate_group(self) -> Iterator[Tuple[str, Any]]:
        from .file_buffer import FilesBufferOnDevice
        # the current CUDA device is a thread's own: the collectives run here
        self.loader.framework.set_device(self.loader.device)
        depth = 1 if self.queue_size < 0 else self.queue_size + 2
        slots = threading.Semaphore(depth)
        out: "queue.Queue" = queue.Queue()
        producer = threading.Thread(target=self._producer, args=(out, slots), daemon=True,
                                    name="fst-parallel-loader")
        producer.start()
        fb = None
        try:
            for _ in _progress(self.weight_files_batches,
                               enable_tqdm(self.use_tqdm_on_load, self.loader.framework)):
                item = out.get()
                if isinstance(item, Exception):
                    probe = FilesBufferOnDevice({}, self.loader.pg, self.loader.framework)
                    probe._agree(item)
                fb = item
                fb._agree(fb._load_error)
                keys = list(fb.key_to_rank_lidx)
                yield from fb._iter_tensors(keys, self.broadcast_run_bytes,
                                            self.broadcast_run_tensors)
                fb.close()
                fb = None
                slots.release()
        finally:
            self.stop_event.set()
            if fb is not None:
                fb.close()
            producer.join()
            while not out.empty():
                item = out.get_nowait()
                if not isinstance(item, Exception):
                    item.close()

    def iterate_weights(self) -> Iterator[Tuple[str, Any]]:
        """(name, tensor) for every tensor of the files, each once, on every
        rank. With one rank they are views of each file's fst load, valid
        for as long as they are held (keeping one keeps its file's memory:
        copy what you keep); with a group, each its own allocation."""
        self.stop_event.clear()
        if self.collective:
            return self._iterate_group()
        return self._iterate_local()

    def close(self) -> None:
        """Close the loader; a running iterate_weights must be exhausted or
        closed first for its buffers to go."""
        self.loader.close()


class ParallelLoader(PipelineParallel):
    """fastsafetensors.ParallelLoader over fst: SafeTensorsFileLoader's
    options (device, bbuf_size_kb, max_threads, nogds, framework, ...) and
    the pipeline's (queue_size, tensor_filter with all_local,
    max_batch_bytes, broadcast_run_bytes/_tensors, borrowed_tensors).
    device_memory_budget, accumulate_resident, resident_tensor, overlap_io,
    use_fgds and set_numa are accepted and not used (docs/python.md)."""

    def __init__(self, pg: Optional[Any], hf_weights_files: List[str],
                 max_concurrent_producers: int = 1, queue_size: int = 0,
                 use_tqdm_on_load: bool = True, device: Any = "cpu",
                 bbuf_size_kb: int = 16 * 1024, max_threads: int = 16, nogds: bool = False,
                 set_numa: bool = True, debug_log: bool = False, framework: str = "pytorch",
                 tensor_filter: Optional[Callable[[str], bool]] = None, all_local: bool = False,
                 max_batch_bytes: Optional[int] = None,
                 use_chunk_budget_as_allocation_size: bool = False,
                 device_memory_budget: Optional[int] = None, accumulate_resident: bool = True,
                 resident_tensor: Optional[Callable[[str], bool]] = None,
                 use_fgds: bool = False, broadcast_run_bytes: int = 16 << 20,
                 broadcast_run_tensors: int = 64, overlap_io: bool = True,
                 borrowed_tensors: bool = False, **kwargs):
        loader_pg = SingleGroup() if all_local else pg
        loader = SafeTensorsFileLoader(loader_pg, device, bbuf_size_kb=bbuf_size_kb,
                                       max_threads=max_threads, nogds=nogds, set_numa=set_numa,
                                       debug_log=debug_log, framework=framework,
                                       use_fgds=use_fgds, **kwargs)
        super().__init__(loader_pg, loader, hf_weights_files, max_concurrent_producers,
                         queue_size, use_tqdm_on_load, tensor_filter=tensor_filter,
                         max_batch_bytes=max_batch_bytes,
                         use_chunk_budget_as_allocation_size=use_chunk_budget_as_allocation_size,
                         device_memory_budget=device_memory_budget,
                         accumulate_resident=accumulate_resident,
                         resident_tensor=resident_tensor,
                         broadcast_run_bytes=broadcast_run_bytes,
                         broadcast_run_tensors=broadcast_run_tensors, overlap_io=overlap_io,
                         borrowed_tensors=borrowed_tensors)
