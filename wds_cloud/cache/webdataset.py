"""webdataset's ``webdataset.cache`` names, backed by :class:`~wds_cloud.cache.ShardCache`.

``from wds_cloud.cache import FileCache`` (and ``wds.cache.FileCache``) runs code written for
webdataset 1.0.2's ``webdataset/cache.py``: :class:`FileCache`, :class:`StreamingOpen`,
:class:`LRUCleanup`, :func:`url_to_cache_name`, :func:`pipe_cleaner`, :func:`check_tar_format`,
with 1.0.2's signatures. :func:`cached_url_opener`, :func:`cached_tarfile_samples` and
:func:`cached_tarfile_to_samples` are gone from 1.0.2; they take the arguments of the last
webdataset that had them (0.2.x, in the same module).

The files are those of our shard cache, so what it promises holds here too: names that never
collide (``s3://a/x.tar`` and ``s3://b/x.tar`` are two entries, where webdataset's basenames
were one file), one download per node under ``flock`` locks, the size bound kept at every
download (webdataset's cleaner ran every ``cache_cleanup_interval`` seconds and let the
directory overshoot meanwhile), LRU eviction that never removes a shard being read, and
rewriting (``WDS_REWRITE``), AIStore and the stores' one retry policy on the way.

What cannot be kept on top of it:

* ``url_to_name`` gives only the readable part of a file's name (its last path component);
  the file is ``<cache_dir>/data/<readable>.<16 hex digits of the URL's hash><ext>``, never
  ``<cache_dir>/<url_to_name(url)>``. Ask :meth:`FileCache.get_file` where a URL's file is.
* The output of ``pipe:`` commands and responses that do not say their size are read, not
  cached (the cache reserves a shard's size before storing it), and so is a shard larger than
  the whole cache; :meth:`FileCache.get_file` raises :class:`~wds_cloud.errors.CacheError`
  for them, while the openers yield them uncached, as streams.
* A URL that fails goes to ``handler`` once (the stores have already retried it); webdataset
  tried ten times, sleeping up to two minutes. ``handler`` returning ``False`` stops the
  stage, as it does everywhere in webdataset but in ``FileCache``. Errors name the URL
  themselves: their ``args`` are not extended with it.
* Nothing is obsolete: webdataset raised from ``pipe_cleaner`` and the ``cached_*`` functions
  unless ``ALLOW_OBSOLETE=1``. ``verbose`` logs (logger ``wds_cloud.cache``) instead of printing.

The router (which routes through the cache) and the tar and pipeline stages sit above this room:
they are imported when first used, so importing the cache stays light.
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlparse

from ..errors import CacheError, ShardFormatError
from ..handlers import Handler, reraise_exception
from ..settings import Settings, expand_path, parse_size
from ..urls import redact
from .follow import GrowingFile
from .shardcache import ShardCache
from .tee import TeeStream
from .webdataset_files import default_cache_dir_of, islocal

if TYPE_CHECKING:
    from ..router import Router

__all__ = ["FileCache", "LRUCleanup", "StreamingOpen", "cached_tarfile_samples",
           "cached_tarfile_to_samples", "cached_url_opener", "check_tar_format", "pipe_cleaner",
           "url_to_cache_name"]

log = logging.getLogger("wds_cloud.cache")

Sample = dict[str, Any]
_NAMED_SCHEMES = ("", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais")
_SETTLE = 60.0  # seconds to wait for another process to publish a download we read along


def pipe_cleaner(spec: str) -> str:
    """The URL inside a ``pipe:`` command (its first word that is an http(s), hdfs, gs, ais or
    s3 URL), or the command without ``pipe:`` if none is; other specs as they are."""
    if spec.startswith("pipe:"):
        spec = spec[5:]
        for word in spec.split(" "):
            if re.match(r"^(https?|hdfs|gs|ais|s3):", word):
                return word
    return spec


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """webdataset's cache name of ``url``: the last ``ndir + 1`` components of its path for
    local, http(s), ftp(s), gs, s3 and ais URLs, else the whole URL quoted (last 128 chars)."""
    if not isinstance(url, str):
        raise TypeError(f"url_to_cache_name: expected a URL string, got {url!r}")
    parsed = urlparse(url)
    if parsed.scheme in _NAMED_SCHEMES:
        return "/".join(parsed.path.lstrip("/").split("/")[-1 - ndir:])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]


def _filetype(fname: str) -> tuple[str, bytes]:
    """webdataset's ``magic_filetype`` description of ``fname``, and its first bytes."""
    with open(fname, "rb") as f:
        header = f.read(512)
    if header[:2] == b"\x1f\x8b":
        return "gzip compressed data", header
    if len(header) > 261 and header[257:262] == b"ustar":
        return "POSIX tar archive", header
    return "data", header


