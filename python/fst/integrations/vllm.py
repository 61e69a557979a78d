"""vLLM plugin: `vllm serve MODEL --load-format fst`.

vLLM calls `register()` in every process through the `vllm.general_plugins`
entry point that the fst package declares. It registers load format "fst"
with vLLM's own `register_model_loader`: a subclass of vLLM's
DefaultModelLoader that keeps vLLM's file discovery and filters and replaces
only the weights iterator.

- One process: fst's streaming iterator onto the worker's device, shard
  after shard in vLLM's (natural) order, each tensor as soon as it is ready.
- Several ranks (tensor or pipeline parallelism): every rank needs every full
  tensor (vLLM's weight loaders cut their slice), but each file is read from
  storage by one rank only; the others receive its tensors by broadcast over
  vLLM's world group, as vLLM's fastsafetensors path does (with pipeline
  stages, over each stage's tensor-parallel group: a draft model is loaded
  by the last stage alone).
- `local_expert_ids` (expert-parallel filtering): expert weights of other
  ranks are not read at all (fst's name filter).
- `model_loader_extra_config` takes fst's options: threads, staging_bytes,
  chunk_bytes, readahead_bytes, io ("auto", "pread", "uring"), gds ("auto",
  "on", "off").

Written against vLLM 0.33's loader API (docs/engines.md).
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

WRITTEN_FOR = "0.33"
LOAD_FORMAT = "fst"

# model_loader_extra_config keys taken by fst, with their checks.
_INT_OPTIONS = ("threads", "staging_bytes", "chunk_bytes", "readahead_bytes")
_CHOICES = {"io": ("auto", "pread", "uring"), "gds": ("auto", "on", "off")}


class VllmPluginError(RuntimeError):
    """vLLM is missing, or its loader API is not the one this plugin knows."""


def _vllm_version() -> str:
    try:
        import vllm
        return getattr(vllm, "__version__", "unknown")
    except Exception:  # pragma: no cover - reported by the caller
        return "unknown"


def _import_vllm():
    """vLLM's loader classes, or an error naming the version and what is
    missing."""
    try:
        from vllm.model_executor.model_loader import register_model_loader
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        from vllm.model_executor.model_loader import weight_utils
    except ImportError as e:
        raise VllmPluginError(
            f"fst's vLLM plugin needs vllm (written for vLLM {WRITTEN_FOR}): {e}") from e
    missing = [n for n in ("_prepare_weights", "Source", "get_all_weights")
               if not hasattr(DefaultModelLoader, n)]
    missing += [f"weight_utils.{n}" for n in ("enable_tqdm",)
                if not hasattr(weight_utils, n)]
    if missing:
        raise VllmPluginError(
            f"vLLM {_vllm_version()}: its model loader API differs from vLLM {WRITTEN_FOR}'s, "
            f"which fst's plugin was written for (missing: {', '.join(missing)})")
    return register_model_loader, DefaultModelLoader, weight_utils


def parse_options(extra: dict) -> Tuple[dict, dict]:
    """Split model_loader_extra_config into (fst options, the rest for
    vLLM), checking fst's: a bad value fails before anything is read."""
    from fst._args import _MAX_THREADS
    if not isinstance(extra, dict):  # None too, as vLLM's own loader refuses it
        raise ValueError(f"model_loader_extra_config={extra!r}: expected a dict of options")
    mine, rest = {}, {}
    for k, v in extra.items():
        if k in _INT_OPTIONS:
            limit = _MAX_THREADS if k == "threads" else 2 ** 64 - 1
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= limit:
                raise ValueError(f"model_loader_extra_config[{k!r}]={v!r}: expected an integer "
                                 f"0..{limit} (0: fst's default)")
            mine[k] = v
        elif k in _CHOICES:
            if v not in _CHOICES[k]:
                raise ValueError(f"model_loader_extra_config[{k!r}]={v!r}: expected one of "
                                 f"{list(_CHOICES[k])}")
            mine[k] = v
        else:
            rest[k] = v
    return mine, rest


def _log():
    import logging
    return logging.getLogger("fst")


def _natural_key(path: str) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", os.path.basename(path))]


