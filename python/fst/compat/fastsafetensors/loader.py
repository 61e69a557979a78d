"""fastsafetensors.loader: SafeTensorsFileLoader and fastsafe_open.

Files are registered to ranks ({rank: [files]}); copy_files_to_device has
each rank read the files registered to it, with fst.load, onto the
loader's device. With a torch.distributed group of several ranks no rank
reads another's file: the FilesBufferOnDevice returned sends tensors over
the group. Every rank reads every header (they are small), so that all
know every tensor's dtype and shape, and all refuse a broken file alike."""
import logging
import math
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Union

import fst

from . import _support, cpp
from .common import SafeTensorsMetadata, TensorFrame
from .file_buffer import FilesBufferOnDevice
from .frameworks import get_framework_op
from .st_types import DType
from .tensor_factory import LazyTensorFactory

logger = logging.getLogger("fst.compat.fastsafetensors")

# fst.load options a caller may pass through the loader's **kwargs
_FST_OPTIONS = ("io", "chunk_bytes", "align", "torch_allocator", "threads", "staging_bytes",
                "gds")


class BaseSafeTensorsFileLoader:
    """Files registered to ranks, and their headers; loads through fst.

    `options` are fst.load's (threads, staging_bytes, gds, io, ...)."""

    def __init__(self, pg: Optional[Any], device: Any, set_numa: bool = True,
                 disable_cache: bool = True, framework: str = "pytorch",
                 options: Optional[Dict[str, Any]] = None, **ignored):
        self.framework = get_framework_op(framework)
        self._fw = fst._framework(framework)
        self.pg = self.framework.get_process_group(pg)
        self.device = self.framework.get_device(device, self.pg)
        self.meta: Dict[str, Any] = {}
        self.frames: "OrderedDict[str, TensorFrame]" = OrderedDict()
        self.disable_cache = disable_cache
        self._options = dict(options or {})
        self._tensor_filter: Optional[Callable[[str], bool]] = None
        # path -> names: the part of each file the next copy_files_to_device
        # reads (ParallelLoader's max_batch_bytes chunks)
        self._chunk_plan: Dict[str, List[str]] = {}

    def _collective(self) -> bool:
        return bool(getattr(self.pg, "collective", False))

    def reset(self) -> None:
        """Forget the files registered, to register others."""
        self.frames = OrderedDict()
        self.meta = {}
        self._chunk_plan = {}

    def close(self) -> None:
        """Forget the files; buffers from copy_files_to_device are theirs
        to close."""
        self.reset()

    def set_tensor_filter(self, keep_tensor: Optional[Callable[[str], bool]]) -> None:
        """Read only the tensors for which keep_tensor(name) is true (fst's
        names=, so the others are not read at all); the others are absent
        from get_keys and from the buffers."""
        self._tensor_filter = keep_tensor

    def get_keys(self) -> List[str]:
        keep = self._tensor_filter
        return [k for k in self.frames if keep is None or keep(k)]

    def get_shape(self, tensor_name: str) -> List[int]:
        """The safetensors shape of a registered tensor."""
        if tensor_name not in self.frames or (self._tensor_filter is not None
                                              and not self._tensor_filter(tensor_name)):
            raise _support.unknown("get_shape", tensor_name)
        return self.frames[tensor_name].shape

    def add_filenames(self, filenames: Dict[int, Sequence[str]]) -> None:
        """Register files to the ranks that will read them. Registration
        takes the ranks' lists in turn (fastsafetensors' order)."""
        lists = {}
        for rank, files in filenames.items():
            if isinstance(files, (str, os.PathLike)):
                files = [files]
            rank = int(rank)
            if self._collective() and not 0 <= rank < self.pg.size():
                raise _support.usage(f"add_filenames: rank {rank}: the group has ranks 0 to "
                                     f"{self.pg.size() - 1}")
            lists[rank] = [os.fspath(f) for f in files]
        for i in range(max((len(v) for v in lists.values()), default=0)):
            for rank, files in lists.items():
                if i < len(files):
                    meta = SafeTensorsMetadata.from_file(files[i], self.framework)
                    self.meta[files[i]] = (meta, rank)
                    self.frames.update(meta.tensors)

    def _set_chunk_plan(self, chunk_plan: Dict[str, List[str]]) -> None:
        self._chunk_plan = dict(chunk_plan)

    def copy_files_to_device(self, dtype: Any = DType.AUTO, use_buf_register: bool = True,
                             max_copy_block_size: int = 16 * 1024 ** 3,
                             allow_inflight: bool = False,
                             borrowed_tensors: bool = False,
                             _defer_errors: bool = False) -> FilesBufferOnDevice:
        """Read each rank's files (this rank's own; with a group that does
        not exchange tensors, every file) and return the buffer. dtype:
        every tensor handed out is converted to it (a DType or a framework
        dtype; DType.AUTO keeps the files' types). An error on one rank is
        raised on every rank of a torch.distributed group."""
        if borrowed_tensors and self.pg.size() != 1:
            raise _support.usage("borrowed_tensors requires a single-process loader group")
        self.framework.set_device(self.device)
        dtype = _support.to_dtype(dtype, self.framework)
        collective, me = self._collective(), self.pg.rank()
        factories: Dict[int, List[LazyTensorFactory]] = {r: [] for r in range(self.pg.size())}
        for r in sorted({rank for _, rank in self.meta.values()}):
            factories.setdefault(r, [])
        bits = math.ceil(math.log2(len(self.meta) + 1))
        keep = self._tensor_filter
        for i, (path, (meta, rank)) in enumerate(sorted(self.meta.items(), key=lambda kv: kv[0])):
            names = None
            if self._chunk_plan:
                names = list(self._chunk_plan.get(path, []))
            elif keep is not None:
                names = [k for k in meta.tensors if keep(k)]
            factory = LazyTensorFactory(meta, self.device, rank, not collective or rank == me,
                                        bits, i + 1, None, self.framework, self.disable_cache,
                                        group=self.pg, options=self._options, names=names)
            factory.convert(dtype)
            factories[rank].append(factory)
        if self._chunk_plan:
            wanted: Set[str] = set().union(*map(set, self._chunk_plan.values()))
            keep = wanted.__contains__
        # a duplicate name is refused here, before anything is read (every
        # rank has every header, so every rank refuses it alike)
        fb = FilesBufferOnDevice(factories, self.pg, self.framework, keep_tensor=keep,
                                 borrowed_tensors=borrowed_tensors)
        error = None
        # Whether every tensor to be read can be handed out (ml_dtypes for
        # numpy, torch's unsigned dtypes) is known from the headers: across
        # all files, before the first is read. Each rank checks the files
        # it reads, so a failure here is one rank's, like a failed read: it
        # goes to the others through _agree rather than out of here while
        # they wait there for this rank.
        try:
            for loaders in factories.values():
                for factory in loaders:
                    if factory.local_rank:  # this rank reads it
                        fst._check_dtypes(self._fw, [fst.Checkpoint(factory.metadata.src)],
                                          factory.names)
        except Exception as e:  # shared with the other ranks below
            error = e
        for loaders in factories.values():
            for factory in loaders:
                if error is None:
                    try:
                        factory.submit_io()
                    except Exception as e:  # shared with the other ranks below
                        error = e
        if error is not None:
            for loaders in factories.values():
                for factory in loaders:
                    factory.free_dev_ptrs()
        if _defer_errors:
            fb._load_error = error
            return fb
        try:
            fb._agree(error)
        except BaseException:
            fb.close()
            raise
        return fb


