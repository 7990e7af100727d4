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

import dataclasses
import functools
import logging
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .errors import ConfigError
from .handlers import Handler, reraise_exception
from .pipeline.epochs import EpochCounter
from .pipeline.shards import WorkerInfo
from .pytorch import DataPipeline, worker_info
from .reading import ShardOpener, read_shards
from .settings import Settings
from .spec import DatasetSpec, load_spec
from .spec.build import SpecEpochShards, SpecMix, SpecShardMix
from .spec.quota import SpecSampleEpochs
from .specshards import Listed, list_source
from .tar.shardloop import ShardCursor
from .urls import merge_scheme_options, substitute_vars

__all__ = ["MSSource", "MultiShardSample", "default_rng", "envlookup", "envsubst", "expand",
           "spec_source"]

log = logging.getLogger(__name__)

Sample = dict[str, Any]
SpecLike = str | os.PathLike[str] | Mapping[str, Any] | DatasetSpec

#: webdataset's ``shardlists.default_rng``, a module-level ``random.Random()`` that
#: webdataset's ``MultiShardSample`` drew from; nothing in wds_cloud draws from it
default_rng = random.Random()


@dataclass
class MSSource:
    """webdataset's description of one source of a ``MultiShardSample`` spec: its ``name``,
    ``urls``, shards drawn per epoch (``perepoch``, -1: all) and whether they are drawn with
    replacement (``resample``)."""

    name: str = ""
    perepoch: int = -1
    resample: bool = False
    urls: list[str] = field(default_factory=list)


def envlookup(m: re.Match[str]) -> str:
    """The value of ``WDS_<m.group(1)>`` (read now); a variable that is not set raises
    :class:`~wds_cloud.errors.ConfigError`."""
    return envsubst(m.group(0))


def envsubst(s: str) -> str:
    """``s`` with each ``${NAME}`` replaced by the value of ``WDS_NAME`` (read now)."""
    return substitute_vars(s, Settings.from_env().url_vars)


_ENV_VAR = re.compile(r"\$(\w+|\{[^}]*\})")


def expand(s: str) -> str:
    """``s`` with ``~`` and ``$VAR``/``${VAR}`` expanded, as ``os.path.expanduser(os.path.
    expandvars(s))`` does (a variable that is not set stays as written); the variables are
    read now."""
    environ = Settings.from_env().environ

    def lookup(m: re.Match[str]) -> str:
        name = m.group(1).strip("{}")
        return environ.get(name, m.group(0))

    return os.path.expanduser(_ENV_VAR.sub(lookup, s))



def _seed(seed: object, settings: Settings, spec: DatasetSpec) -> int:
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
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


def spec_settings(spec: DatasetSpec, settings: Settings) -> Settings:
    """``settings`` with what the spec itself sets (Mosaic's ``download_retry``,
    ``download_timeout``, ``cache_limit``)."""
    return dataclasses.replace(settings, **spec.settings) if spec.settings else settings


def _openers(spec: DatasetSpec, settings: Settings, storage_options: Mapping[str, Any],
             url_to_name: Callable[[str], str] | None, zero_copy: bool = False,
             ) -> tuple[ShardOpener, ...]:
    settings = spec_settings(spec, settings)
    made: list[ShardOpener] = []
    for source in spec.sources:
        options = merge_scheme_options(storage_options, spec.storage_options,
                                       source.storage_options)
        mine = (dataclasses.replace(settings, cache_dir=os.path.abspath(source.cache_dir))
                if source.cache_dir else settings)
        same = next((o for o in made if o.storage_options == options and o.settings == mine),
                    None)
        made.append(same or ShardOpener(mine, options, url_to_name, zero_copy))
    return tuple(made)


