"""What :class:`~wds_cloud.dataset.WebDataset`'s arguments mean: the shard source its ``urls``
make (a shard list, resampled shards, a directory queue, exact epochs), the seed, the cache
settings, the shard-shuffle buffer, and the checks that refuse what cannot work. Part of the
composition root (with :mod:`wds_cloud.dataset` and :mod:`wds_cloud.reading`).
"""

from __future__ import annotations

import functools
import random
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlparse

from .errors import ConfigError, ShardNotFoundError
from .pipeline import core as pipeline
from .pipeline import shards
from .pipeline.directory import DirectoryShardList
from .pipeline.exact import ExactEpochShards
from .pipeline.shards import WorkerInfo
from .pytorch import ResampledShards, single_node_only, split_by_node, split_by_worker
from .router import Router, expand_glob, with_cache
from .settings import Settings
from .urls import redact, substitute_vars

__all__ = [
    "as_seed",
    "bind_worker_info",
    "cache_settings",
    "describe",
    "exact_source",
    "expand_patterns",
    "is_directory",
    "is_spec",
    "refuse_unsupported",
    "resolve_seed",
    "shard_source",
    "shardshuffle_size",
]


def as_seed(value: object, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"{name} must be an integer seed, got {value!r}")


def cache_settings(settings: Settings, cache_dir: Any, cache_size: Any,
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


def refuse_unsupported(urls: object, mode: str | None) -> None:
    if is_directory(urls, mode) or is_spec(urls):
        return  # DirectoryShardList checks its mode; a spec has none
    if mode not in (None, "resampled"):
        raise ConfigError(
            f"WebDataset(mode={mode!r}): only None and 'resampled' are supported for shard "
            "lists; the queue modes ('resample', 'keep', 'unlink') go with a directory URL "
            "ending in '/' (webdataset's DirectoryShardList)"
        )


def is_spec(urls: object) -> bool:
    """A dataset spec: a ``DatasetSpec``, a dict, or a ``.yaml``/``.yml``/``.json`` path
    (``FILE#key.path`` for a section of a larger config)."""
    from .spec import DatasetSpec
    from .spec.schema import is_spec_path

    return isinstance(urls, (Mapping, DatasetSpec)) or is_spec_path(urls)


#: webdataset's ``DirectoryShardList`` modes: what becomes of a shard of the queue once read
QUEUE_MODES = ("resample", "keep", "unlink")
#: what a directory or prefix is listed for
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz")


def is_prefix(urls: object) -> bool:
    """A directory or bucket prefix: one URL ending in ``/``."""
    return isinstance(urls, str) and urlparse(urls).path.endswith("/")


def is_directory(urls: object, mode: str | None = None) -> bool:
    """A queue of shards, claimed by each process as it reads, which no splitter or shuffle
    may reorder: a ``DirectoryShardList``, or a directory URL (ending in ``/``) with one of
    webdataset's queue modes. Without a mode a directory is the shards in it."""
    return isinstance(urls, DirectoryShardList) or (is_prefix(urls) and mode in QUEUE_MODES)


def prefix_shards(url: str, router: Router) -> list[str]:
    """The shards directly in the directory (or bucket prefix) ``url``, sorted; a
    :class:`ShardNotFoundError` when there is none."""
    found: list[str] = []
    for suffix in SHARD_SUFFIXES:
        try:
            found += expand_glob([f"{url.rstrip('/')}/*{suffix}"], router=router)
        except ShardNotFoundError:
            continue
    if not found:
        raise ShardNotFoundError(
            f"no shards ({', '.join('*' + s for s in SHARD_SUFFIXES)}) in {redact(url)!r}",
            url=redact(url))
    return sorted(set(found))


def expand_patterns(urls: Any, url_vars: Mapping[str, str], router: Router) -> Any:
    """Shard URLs with globs (``s3://b/train-*.tar``) listed once, here, not in each worker;
    a directory or prefix (``shards/``, ``s3://b/train/``) gives the shards in it."""
    if is_prefix(urls):
        return prefix_shards(substitute_vars(urls, url_vars), router)
    if not isinstance(urls, str) and not (
            isinstance(urls, (list, tuple)) and all(isinstance(u, str) for u in urls)):
        return urls
    listed = shards.expand_source(urls, url_vars=url_vars)
    expanded = expand_glob(listed, router=router)
    return urls if expanded == listed else expanded


def resolve_seed(seed: object, settings: Settings) -> tuple[int, bool]:
    """The seed to use and whether the user chose it (argument or ``WDS_SEED``)."""
    if seed is not None:
        return as_seed(seed, "WebDataset(seed=...)"), True
    if settings.seed is not None:
        return settings.seed, True
    return random.SystemRandom().randrange(2**63), False


def bind_worker_info(splitter: Any, where: Callable[[], WorkerInfo]) -> Any:
    """Our own splitters, told where they run with the dataset's settings (not the environment
    read again); any other splitter as it is."""
    if splitter in (split_by_node, split_by_worker, single_node_only):
        return functools.partial(splitter, worker_info=where)
    return splitter


def shard_source(urls: Any, resampled: bool, empty_check: bool, seed: int | None,
                  url_vars: Mapping[str, str], mode: str | None,
                  storage_options: Mapping[str, Any]) -> Any:
    if isinstance(urls, DirectoryShardList):
        return urls
    if is_directory(urls, mode):
        return DirectoryShardList(urls, mode=mode, storage_options=storage_options)
    if isinstance(urls, (shards.SimpleShardList, shards.ShardResampler, pipeline.Pipeline)):
        if resampled:
            raise ConfigError(
                f"WebDataset(resampled=True) needs URLs, not a shard list object ({urls!r}); "
                "pass the URLs, or pass ResampledShards(urls) without resampled=True"
            )
        return urls
    if isinstance(urls, (str, Iterable)):
        if resampled:
            if seed is None:
                return ResampledShards(urls, empty_check=empty_check, url_vars=url_vars)
            return ResampledShards(urls, seed=seed, deterministic=True, empty_check=empty_check,
                                   url_vars=url_vars)
        return shards.SimpleShardList(urls, url_vars=url_vars)
    raise ConfigError(
        f"WebDataset cannot use urls of type {type(urls).__name__}: give a string (brace "
        "pattern, '::'-joined lists), a list of URL strings or a shard list"
    )


def exact_source(urls: Any, epoch_mode: str, remainder: str, resampled: bool, seed: int,
                  settings: Settings, where: Callable[[], WorkerInfo]) -> ExactEpochShards:
    """The shard source of ``epoch_mode="exact"``: it deals the shards to the slots itself,
    so no splitter and no shard shuffle follow it."""
    if epoch_mode != "exact":
        raise ConfigError(f"WebDataset(epoch_mode={epoch_mode!r}): the one mode is 'exact' "
                          "(None: webdataset's epochs)")
    if resampled:
        raise ConfigError("WebDataset(epoch_mode='exact') deals each shard once per epoch; "
                          "resampled=True draws shards with replacement: choose one")
    return ExactEpochShards(urls, seed=seed, remainder=remainder, worker_info=where,
                            url_vars=settings.url_vars)


def describe(urls: object) -> str:
    if isinstance(urls, str):
        return f"WebDataset({redact(urls)!r})"
    return f"WebDataset({type(urls).__name__})"


def shardshuffle_size(shardshuffle: int | bool | None, resampled: bool) -> int:
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