def _device(load_device=None) -> str:
    """Where the weights go: LoadConfig.device where it is set (vLLM makes
    the model there), else this worker's GPU, else the CPU."""
    import torch
    if load_device is not None:
        d = torch.device(load_device)
        if d.type == "cuda":
            return f"cuda:{torch.cuda.current_device() if d.index is None else d.index}"
        return d.type if d.type == "cpu" else str(d)
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _world():
    """(rank, size, group for CPU tensors, group for device tensors): vLLM's
    world group when it exists (with pipeline stages, the stage's tensor-
    parallel group), else torch.distributed's default group, else a single
    process."""
    import torch.distributed as dist
    try:
        from vllm.distributed import get_world_group
        from vllm.distributed import parallel_state
        g = get_world_group()
        # A draft model (speculative decoding) is built and loaded on the
        # last pipeline stage only: a collective over the world would wait
        # for ranks that never come. The ranks that always load together
        # are those of one stage.
        if (parallel_state.model_parallel_is_initialized()
                and parallel_state.get_pp_group().world_size > 1):
            g = parallel_state.get_tp_group()
        return g.rank_in_group, g.world_size, g.cpu_group, g.device_group
    except (ImportError, AssertionError):
        pass
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), None, None
    return 0, 1, None, None


def fst_weights_iterator(files: Sequence[str], use_tqdm_on_load: bool,
                         local_expert_ids: Optional[Set[int]] = None,
                         options: Optional[dict] = None, load_device=None,
                         ) -> Iterator[Tuple[str, "object"]]:
    """(name, torch tensor) for every tensor of files, in natural shard
    order, on this worker's device; with several ranks, each file is read
    by one rank and broadcast."""
    import fst
    from vllm.model_executor.model_loader import weight_utils
    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

    files = sorted(files, key=_natural_key)
    options = dict(options or {})
    rank, world, cpu_group, device_group = _world()
    cks: List[_Header] = []
    error = None
    try:
        cks = [_Header(f) for f in files]
    except Exception as e:  # a file this rank cannot open (its node's copy)
        error = e
    if world > 1:
        _agree(error, world, cpu_group, "open the checkpoint")
    elif error is not None:
        raise error
    def names_for(ck, ids_of_ranks):
        """The names of ck that any of these ranks wants (None: all), each
        rank by its local expert ids (None: every expert)."""
        if any(ids is None for ids in ids_of_ranks):
            return None
        return [n for n in ck.keys()
                if any(not should_skip_weight(n, ids) for ids in ids_of_ranks)]

    wanted = [names_for(ck, [local_expert_ids]) for ck in cks]
    device = _device(load_device)
    total = sum(sum(ck.info(n)[2] for n in (w if w is not None else ck.keys()))
                for ck, w in zip(cks, wanted))
    bar = None
    if weight_utils.enable_tqdm(use_tqdm_on_load):
        from tqdm.auto import tqdm
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                   desc="Loading safetensors with fst", mininterval=1.0)
    try:
        if world == 1:
            for ck, names in zip(cks, wanted):
                for name, t in fst.iter_tensors(ck.path, device=device, names=names,
                                                **options):
                    if bar is not None:
                        bar.update(t.numel() * t.element_size())
                    yield name, t
            return
        group = device_group if device.startswith("cuda") else cpu_group
        # with expert parallelism each rank wants other experts: a file's
        # owner reads and broadcasts what any rank wants, and each rank
        # keeps its own (the owner's list once stood for every rank's); every
        # rank takes part in the gather, whatever its own ids
        everyone = _gather(local_expert_ids, world, cpu_group)
        carried = [names_for(ck, everyone) for ck in cks]
        for name, t in _broadcast_files(cks, carried, wanted, rank, world, device, group,
                                        cpu_group, options):
            if bar is not None:
                bar.update(t.numel() * t.element_size())
            yield name, t
    finally:
        if bar is not None:
            bar.close()