@dataclass(frozen=True)
class _SpecReader:
    """Reads the shard items of source ``i`` (``-1``: of any source) into samples, leaving
    out the samples a prepared dataset excludes; picklable, for DataLoader workers."""

    openers: tuple[ShardOpener, ...]
    owners: Mapping[str, int]
    handler: Handler
    select_files: Any
    rename_files: Any
    excluded: frozenset[tuple[str, str]] = frozenset()
    #: the sources' names: the transfers of a source's shards count for it (``stats()``)
    names: tuple[str, ...] = ()

    def __call__(self, items: Iterable[dict[str, Any]], i: int,
                 cursor: ShardCursor | None = None) -> Iterator[Sample]:
        share = len(self.openers)
        if i >= 0:
            opener = self.openers[i]
            samples = read_shards(_Counted(opener, self.names[i]) if self.names else opener,
                                  opener.settings, items, self.handler, self.select_files,
                                  self.rename_files, share=share, cursor=cursor)
        else:
            samples = read_shards(self._open, self.openers[0].settings, items, self.handler,
                                  self.select_files, self.rename_files, cursor=cursor)
        return self._kept(samples) if self.excluded else samples

    def _kept(self, samples: Iterator[Sample]) -> Iterator[Sample]:
        try:
            for sample in samples:
                if (sample.get("__url__"), sample.get("__key__")) not in self.excluded:
                    yield sample
        finally:
            close = getattr(samples, "close", None)
            if close is not None:
                close()

    def _open(self, url: str, **kw: Any) -> Any:
        return self.openers[self.owners.get(url, 0)](url, **kw)


@dataclass(frozen=True)
class _Counted:
    """A source's opener whose opens (and the transfers they start, in whichever thread)
    count for the source (:func:`~wds_cloud.stores.iostats.source_stats`)."""

    opener: ShardOpener
    name: str

    def __call__(self, url: str, **kw: Any) -> Any:
        from .stores.iostats import count_source, reading_for

        count_source(self.name, shards=1)
        with reading_for(self.name):
            return self.opener(url, **kw)

    def costs_round_trip(self, url: str) -> bool:
        return self.opener.costs_round_trip(url)

    def pace(self) -> Any:
        return self.opener.pace()


def _listed(spec: DatasetSpec, openers: tuple[ShardOpener, ...]) -> list[Listed]:
    return [list_source(spec, source, opener.router)
            for source, opener in zip(spec.sources, openers, strict=True)]


def _counts(spec: DatasetSpec, listed: list[Listed], read: _SpecReader) -> list[list[int]]:
    """Samples per shard of every source (an epoch that counts samples needs them): from
    ``.nv-meta`` where the dataset says them (less its excluded samples), else by reading
    each shard once (logged)."""
    out = []
    for i, (source, found) in enumerate(zip(spec.sources, listed, strict=True)):
        if found.counts is not None:
            gone = {url for url, _ in found.excluded}
            out.append([n - sum(1 for u, _ in found.excluded if u == url) if url in gone else n
                        for url, n in zip(found.urls, found.counts, strict=True)])
            continue
        log.info("%s: %s (%r): counting the samples of %d shards (an Energon-prepared "
                 "dataset's .nv-meta says them without a read)", spec.origin, source.key,
                 source.name, len(found.urls))
        out.append([sum(1 for _ in read(iter([{"url": url}]), i)) for url in found.urls])
    return out


def spec_opener(settings: Settings, storage_options: Mapping[str, Any],
                url_to_name: Callable[[str], str] | None = None) -> Callable[[str], BinaryIO]:
    """Opens a spec file at a URL (``s3://bucket/specs/train.yaml``) and those it names: the
    dataset's router (rewriting, AIStore, its storage options), never the shard cache."""
    from .router import Router

    return Router(dataclasses.replace(settings, cache_dir=None), dict(storage_options),
                  url_to_name).open


