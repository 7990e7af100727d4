"""webdataset's ``WebDataset`` and ``FluidWrapper``, and the tar functions bound to gopen.

This is the composition root: it binds the layer-2 functions (which take an ``open_stream``
argument) to :func:`wds_cloud.router.gopen`, and the shard splitters to
:func:`wds_cloud.pytorch.worker_info`. It imports torch only when a dataset is constructed (see
:mod:`wds_cloud.pytorch`), and only if torch is installed.

``WebDataset`` takes webdataset 1.0.2's arguments. Where webdataset silently ignored one, we
use it or refuse it:

* ``repeat=True`` repeats the dataset forever (webdataset 1.0.2 ignored it);
* ``verbose=True`` logs each shard as it is opened (logger ``wds_cloud.compat``, level INFO);
* ``cache_dir`` and ``cache_size`` (bytes, or ``"50GB"``) read shards through the on-disk
  shard cache (:mod:`wds_cloud.cache`), overriding ``WDS_CACHE``/``WDS_CACHE_SIZE``;
  ``cache_size=-1`` (the default) takes ``WDS_CACHE_SIZE`` or no bound, ``0`` turns the cache
  off; ``url_to_name`` gives the readable part of cache file names, to which a hash of the URL
  is always added (webdataset's basenames collided across buckets); keyword-only
  ``cache_revalidate`` and ``cache_local`` override ``WDS_CACHE_REVALIDATE``/``WDS_CACHE_LOCAL``;
* ``mode`` other than ``None``/``"resampled"`` (webdataset's directory-watching modes) and
  directory URLs ending in ``/``, YAML/JSON specs and spec dicts raise ``ConfigError``;
* ``shardshuffle=n`` shuffles shards with a seed derived per rank, worker and epoch, so each
  epoch has a new order (webdataset repeated one order); ``detshuffle=True`` keeps webdataset's
  ``detshuffle`` stage (``Random(seed + epoch)``), whose epoch ``set_epoch`` also sets.
* ``storage_options`` (keyword-only, per scheme: ``{"s3": {...}, "gs": {...}}``) go to the
  fsspec filesystems; shard patterns with ``*``/``?``/``[...]`` (``s3://b/train/shard-*.tar``)
  are listed once, when the dataset is built;
* ``seed=None`` takes ``WDS_SEED`` (an integer) if set, else a random seed, as webdataset;
  with ``resampled=True`` a chosen seed (argument or ``WDS_SEED``) makes the resampled shard
  streams reproducible (``ResampledShards(seed=seed, deterministic=True)``; webdataset ignored
  the seed there), while no seed keeps webdataset's non-deterministic resampling.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO
from urllib.parse import urlparse

from . import filters, pipeline, shards, tario
from .errors import ConfigError
from .fluid import FluidInterface
from .handlers import Handler, reraise_exception
from .pipeline import pipelinefilter
from .pytorch import (
    DataPipeline,
    ResampledShards,
    single_node_only,
    split_by_worker,
    worker_info,
)
from .readahead import ReadAhead
from .router import expand_glob, gopen, with_cache
from .settings import Settings

# re-exported: webdataset code reaches them as ``wds.tariterators.*``
from .tario import base_plus_ext, group_by_keys, tar_file_expander, tar_file_iterator, valid_sample
from .urls import redact

__all__ = [
    "FluidInterface",
    "FluidWrapper",
    "WebDataset",
    "base_plus_ext",
    "cbors_to_samples",
    "check_empty",
    "group_by_keys",
    "msgpacks_to_samples",
    "tar_file_expander",
    "tar_file_iterator",
    "tarfile_samples",
    "tarfile_to_samples",
    "url_opener",
    "valid_sample",
]

log = logging.getLogger(__name__)

Sample = dict[str, Any]


def _open(url: str, **kw: Any) -> BinaryIO:
    return gopen(url, "rb", **kw)


@dataclass(frozen=True)
class ShardOpener:
    """Opens shards for reading with one :class:`Settings` and per-scheme ``storage_options``
    (a picklable value, taken to DataLoader workers). :meth:`tarfile_samples` reads a stream
    of sources with the next ``settings.readahead`` shards opened in the background."""

    settings: Settings = field(default_factory=Settings)
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    url_to_name: Callable[[str], str] | None = None

    def __call__(self, url: str, **kw: Any) -> BinaryIO:
        return gopen(url, "rb", settings=self.settings, storage_options=self.storage_options,
                     url_to_name=self.url_to_name, **kw)

    def tarfile_samples(
        self, src: Iterable[Sample], handler: Handler, select_files: Any, rename_files: Any,
    ) -> Iterator[Sample]:
        depth = self.settings.readahead
        with ReadAhead(self, depth=depth, max_bytes=self.settings.readahead_bytes) as ahead:
            yield from tario.tarfile_samples(ahead.sources(src), handler, select_files,
                                             rename_files, open_stream=ahead.open)


def tarfile_samples(
    src: Iterable[Sample], handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str | None] | None = None, *,
    storage_options: Mapping[str, Any] | None = None, settings: Settings | None = None,
    url_to_name: Callable[[str], str] | None = None,
) -> Iterator[Sample]:
    """Samples from the tar shards named by ``src`` (dicts with ``url``), opened with gopen
    (through the shard cache when the settings name one); the next shards are opened ahead in
    the background (``WDS_READAHEAD``)."""
    opener = ShardOpener(settings or Settings.from_env(), storage_options or {}, url_to_name)
    return opener.tarfile_samples(src, handler, select_files, rename_files)


tarfile_to_samples = pipelinefilter(tarfile_samples)
"""Stage ``tarfile_to_samples(handler=..., select_files=None, rename_files=None,
storage_options=None)``."""


def url_opener(
    data: Iterable[Sample], handler: Handler = reraise_exception, **kw: Any
) -> Iterator[Sample]:
    """Add ``stream`` (and ``local_path``) to dicts with ``url``; ``kw`` goes to gopen."""
    return tario.url_opener(data, handler, open_stream=_open, **kw)


def cbors_to_samples(src: Iterable[Sample], handler: Handler = reraise_exception) -> Any:
    """Samples from files of CBOR records named by ``src`` (dicts with ``url``), via gopen."""
    from . import records

    return records.cbors_to_samples(src, handler, open_stream=_open)


def msgpacks_to_samples(src: Iterable[Sample], handler: Handler = reraise_exception) -> Any:
    """Samples from files of MsgPack records named by ``src`` (dicts with ``url``), via gopen."""
    from . import records

    return records.msgpacks_to_samples(src, handler, open_stream=_open)


class check_empty:
    """Stage: pass samples through; raise ConfigError if this worker got none at all."""

    def __init__(self, what: str = "dataset") -> None:
        self.what = what

    def __call__(self, source: Iterable[Sample]) -> Iterator[Sample]:
        empty = True
        for sample in source:
            empty = False
            yield sample
        if empty:
            info = worker_info()
            raise ConfigError(
                f"no samples found in {self.what} (rank {info.rank}/{info.world_size}, worker "
                f"{info.worker}/{info.num_workers}); perhaps there are fewer shards than nodes x "
                "workers, or the shards are empty. Turn this check off with "
                "WebDataset(..., empty_check=False)"
            )


def _log_shards(src: Iterable[Sample]) -> Iterator[Sample]:
    for item in src:
        log.info("WebDataset: opening shard %s", redact(str(item.get("url"))))
        yield item


def _as_seed(value: object, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"{name} must be an integer seed, got {value!r}")


def _cache_settings(settings: Settings, cache_dir: Any, cache_size: Any,
                    revalidate: bool | None, local: bool | None) -> Settings:
    """``settings`` with WebDataset's explicit cache arguments in place of the environment's."""
    if isinstance(cache_size, (int, float)) and not isinstance(cache_size, bool) \
            and cache_size < 0:
        cache_size = None
    settings = with_cache(settings, cache_dir, cache_size)
    if revalidate is not None:
        settings = replace(settings, cache_revalidate=bool(revalidate))
    if local is not None:
        settings = replace(settings, cache_local=bool(local))
    return settings


def _refuse_unsupported(urls: object, mode: str | None) -> None:
    if mode not in (None, "resampled"):
        raise ConfigError(
            f"WebDataset(mode={mode!r}): only None and 'resampled' are supported (webdataset's "
            "other modes watch a directory of shards, which wds_cloud does not do)"
        )
    if isinstance(urls, dict) or (
        isinstance(urls, str) and urls.endswith((".yaml", ".yml", ".json"))
    ):
        shown = urls if isinstance(urls, str) else "a spec dict"
        raise ConfigError(
            f"WebDataset({shown!r}): YAML/JSON dataset specs are not supported yet; give a "
            "brace pattern such as 'data/shard-{000000..000099}.tar' or a list of URLs"
        )
    if isinstance(urls, str) and urlparse(urls).path.endswith("/"):
        raise ConfigError(
            f"WebDataset({redact(urls)!r}): a URL ending in '/' means a directory to watch "
            "(webdataset's DirectoryShardList), which is not supported; list the shards "
            "with a brace pattern instead"
        )


def _expand_patterns(
    urls: Any, settings: Settings, storage_options: Mapping[str, Any] | None,
) -> Any:
    """Shard URLs with globs (``s3://b/train-*.tar``) listed once, here, not in each worker."""
    if not isinstance(urls, str) and not (
            isinstance(urls, (list, tuple)) and all(isinstance(u, str) for u in urls)):
        return urls
    listed = shards.expand_source(urls)
    expanded = expand_glob(listed, settings=settings, storage_options=storage_options)
    return urls if expanded == listed else expanded


def _resolve_seed(seed: object, settings: Settings) -> tuple[int, bool]:
    """The seed to use and whether the user chose it (argument or ``WDS_SEED``)."""
    if seed is not None:
        return _as_seed(seed, "WebDataset(seed=...)"), True
    env_seed = settings.url_vars.get("SEED")
    if env_seed is not None:
        return _as_seed(env_seed, "WDS_SEED"), True
    return random.SystemRandom().randrange(2**63), False


def _shard_source(urls: Any, resampled: bool, empty_check: bool, seed: int | None) -> Any:
    if isinstance(urls, (shards.SimpleShardList, shards.ResampledShards, pipeline.DataPipeline)):
        if resampled:
            raise ConfigError(
                f"WebDataset(resampled=True) needs URLs, not a shard list object ({urls!r}); "
                "pass the URLs, or pass ResampledShards(urls) without resampled=True"
            )
        return urls
    if isinstance(urls, (str, Iterable)):
        if resampled:
            if seed is None:
                return ResampledShards(urls, empty_check=empty_check)
            return ResampledShards(urls, seed=seed, deterministic=True, empty_check=empty_check)
        return shards.SimpleShardList(urls)
    raise ConfigError(
        f"WebDataset cannot use urls of type {type(urls).__name__}: give a string (brace "
        "pattern, '::'-joined lists), a list of URL strings or a shard list"
    )


class WebDataset(DataPipeline, FluidInterface):
    """A pipeline reading samples from WebDataset tar shards, with webdataset 1.0.2's arguments.

    Stages, in order: the shard list (``SimpleShardList``, or ``ResampledShards`` when
    ``resampled``), ``nodesplitter``, ``workersplitter``, the shard shuffle, reading and
    grouping the tar files (``tarfile_to_samples`` with ``handler``, ``select_files`` and
    ``rename_files``), and the empty check. See the module docstring for arguments that
    behave differently from webdataset. A torch ``IterableDataset`` when torch is installed.
    """

    def __init__(
        self,
        urls: Any,
        handler: Handler = reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: int | bool | None = None,
        cache_size: int | str = -1,
        cache_dir: str | None = None,
        url_to_name: Callable[[str], str] | None = None,
        detshuffle: bool = False,
        nodesplitter: Callable[[Iterable[Any]], Iterable[Any]] | None = single_node_only,
        workersplitter: Callable[[Iterable[Any]], Iterable[Any]] | None = split_by_worker,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str | None] | None = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: int | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_revalidate: bool | None = None,
        cache_local: bool | None = None,
    ) -> None:
        super().__init__()
        _refuse_unsupported(urls, mode)
        settings = _cache_settings(Settings.from_env(), cache_dir, cache_size, cache_revalidate,
                                   cache_local)
        urls = _expand_patterns(urls, settings, storage_options)
        resampled = resampled or mode == "resampled"
        shardshuffle = _shardshuffle_size(shardshuffle, resampled)
        self.seed, chosen = _resolve_seed(seed, settings)
        self.append(_shard_source(urls, resampled, empty_check, self.seed if chosen else None))
        if nodesplitter is not None:
            self.append(nodesplitter)
        if workersplitter:
            self.append(workersplitter)
        if shardshuffle:
            if detshuffle:
                self.append(filters.detshuffle(shardshuffle, seed=self.seed))
            else:
                self.append(shards.ShardShuffle(shardshuffle, seed=self.seed,
                                                worker_info=worker_info))
        if verbose:
            self.append(_log_shards)
        self.append(tarfile_to_samples(
            handler=handler, select_files=select_files, rename_files=rename_files,
            storage_options=storage_options, settings=settings, url_to_name=url_to_name))
        if empty_check:
            self.append(check_empty(_describe(urls)))
        if repeat:
            self.repeat()

    def __enter__(self) -> WebDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe(urls: object) -> str:
    if isinstance(urls, str):
        return f"WebDataset({redact(urls)!r})"
    return f"WebDataset({type(urls).__name__})"


def _shardshuffle_size(shardshuffle: int | bool | None, resampled: bool) -> int:
    """webdataset's warnings, then the buffer size of the shard shuffle (0: none)."""
    if resampled:
        if shardshuffle not in (False, None):
            warnings.warn(
                "WebDataset(shardshuffle=...) is ignored for resampled datasets", stacklevel=3)
        return 0
    if shardshuffle is None:
        warnings.warn(
            "WebDataset(shardshuffle=...) is None; set explicitly to False or a number",
            stacklevel=3)
        return 0
    if shardshuffle is True:
        warnings.warn(
            "set WebDataset(shardshuffle=...) to a positive integer or 0 or False", stacklevel=3)
        return 100
    if not isinstance(shardshuffle, int) or shardshuffle < 0:
        raise ConfigError(
            f"WebDataset(shardshuffle={shardshuffle!r}): give a buffer size >= 0 or False")
    return int(shardshuffle)


class FluidWrapper(DataPipeline, FluidInterface):
    """A pipeline with the fluid methods, starting from ``initial`` (a source)."""

    def __init__(self, initial: Any) -> None:
        super().__init__()
        self.append(initial)