class _Header:
    """What the iterator needs of one file before reading it: its path,
    names and (dtype, shape, bytes) of each, in header order. The file is
    closed again at once: a checkpoint of a thousand shards would otherwise
    hold a thousand descriptors (vLLM's own iterators open one file at a
    time; offline, the limit is often 1024)."""

    def __init__(self, path: str):
        import errno
        import fst
        if os.path.isdir(path):  # fst opens a folder as a checkpoint; vLLM's list has files
            raise IsADirectoryError(errno.EISDIR, "a folder, not a safetensors file", path)
        ck = fst.Checkpoint(path)
        self.path = ck.path
        self._keys = ck.keys()
        self._info = {n: ck.info(n) for n in self._keys}
        # its files close with it, here (the header is all that is kept)

    def keys(self) -> List[str]:
        return list(self._keys)

    def info(self, name: str):
        return self._info[name]


def _gather(obj, world: int, cpu_group):
    """obj of every rank, in rank order (over the CPU group: plain objects)."""
    import torch.distributed as dist
    out = [None] * world
    dist.all_gather_object(out, obj, group=cpu_group)
    return out


def _agree(error: Optional[BaseException], world: int, cpu_group, what: str) -> None:
    """Raise on every rank if a step failed on any: the failing rank's own
    error there, an error naming that rank elsewhere, instead of the others
    waiting in the next collective for a rank that has left."""
    from fst._errors import _raise_agreed, _rank_status
    _raise_agreed(error, _gather(_rank_status(error), world, cpu_group), f"could not {what}")


def _broadcast_files(cks, carried, wanted, rank: int, world: int, device: str, group,
                     cpu_group, options: dict):
    """Files in rounds of `world`: in a round, rank k reads file
    round * world + k (all ranks read at once), the ranks agree that every
    read succeeded, then each file's tensors are broadcast from its reader,
    in header order, which every rank knows without reading any data.
    carried[i]: the names of file i that any rank wants (None: all), which
    its reader reads and broadcasts; wanted[i]: those this rank yields."""
    import torch
    import torch.distributed as dist
    import fst

    for start in range(0, len(cks), world):
        batch = list(range(start, min(start + world, len(cks))))
        mine: Dict[str, object] = {}
        error = None
        if rank < len(batch):
            i = batch[rank]
            try:
                mine = fst.load(cks[i].path, device, names=carried[i], **options)
            except Exception as e:  # every rank hears of it before any broadcast
                error = e
        _agree(error, world, cpu_group, "read its file")
        for owner, i in enumerate(batch):
            ck = cks[i]
            names = carried[i] if carried[i] is not None else ck.keys()
            keep = None if wanted[i] is None else set(wanted[i])
            src = dist.get_global_rank(group, owner) if group is not None else owner
            for name in names:
                dtype, shape, nbytes = ck.info(name)
                if owner == rank:
                    t = mine.pop(name)
                    flat = t.reshape(-1).view(torch.uint8) if nbytes else None
                else:
                    t = None
                    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
                if nbytes:
                    # bytes, not typed values: every dtype (float8, float4)
                    # travels, whatever the backend supports
                    dist.broadcast(flat, src=src, group=group)
                if keep is not None and name not in keep:
                    continue  # another rank's expert
                if t is None:
                    t = _typed(flat, dtype, shape, device)
                yield name, t
        mine.clear()


