"""Checkpoint, load and iter_tensors: opening checkpoints and loading them,
whole into one allocation or streamed tensor by tensor."""
from __future__ import annotations

import os
import sys
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple, Union

from . import _fst
from ._args import _OPEN_OPTIONS, _check_options, _framework, _load_kwargs, _unified  # noqa: F401
from ._errors import UsageError
from ._tensors import _check_dtypes, _convert, _need_torch


def trim() -> None:
    """Free the pinned staging memory kept between loads."""
    _fst.trim()


def _torch_allocator(device: str):
    """Device memory from torch's caching allocator, so torch.cuda memory
    accounting sees it."""
    import torch

    # torch's blocks start at 512-byte boundaries: a larger align takes a
    # block that much longer and hands out its first aligned address; the
    # block's own address goes back to torch
    blocks = {}

    def alloc(size, align, device_type, device_id):
        extra = align if align > 512 else 0
        p = torch.cuda.caching_allocator_alloc(size + extra, device=device_id)
        q = (p + align - 1) // align * align if extra else p
        blocks[q] = p
        return q

    def free(ptr, size, device_type, device_id):
        torch.cuda.caching_allocator_delete(blocks.pop(ptr))

    return (alloc, free)


def _prepare(where: str, cks: Sequence["Checkpoint"], framework: str, kw: dict) -> dict:
    """What every load does after opening its checkpoints and before reading
    any tensor data: the names exist, the framework can take the tensors.
    Returns kw for the low-level load."""
    names = kw.get("names")
    if names is not None:
        # a typo should fail here, not later as a missing key
        unknown = [n for n in names if all(ck._ck.info(n) is None for ck in cks)]
        if unknown:
            raise UsageError(f"{where}: no tensor named {unknown[0]!r}"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
                             -1)
    _check_dtypes(framework, cks, names)
    kw = dict(kw)
    # unified memory maps host memory itself (docs/platforms.md): no torch
    # allocator where the load will take that path
    if (kw.pop("torch_allocator") and framework == "pt" and kw["device"].startswith("cuda")
            and not _unified(kw)):
        kw["allocator"] = _torch_allocator(kw["device"])
    return kw


class Checkpoint:
    """An opened checkpoint (file, directory or index, or a URL of one:
    s3://BUCKET/KEY, s3://BUCKET/PREFIX/, http(s)://...): names, dtypes,
    shapes and metadata, validated, without reading any tensor data. For
    URLs: endpoint (an S3 endpoint URL), region, profile (of ~/.aws) and
    unsigned (public buckets); left out, the AWS environment decides
    (docs/remote.md)."""

    def __init__(self, path: Union[str, os.PathLike], *, endpoint: Optional[str] = None,
                 region: Optional[str] = None, profile: Optional[str] = None,
                 unsigned: bool = False):
        self._ck = _fst.Checkpoint(os.fspath(path), endpoint=endpoint, region=region,
                                   profile=profile, unsigned=bool(unsigned))
        self.path = os.fspath(path)

    def keys(self):
        return self._ck.keys()

    def files(self):
        return self._ck.files()

    def metadata(self, file_index: int = 0) -> Optional[Dict[str, str]]:
        return self._ck.metadata(file_index)

    def info(self, name: str):
        """(dtype, shape, nbytes) of a tensor."""
        i = self._ck.info(name)
        if i is None:
            raise KeyError(name)
        return i[0], i[1], i[2]


def _checkpoint_type() -> type:
    """fst.Checkpoint as the package has it: a Checkpoint replaced there
    (tests arm faults that way) serves every load, as it does in
    fst.compat."""
    return sys.modules[__package__].Checkpoint


def _open(path, remote: Optional[dict] = None) -> Checkpoint:
    cls = _checkpoint_type()
    if isinstance(path, cls):
        return path
    # only what was given: a Checkpoint replaced by one that takes a path
    # alone (tests do) still serves every load of a local path
    given = {k: v for k, v in (remote or {}).items() if v}
    return cls(path, **given) if given else cls(path)


def _remote(options: dict) -> dict:
    """The open options for URLs, taken out of a call's keyword arguments."""
    return {k: options.pop(k) for k in _OPEN_OPTIONS if k in options}


def load(path, device="cpu", *, framework="pt", io="auto", threads=0, staging_bytes=0,
         chunk_bytes=0, gds="auto", align=0, names: Optional[Iterable[str]] = None,
         torch_allocator=True, unified="auto", readahead_bytes=0, stream_bytes=0, endpoint=None,
         region=None, profile=None, unsigned=False) -> Dict[str, object]:
    """Load every tensor (or those in `names`) of a checkpoint: a dict of
    name -> torch tensor or numpy array, zero-copy over one allocation.
    endpoint, region, profile and unsigned are for URLs (Checkpoint)."""
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, io, threads, staging_bytes, chunk_bytes, gds, align, names,
                      torch_allocator, unified=unified, readahead_bytes=readahead_bytes,
                      stream_bytes=stream_bytes)
    if fw == "pt":
        _need_torch()  # before the file: without torch nothing of it can be used
    ck = _open(path, dict(endpoint=endpoint, region=region, profile=profile, unsigned=unsigned))
    return _load_prepared(ck, fw, _prepare(ck._ck.path(), [ck], fw, kw))


def _load_prepared(ck: Checkpoint, framework: str, kw: dict) -> Dict[str, object]:
    buf = _fst.load(ck._ck, **kw)
    return {name: _convert(buf.tensor(name), framework) for name in buf.names()}


def iter_tensors(paths: Union[str, os.PathLike, Sequence], device="cpu", framework="pt",
                 progress=False, **options) -> Iterator[Tuple[str, object]]:
    """Yield (name, tensor) as tensors become ready, checkpoint after
    checkpoint; with progress=True and tqdm installed, show a bar. Every
    path is opened and every check made when the iteration starts, before
    the first tensor is read."""
    remote = _remote(options)
    _check_options("iter_tensors", options)
    fw = _framework(framework)
    kw = _load_kwargs(device, fw, **options)
    if fw == "pt":
        _need_torch()
    if isinstance(paths, (str, bytes, os.PathLike, _checkpoint_type())):
        paths = [paths]
    cks = [_open(p, remote) for p in paths]
    kw = _prepare(", ".join(ck._ck.path() for ck in cks) or "iter_tensors", cks, fw, kw)
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            wanted = kw.get("names")
            wanted = None if wanted is None else set(wanted)
            total = 0
            for ck in cks:
                total += sum(ck.info(n)[2] for n in ck.keys() if wanted is None or n in wanted)
            bar = tqdm(total=total, unit="B", unit_scale=True, desc="fst")
        except ImportError:
            bar = None
    try:
        for ck in cks:
            loader = _fst.start(ck._ck, **kw)
            try:
                while True:
                    t = loader.next()
                    if t is None:
                        break
                    if bar is not None:
                        bar.update(t.nbytes)
                    yield t.name, _convert(t, fw)
                loader.finish()
            finally:
                loader = None
    finally:
        if bar is not None:
            bar.close()