def check_tar_format(fname: str) -> bool:
    """Whether ``fname`` starts as a POSIX tar archive or gzip data does (webdataset's default
    validator: other compressions and pre-POSIX tar files fail it)."""
    return _filetype(fname)[0] != "data"


def _url_of(item: Any) -> str:
    url = item.get("url") if isinstance(item, dict) else item
    if not isinstance(url, str):
        raise TypeError(f"expected a URL or a dict with a 'url' string, got {item!r:.80}")
    return url


@dataclass(frozen=True)
class _Readable:
    """The readable part of an entry's name: the last path component of ``url_to_name(url)``."""

    url_to_name: Callable[[str], str]

    def __call__(self, url: str) -> str:
        return str(self.url_to_name(url)).rstrip("/").rsplit("/", 1)[-1]


class _Routed:
    """Opens URLs through a router over ``_settings``, built once per process (never pickled:
    a DataLoader worker builds its own)."""

    _settings: Settings
    _readable: Callable[[str], str] | None = None
    _router: tuple[int, Router] | None = None

    def _route(self) -> Router:
        if self._router is None or self._router[0] != os.getpid():
            from ..router import Router  # the router sits above the cache: it routes through it

            self._router = (os.getpid(), Router(self._settings, {}, self._readable))
        return self._router[1]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_router": None}