def _typed(flat, dtype: str, shape, device: str):
    """A received byte buffer as the tensor fst would have handed out."""
    import torch
    import fst
    if flat is None or not flat.numel():
        # an empty tensor still has its dtype and shape
        view = fst._torch_dtypes().get(dtype) or _TORCH_PLAIN.get(dtype, torch.uint8)
        return torch.empty(tuple(shape), dtype=view, device=device)
    view = fst._torch_dtypes().get(dtype) or _TORCH_PLAIN.get(dtype)
    if view is None and dtype.startswith("F8_"):
        # a float8 this torch lacks: bytes of the file's shape, as the
        # reader's rank has it (fst's torch form)
        return flat.reshape(tuple(shape))
    if view is None:
        # F4 and F6 as the reader's rank has them (docs/python.md): the last
        # dimension in bytes where a row is whole bytes, else flat; then
        # typed as fst types them
        bits = 4 if dtype == "F4" else 6
        if shape and shape[-1] * bits % 8 == 0:
            flat = flat.reshape(tuple(shape[:-1]) + (shape[-1] * bits // 8,))
        from fst._tensors import _f4_view
        return _f4_view(torch, flat, dtype, shape)
    return flat.view(view).reshape(tuple(shape))


_TORCH_PLAIN = {}


def _fill_plain():
    import torch
    _TORCH_PLAIN.update({
        "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
        "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32,
        "I64": torch.int64, "F64": torch.float64, "C64": torch.complex64,
    })


def make_loader_class():
    """The loader class for load format "fst", built on this process's
    vLLM."""
    _, DefaultModelLoader, _ = _import_vllm()
    _fill_plain()

    class FstModelLoader(DefaultModelLoader):
        """vLLM's DefaultModelLoader with fst's weights iterator."""

        def __init__(self, load_config):
            self.fst_options, rest = parse_options(load_config.model_loader_extra_config)
            # DefaultModelLoader refuses keys it does not know: it sees only
            # the others, and the config is left as the user gave it.
            saved = load_config.model_loader_extra_config
            load_config.model_loader_extra_config = rest
            try:
                super().__init__(load_config)
            finally:
                load_config.model_loader_extra_config = saved

        def _prepare_weights(self, *args, **kwargs):
            # vLLM finds and filters safetensors files by load format: fst
            # reads exactly what "safetensors" would.
            saved = self.load_config.load_format
            self.load_config.load_format = "safetensors"
            try:
                return super()._prepare_weights(*args, **kwargs)
            finally:
                self.load_config.load_format = saved

        def _get_weights_iterator(self, source):
            from vllm.model_executor.model_loader import weight_utils
            if self.load_config.safetensors_load_strategy == "torchao":
                # vLLM rebuilds torchao's tensor subclasses from the files'
                # metadata in its own iterator (load_weights asks for it on
                # a torchao-serialized checkpoint): fst's plain tensors
                # would reach the model as flattened pieces
                _log().info("fst: safetensors_load_strategy 'torchao': vLLM's own iterator "
                            "reads %s", source.model_or_path)
                return super()._get_weights_iterator(source)
            hf_folder, files, use_safetensors, index_file = self._prepare_weights(
                source.model_or_path, source.subfolder, source.revision,
                source.fall_back_to_pt, source.allow_patterns_overrides)
            # "safetensors" discovery says use_safetensors whatever a
            # model's own patterns found (BGE-M3 asks for *.pt beside)
            other = [f for f in files if not f.endswith(".safetensors")]
            if not use_safetensors or other:
                raise VllmPluginError(
                    f"load format 'fst' reads safetensors files; {source.model_or_path}: "
                    f"{other[0] if other else 'none found'} is not one (load format "
                    f"'auto' reads it)")
            prefixes = getattr(self, "_encoder_only_lm_prefixes", None)
            if prefixes is not None and files:
                files = weight_utils.filter_mm_encoder_only_safetensors_files(
                    files, hf_folder, index_file, prefixes,
                    weights_mapper=getattr(self, "_encoder_only_weights_mapper", None))
                if not files:  # vLLM's own words
                    raise RuntimeError(
                        "mm-encoder-only shard filter removed all weight files for "
                        f"`{source.model_or_path}`; check language_model prefixes "
                        f"{prefixes}")
            if source.is_unused_weight is not None:
                files = weight_utils.filter_safetensors_files_by_weight_name(
                    files, source.is_unused_weight)
            it = fst_weights_iterator(files, self.load_config.use_tqdm_on_load,
                                      local_expert_ids=self.local_expert_ids,
                                      options=self.fst_options,
                                      load_device=self.load_config.device)
            if self.counter_before_loading_weights == 0.0:
                import time
                self.counter_before_loading_weights = time.perf_counter()
            return ((source.prefix + name, t) for name, t in it)

    FstModelLoader.__module__ = __name__
    FstModelLoader.__qualname__ = "FstModelLoader"
    return FstModelLoader


_registered = None


def register():
    """The vllm.general_plugins entry point: register load format "fst".
    vLLM may call it several times in one process; it registers once."""
    global _registered
    if _registered is not None:
        return _registered
    register_model_loader, _, _ = _import_vllm()
    major_minor = ".".join(_vllm_version().split(".")[:2])
    if major_minor != WRITTEN_FOR:
        _log().warning(
            "fst's vLLM plugin was written for vLLM %s; this is vLLM %s", WRITTEN_FOR,
            _vllm_version())
    _registered = register_model_loader(LOAD_FORMAT)(make_loader_class())
    return _registered