def spec_source(
    spec: SpecLike, *, settings: Settings, seed: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    url_to_name: Callable[[str], str] | None = None, handler: Handler = reraise_exception,
    select_files: Any = None, rename_files: Any = None,
    worker_info: Callable[[], WorkerInfo] | None = None, allow_pipe: bool = False,
    split: str | None = None, zero_copy: bool = False,
) -> tuple[DatasetSpec, int, SpecMix | SpecEpochShards | SpecSampleEpochs]:
    """``(spec, seed, source)``: the samples of ``spec`` as a pipeline's first stage.

    A spec of mode ``"mix"`` gives a :class:`~wds_cloud.spec.build.SpecMix`, one of mode
    ``"shards"`` a :class:`~wds_cloud.spec.build.SpecEpochShards`, one of mode ``"samples"`` a
    :class:`~wds_cloud.spec.quota.SpecSampleEpochs`. ``split``: an Energon metadataset's split;
    ``zero_copy``: see :class:`~wds_cloud.reading.ShardOpener`.
    """
    loaded = load_spec(spec, environ=settings.environ, allow_pipe=allow_pipe, split=split,
                       open_stream=spec_opener(settings, storage_options or {}, url_to_name))
    chosen = _seed(seed, settings, loaded)
    openers = _openers(loaded, settings, storage_options or {}, url_to_name, zero_copy)
    listed = _listed(loaded, openers)
    urls = [found.urls for found in listed]
    for opener, found in zip(openers, listed, strict=True):  # for the workers forked from here
        opener.prepare(found.urls)
    owners = {url: i for i in reversed(range(len(urls))) for url in urls[i]}
    excluded = frozenset(x for found in listed for x in found.excluded)
    read = _SpecReader(openers, owners, handler, select_files, rename_files, excluded,
                       tuple(source.name for source in loaded.sources))
    epochs = EpochCounter()
    if loaded.mode == "samples":
        return loaded, chosen, SpecSampleEpochs(loaded, urls, _counts(loaded, listed, read),
                                                seed=chosen, read=read,
                                                worker_info=worker_info, epochs=epochs)
    if loaded.counted:
        return loaded, chosen, SpecEpochShards(loaded, urls, seed=chosen, read=read,
                                               worker_info=worker_info, epochs=epochs)
    from .stores.iostats import count_samples

    mix = SpecMix(loaded, urls, seed=chosen, read=read, worker_info=worker_info, epochs=epochs)
    mix.count = count_samples  # the samples of each source, for stats()
    return loaded, chosen, mix


class MultiShardSample(DataPipeline):
    """webdataset's ``MultiShardSample(path_or_dict)``: a spec as a stream of shards
    ``{"url": ..., "__source__": name}``, the same on every rank and worker, to follow with
    splitters and ``tarfile_to_samples()``. See :class:`~wds_cloud.spec.build.SpecShardMix`
    (a weighted spec mixes shards, endlessly; ``WebDataset(spec)`` mixes samples).

    webdataset gated this class as obsolete and never read its documented YAML keys; here it
    reads the same specs as ``WebDataset``. A spec without weights reads every shard once per
    epoch (or ``resample``/``choose`` shards of a source), in webdataset 1.0.2's order:
    ``set_epoch(n)`` gives what webdataset's ``set_epoch(n)`` gives (``seed + n`` with a
    seed). ``seed``: argument > ``WDS_SEED`` > the spec's > 0.
    """

    def __init__(self, fname: SpecLike, *, seed: int | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 allow_pipe: bool = False, split: str | None = None) -> None:
        super().__init__()
        settings = Settings.from_env()  # a composition root of its own
        self.spec = load_spec(fname, environ=settings.environ, allow_pipe=allow_pipe,
                              split=split, open_stream=spec_opener(settings,
                                                                   storage_options or {}))
        if self.spec.mode == "samples":
            raise ConfigError(f"{self.spec.origin}: MultiShardSample yields shards, but this "
                              f"{self.spec.dialect} spec counts samples per epoch; read it with "
                              "WebDataset(spec)")
        self.seed = seed if seed is not None else (
            settings.seed if settings.seed is not None else self.spec.seed or 0)
        openers = _openers(self.spec, settings, storage_options or {}, None)
        urls = [found.urls for found in _listed(self.spec, openers)]
        self.append(SpecShardMix(self.spec, urls, seed=self.seed,
                                 worker_info=functools.partial(worker_info, settings)))