class LRUCleanup:
    """Evicts least-recently-used entries of the shard cache in ``cache_dir`` until it holds
    at most ``cache_size`` bytes, at most once every ``interval`` seconds (``None``: on every
    call), oldest ``keyfn(path)`` first. Entries being read or downloaded are kept; files that
    are not the cache's entries are neither counted nor removed. A hit sets an entry's
    modification time, and so its ctime: the default ``os.path.getctime`` is last use."""

    def __init__(self, cache_dir: str | None = None, cache_size: int = int(1e12),
                 keyfn: Callable[[str], float] = os.path.getctime, verbose: bool = False,
                 interval: float | None = 30) -> None:
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.keyfn = keyfn
        self.verbose = verbose
        self.interval = interval
        self.last_run = 0.0

    def set_cache_dir(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir

    def cleanup(self) -> None:
        """Evict until the bound holds (the entries are charged as :class:`ShardCache` charges
        them: whole disk blocks, a record each, downloads in progress at their full size)."""
        if self.cache_dir is None or not os.path.isdir(os.path.join(self.cache_dir, "data")):
            return
        if self.interval is not None and time.time() - self.last_run < self.interval:
            return
        cache = ShardCache(self.cache_dir, max_bytes=int(self.cache_size), verbose=self.verbose)
        with cache.layout.admission():
            used = cache.room.used()
            names = [name for _, _, name in cache.room.published_files()]
            for name in sorted(names, key=lambda name: self._age(cache.layout.data(name))):
                if used <= self.cache_size:
                    break
                used -= cache.evict(name)
        self.last_run = time.time()

    def _age(self, path: str) -> float:
        try:
            return float(self.keyfn(path))
        except OSError:  # evicted meanwhile
            return float("-inf")


class StreamingOpen(_Routed):
    """Opens each URL (a string or a dict with ``url``) without caching, as
    ``{"url", "stream"[, "local_path"]}``; errors go to ``handler``. ``verbose`` logs each
    open (logger ``wds_cloud.cache``, INFO)."""

    def __init__(self, verbose: bool = False, handler: Handler = reraise_exception) -> None:
        self.verbose = verbose
        self.handler = handler
        self._settings = replace(Settings.from_env(), cache_dir=None)

    def __call__(self, urls: Iterable[str | Sample]) -> Iterator[Sample]:
        for item in urls:
            try:
                url = _url_of(item)
                stream = self._route().open(url)
            except Exception as exn:
                if self.handler(exn):
                    continue
                return
            if self.verbose:
                log.info("opened %s", redact(url))
            out: Sample = {"url": url, "stream": stream}
            if islocal(url):
                out["local_path"] = urlparse(url).path
            yield out


class FileCache(_Routed):
    """Opens URLs through the shard cache in ``cache_dir`` (default: ``WDS_CACHE``, else
    ``./_cache``), bounded by ``cache_size`` bytes (``-1``: ``WDS_CACHE_SIZE`` or no bound;
    ``0``: no bound). Local paths and ``file:`` URLs are read where they are.

    Calling it on URLs (strings or dicts with ``url``) yields ``{"url", "stream",
    "local_path"}``: ``local_path`` is the entry's file (where it will be once downloaded).
    With a ``validator`` (webdataset's default, :func:`check_tar_format`) a download is read to
    its end and ``validator(path)`` must hold before its stream is yielded, as webdataset did;
    a failure removes the entry and raises :class:`~wds_cloud.errors.ShardFormatError` (a
    ``ValueError``). With ``validator=None`` the stream is read while it downloads. Errors go
    to ``handler``. ``verbose`` logs each hit, miss, fill and eviction at INFO. ``cleaner`` is
    an :class:`LRUCleanup` of the directory (with ``cache_cleanup_interval``) when there is a
    bound, for code that calls it; the cache keeps its bound without it. See the module
    docstring for what ``url_to_name`` still decides."""

    def __init__(
        self, cache_dir: str | None = None, *,
        url_to_name: Callable[[str], str] = url_to_cache_name, verbose: bool = False,
        validator: Callable[[str], bool] | None = check_tar_format,
        handler: Handler = reraise_exception, cache_size: int | str = -1,
        cache_cleanup_interval: float | None = 30,
    ) -> None:
        env = Settings.from_env()
        size = parse_size(cache_size, name="cache_size") if isinstance(cache_size, str) \
            else cache_size
        self.url_to_name = url_to_name
        self.validator = validator
        self.handler = handler
        self.cache_dir = cache_dir if cache_dir is not None else default_cache_dir_of(env)
        self.verbose = verbose
        self.cleaner = LRUCleanup(self.cache_dir, int(size), verbose=verbose,
                                  interval=cache_cleanup_interval) if size > 0 else None
        bound = env.cache_size if size < 0 else int(size) or None
        self._settings = replace(env, cache_dir=expand_path(self.cache_dir), cache_size=bound,
                                 cache_local=False, verbose_cache=env.verbose_cache or verbose)
        self._readable = _Readable(url_to_name)

    def get_file(self, url: str) -> str:
        """The file holding ``url``: a local path as it is, else its cache entry, downloaded
        (and validated) first if need be. It is not locked against eviction: read it soon, or
        read the URL through this object. Raises :class:`~wds_cloud.errors.CacheError` if the
        URL cannot be cached (``pipe:``, larger than the cache, no size)."""
        if islocal(url) and not self._settings.cache_local:
            return urlparse(url).path
        router = self._route()
        cache, resolved = router.cache(), router.resolve(url)
        if cache is None or not cache.wants(resolved):
            why = "the cache is turned off (a size of 0)" if cache is None else \
                "the output of pipe: commands is not cached (its size is not known ahead)"
            raise CacheError(f"cannot cache {redact(url)}: {why}")
        stream = router.open(url)
        with stream:
            if not isinstance(stream, (TeeStream, GrowingFile)):
                path = getattr(stream, "local_path", None)  # a hit, or a local file read in place
                if path is None:
                    raise _not_kept(url, cache)
                return str(path)
            _drain(stream)
        return self._validated(url, cache, resolved)

    def __call__(self, urls: Iterable[str | Sample]) -> Iterator[Sample]:
        for item in urls:
            try:
                opened = self._open(_url_of(item))
            except Exception as exn:
                if self.handler(exn):
                    continue
                return
            yield opened

    def _open(self, url: str) -> Sample:
        router = self._route()
        if islocal(url) and not self._settings.cache_local:
            return {"url": url, "stream": router.open(url), "local_path": urlparse(url).path}
        stream = router.open(url)
        out: Sample = {"url": url, "stream": stream}
        if isinstance(stream, (TeeStream, GrowingFile)):
            cache, resolved = router.cache(), router.resolve(url)
            assert cache is not None  # only the cache makes these streams
            if self.validator is None:
                out["local_path"] = cache.layout.data(cache.entry_name(resolved))
                return out
            with stream:
                _drain(stream)
            self._validated(url, cache, resolved)
            out["stream"] = stream = router.open(url)  # the entry, locked against eviction
        path = getattr(stream, "local_path", None)
        if path is not None:
            out["local_path"] = path
        return out

    def _validated(self, url: str, cache: ShardCache, resolved: str) -> str:
        """The path of the entry just downloaded, once published and validated."""
        path = _published(cache, resolved)
        if path is None:
            raise _not_kept(url, cache)
        if self.validator is not None and not self.validator(path):
            kind, head = _filetype(path)
            cache.evict(os.path.basename(path))
            raise ShardFormatError(f"{path} ({redact(url)}) is not a tar archive, but {kind}; "
                                   f"it begins {head[:200]!r}; the cache entry was removed",
                                   url=redact(url))
        return path


def _drain(stream: BinaryIO) -> None:
    buffer = memoryview(bytearray(1 << 20))
    while stream.readinto(buffer):  # type: ignore[attr-defined]
        pass


def _published(cache: ShardCache, url: str) -> str | None:
    """The entry of ``url`` once the download read to its end is published; ``None`` if it
    was not kept (a failed write, a downloading process that died)."""
    name, layout = cache.entry_name(url), cache.layout
    deadline, delay = time.monotonic() + _SETTLE, 0.002
    while True:
        path = cache.published(url)
        if path is not None or time.monotonic() > deadline:
            return path
        if not os.path.exists(layout.part_record(name)) or layout.lock_free(name):
            return cache.published(url)  # nobody is downloading it any more
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _not_kept(url: str, cache: ShardCache) -> CacheError:
    return CacheError(f"{redact(url)} was read but not kept in the cache {cache.root}: it is "
                      "larger than the cache, the store did not say its size, or the cache "
                      "is full of shards being read (see the warning of logger wds_cloud.cache)")


def cached_url_opener(
    data: Iterable[str | Sample], handler: Handler = reraise_exception,
    cache_size: int | str = -1, cache_dir: str | None = None,
    url_to_name: Callable[[str], str] = pipe_cleaner,
    validator: Callable[[str], bool] | None = check_tar_format, verbose: bool = False,
    always: bool = False,
) -> Iterator[Sample]:
    """Add ``stream`` (and ``local_path``) to each ``{"url": ...}`` of ``data``, opened through
    the shard cache as :class:`FileCache` opens them; ``always`` caches local files too
    (otherwise they are read where they are)."""
    files = FileCache(cache_dir, url_to_name=url_to_name, verbose=verbose, validator=validator,
                      handler=handler, cache_size=cache_size)
    if always:
        files._settings = replace(files._settings, cache_local=True)
    for item in data:
        try:
            opened = files._open(_url_of(item))
        except Exception as exn:
            if handler(exn):
                continue
            return
        yield {**item, **opened} if isinstance(item, dict) else opened


def cached_tarfile_samples(
    src: Iterable[str | Sample], handler: Handler = reraise_exception,
    cache_size: int | str = -1, cache_dir: str | None = None, verbose: bool = False,
    url_to_name: Callable[[str], str] = pipe_cleaner, always: bool = False,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str | None] | None = None,
) -> Iterator[Sample]:
    """Samples from the tar shards named by ``src``, read through the shard cache
    (:func:`cached_url_opener`), split into members and grouped by key as
    :func:`wds_cloud.tarfile_samples` does."""
    from ..tar.samples import group_by_keys, tar_file_expander  # a layer up: imported when used

    streams = cached_url_opener(src, handler=handler, cache_size=cache_size,
                                cache_dir=cache_dir, verbose=verbose, url_to_name=url_to_name,
                                always=always)
    files = tar_file_expander(streams, handler=handler, select_files=select_files,
                              rename_files=rename_files)
    return group_by_keys(files, handler=handler)


def cached_tarfile_to_samples(*args: Any, **kw: Any) -> Any:
    """The stage ``cached_tarfile_to_samples(handler=..., cache_dir=..., ...)``:
    :func:`cached_tarfile_samples` curried, as webdataset's ``pipelinefilter`` made it."""
    from ..pipeline.core import stage  # a layer up: imported when used

    return stage(cached_tarfile_samples, *args, **kw)