class SafeTensorsFileLoader(BaseSafeTensorsFileLoader):
    """fastsafetensors.SafeTensorsFileLoader over fst.

    device: "cpu", "cuda:N" (or a Device, a torch.device). bbuf_size_kb and
    max_threads: fastsafetensors' bounce buffer a reader thread and its
    threads, so fst gets max_threads reader threads and a staging budget of
    bbuf_size_kb * max_threads KiB. nogds=True: fst's gds="off"; otherwise
    "auto", where fst uses GPUDirect Storage if it works and reads through
    pinned staging if not (it never fails for its absence). set_numa,
    disable_cache, use_fgds: accepted; fst places its threads and staging
    itself. framework: "pytorch" ("pt", "torch") or "numpy". Keyword
    arguments named like fst.load's options (io, chunk_bytes, align,
    torch_allocator) are passed to it."""

    def __init__(self, pg: Optional[Any], device: Any = "cpu", bbuf_size_kb: int = 16 * 1024,
                 max_threads: int = 16, nogds: bool = False, set_numa: bool = True,
                 disable_cache: bool = True, debug_log: bool = False,
                 framework: str = "pytorch", use_fgds: bool = False, **kwargs):
        cpp.set_debug_log(debug_log)
        options = _support.load_options(bbuf_size_kb, max_threads, nogds)
        options.update({k: kwargs[k] for k in _FST_OPTIONS if k in kwargs})
        super().__init__(pg, device, set_numa, disable_cache, framework, options)


class fastsafe_open:
    """A context manager over one file, a list of files or a {rank: files}
    map: keys(), get_tensor(name), get_tensor_wrapped(name), metadata()
    ({filename: its __metadata__, "" when it has none}); the buffer's other
    methods (get_sharded, get_filename, ...) are reachable on it too.
    Tensors stay valid after the block."""

    def __init__(self, filenames: Union[str, List[str], Dict[int, List[str]]],
                 framework: str = "pt", pg: Optional[Any] = None, device: Any = "cpu",
                 nogds: bool = False, debug_log: bool = False,
                 max_copy_block_size: int = 16 * 1024 ** 3, use_fgds: bool = False,
                 *, max_threads: int = 16, bbuf_size_kb: int = 16 * 1024, **kwargs):
        self.fb = None
        self.loader = SafeTensorsFileLoader(pg, device, bbuf_size_kb, max_threads, nogds,
                                            debug_log=debug_log, framework=framework,
                                            use_fgds=use_fgds, **kwargs)
        if isinstance(filenames, (str, os.PathLike)):
            file_dict = {0: [filenames]}
        elif isinstance(filenames, dict):
            file_dict = filenames
        else:
            file_dict = {0: list(filenames)}
        self.loader.add_filenames(file_dict)
        self.fb = self.loader.copy_files_to_device(max_copy_block_size=max_copy_block_size)

    def metadata(self) -> Dict[str, Any]:
        return {f: meta.metadata for f, (meta, _) in self.loader.meta.items()}

    def keys(self) -> List[str]:
        return list(self.fb.key_to_rank_lidx)

    def get_tensor_wrapped(self, name: str):
        return self.fb.get_tensor_wrapped(name)

    def get_tensor(self, name: str) -> Any:
        return self.fb.get_tensor(name)

    def __getattr__(self, attr: str):
        fb = self.__dict__.get("fb")
        if fb is None:
            raise AttributeError(attr)
        return getattr(fb, attr)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, tb):
        if self.fb is not None:
            self.fb.close()
        self.loader.close()
        return False
