"""Dataset specs bound to the router: the source of ``WebDataset(spec)``, and
webdataset's ``MultiShardSample``.

Part of the composition root (with :mod:`wds_cloud.dataset`): it loads the spec with the
settings' environment (``${VAR}``), resolves the seed (argument > ``WDS_SEED`` > the spec's
``seed`` > random, logged), lists each source's globs once, where its shards will be read from
(after rewriting, through AIStore), and gives each source an opener with its
``storage_options`` (``WebDataset(storage_options=)`` as defaults, the spec's, then the
source's, per scheme and key). The mixing itself is layer 2: :mod:`wds_cloud.spec.build`.
"""

from __future__ import annotations

import functools
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .handlers import Handler, reraise_exception
from .pipeline.epochs import EpochCounter
from .pipeline.shards import WorkerInfo
from .pytorch import DataPipeline, worker_info
from .reading import ShardOpener, read_shards
from .router import expand_glob
from .settings import Settings
from .spec import DatasetSpec, load_spec
from .spec.build import SpecEpochShards, SpecMix, SpecShardMix
from .tar.shardloop import ShardCursor
from .urls import merge_scheme_options

__all__ = ["MultiShardSample", "spec_source"]

log = logging.getLogger(__name__)

Sample = dict[str, Any]
SpecLike = str | os.PathLike[str] | Mapping[str, Any] | DatasetSpec



def _seed(seed: object, settings: Settings, spec: DatasetSpec) -> int:
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            from .errors import ConfigError

            raise ConfigError(f"WebDataset(seed=...) must be an integer, got {seed!r}")
        return seed
    if settings.seed is not None:
        return settings.seed
    if spec.seed is not None:
        return spec.seed
    chosen = random.SystemRandom().randrange(2**63)
    log.info("%s: no seed given (argument, WDS_SEED or the spec's seed): using %d; pass "
             "seed=%d to repeat this run", spec.origin, chosen, chosen)
    return chosen


def _openers(spec: DatasetSpec, settings: Settings, storage_options: Mapping[str, Any],
             url_to_name: Callable[[str], str] | None) -> tuple[ShardOpener, ...]:
    made: list[ShardOpener] = []
    for source in spec.sources:
        options = merge_scheme_options(storage_options, spec.storage_options,
                                       source.storage_options)
        same = next((o for o in made if o.storage_options == options), None)
        made.append(same or ShardOpener(settings, options, url_to_name))
    return tuple(made)


@dataclass(frozen=True)
class _SpecReader:
    """Reads the shard items of source ``i`` (``-1``: of any source) into samples;
    picklable, for DataLoader workers."""

    openers: tuple[ShardOpener, ...]
    owners: Mapping[str, int]
    handler: Handler
    select_files: Any
    rename_files: Any

    def __call__(self, items: Iterable[dict[str, Any]], i: int,
                 cursor: ShardCursor | None = None) -> Iterator[Sample]:
        share = len(self.openers)
        if i >= 0:
            return self.openers[i].samples(items, self.handler, self.select_files,
                                           self.rename_files, share=share, cursor=cursor)
        return read_shards(self._open, self.openers[0].settings, items, self.handler,
                           self.select_files, self.rename_files, cursor=cursor)

    def _open(self, url: str, **kw: Any) -> Any:
        return self.openers[self.owners.get(url, 0)](url, **kw)


def _listed(spec: DatasetSpec, openers: tuple[ShardOpener, ...]) -> list[list[str]]:
    return [expand_glob(list(source.urls), router=opener.router)
            for source, opener in zip(spec.sources, openers, strict=True)]


def spec_source(
    spec: SpecLike, *, settings: Settings, seed: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    url_to_name: Callable[[str], str] | None = None, handler: Handler = reraise_exception,
    select_files: Any = None, rename_files: Any = None,
    worker_info: Callable[[], WorkerInfo] | None = None, allow_pipe: bool = False,
) -> tuple[DatasetSpec, int, SpecMix | SpecEpochShards]:
    """``(spec, seed, source)``: the samples of ``spec`` as a pipeline's first stage.

    A weighted spec gives a :class:`~wds_cloud.spec.build.SpecMix`, a counted one
    (``resample``/``choose``) a :class:`~wds_cloud.spec.build.SpecEpochShards`.
    """
    loaded = load_spec(spec, environ=settings.environ, allow_pipe=allow_pipe)
    chosen = _seed(seed, settings, loaded)
    openers = _openers(loaded, settings, storage_options or {}, url_to_name)
    urls = _listed(loaded, openers)
    owners = {url: i for i in reversed(range(len(urls))) for url in urls[i]}
    read = _SpecReader(openers, owners, handler, select_files, rename_files)
    epochs = EpochCounter()
    if loaded.counted:
        return loaded, chosen, SpecEpochShards(loaded, urls, seed=chosen, read=read,
                                               worker_info=worker_info, epochs=epochs)
    return loaded, chosen, SpecMix(loaded, urls, seed=chosen, read=read,
                                   worker_info=worker_info, epochs=epochs)


class MultiShardSample(DataPipeline):
    """webdataset's ``MultiShardSample(path_or_dict)``: a spec as a stream of shards
    ``{"url": ..., "__source__": name}``, the same on every rank and worker, to follow with
    splitters and ``tarfile_to_samples()``. See :class:`~wds_cloud.spec.build.SpecShardMix`
    (a weighted spec mixes shards, endlessly; ``WebDataset(spec)`` mixes samples).

    webdataset gated this class as obsolete and never read its documented YAML keys; here it
    reads the same specs as ``WebDataset``. ``seed``: argument > ``WDS_SEED`` > the spec's >
    random.
    """

    def __init__(self, fname: SpecLike, *, seed: int | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 allow_pipe: bool = False) -> None:
        super().__init__()
        settings = Settings.from_env()  # a composition root of its own
        self.spec = load_spec(fname, environ=settings.environ, allow_pipe=allow_pipe)
        self.seed = _seed(seed, settings, self.spec)
        openers = _openers(self.spec, settings, storage_options or {}, None)
        self.append(SpecShardMix(self.spec, _listed(self.spec, openers), seed=self.seed,
                                 worker_info=functools.partial(worker_info, settings)))
