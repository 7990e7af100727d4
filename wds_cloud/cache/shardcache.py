"""The on-disk shard cache: streams while it fills, one download per node, crash-safe, bounded.

:class:`ShardCache` sits between the router and the openers (rewrite -> AIStore -> cache ->
opener). Opening a URL through it:

* **hit**: the published entry is opened, its record checked (size, key), its time of last use
  set (LRU), and it is read like any local file;
* **miss**: the process that gets the entry's lock makes the one request, reserves room (evicting
  least-recently-used entries not in use) and reads the response as it arrives, each piece also
  written to ``partial/<name>`` by the thread that read it (:mod:`wds_cloud.cache.fill`);
  readers in every other process read that file as it grows. When all bytes are there the
  validation record is written and the file is renamed into ``data/`` (``os.replace``);
* **no room** (the shard is larger than the whole cache, or the entries that would have to go
  are being read), **no size** (a response without a length): the shard is streamed from the
  store and not cached, with a warning (logger ``wds_cloud.cache``; once per run and shard).

Crash safety comes from the order of renames and from ``flock`` locks, which die with their
process: a file is in ``data/`` only once complete, with its record written before it; a
download whose lock is free is stale and is removed by the next process that looks. Readers of a
download whose process died take it over from the byte they had reached.

With ``revalidate``, a hit first asks the store for the object: if its version (ETag,
generation) differs from the record's, the entry is fetched again from that same response.
:mod:`wds_cloud.cache.admin` lists, verifies (size, CRC-32), prunes and clears a directory;
:mod:`wds_cloud.cache.eviction` makes room; :mod:`wds_cloud.cache.layout` names the files. Locks are
POSIX ``flock``: keep the directory on a local file system.

Every hit, miss, fill and eviction is logged (logger ``wds_cloud.cache``) at DEBUG, or at INFO
with ``verbose`` (``WDS_VERBOSE_CACHE=1``), which also shows them on stderr when logging is not
configured.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import BinaryIO, cast

from ..errors import TransferError
from ..settings import Settings, expand_path, human_size
from ..urls import redact, split_scheme
from .eviction import CacheLog, Room
from .fill import Fill, wait_fills
from .follow import FillGone, GrowingFile
from .layout import (
    CacheLayout,
    Record,
    check_record,
    entry_url,
    local_file,
    stream_facts,
    unlink,
    url_key,
    write_atomic,
)
from .tee import TeeStream

__all__ = ["CacheEntry", "CacheUsage", "ShardCache", "wait_downloads"]

log = logging.getLogger(__name__)

_POLL_FIRST, _POLL_MAX = 0.002, 0.05
_UNCACHED = ("pipe", "-")


def wait_downloads(timeout: float | None = None) -> bool:
    """Wait until this process's downloads into caches have been written and published (or
    dropped); ``False`` if some were still going after ``timeout`` seconds. Readers get a
    shard's last byte a moment before its entry is published."""
    return wait_fills(timeout)


@dataclass(frozen=True)
class CacheEntry:
    """A published entry: its file, the URL it holds (redacted), size, version, last use."""

    name: str
    path: str
    url: str
    size: int
    version: str | None
    last_used: float


@dataclass(frozen=True)
class CacheUsage:
    """Entries and bytes of a cache directory, and downloads in progress."""

    entries: int
    bytes: int
    downloads: int
    download_bytes: int
    limit: int | None
    charged: int  # what the entries count against the limit (whole blocks, and a record each)


class ShardCache:
    """A shard cache in the directory ``root`` holding at most ``max_bytes`` (``None``: as much
    as the disk allows). See the module docstring."""

    def __init__(
        self, root: str | os.PathLike[str], *, max_bytes: int | None = None,
        revalidate: bool = False, verbose: bool = False, cache_local: bool = False,
        url_to_name: Callable[[str], str] | None = None,
    ) -> None:
        self.layout = CacheLayout(expand_path(root))
        self.revalidate = revalidate
        self.cache_local = cache_local
        self.url_to_name = url_to_name
        self.report = CacheLog(self.layout.root, verbose=verbose)
        self.room = Room(self.layout, max_bytes, self.report)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, url_to_name: Callable[[str], str] | None = None,
    ) -> ShardCache | None:
        """The cache ``settings`` ask for, or ``None`` (no directory, or a size of 0)."""
        if not settings.cache_dir or settings.cache_size == 0:
            return None
        return cls(settings.cache_dir, max_bytes=settings.cache_size,
                   revalidate=settings.cache_revalidate, verbose=settings.verbose_cache,
                   cache_local=settings.cache_local, url_to_name=url_to_name)

    @property
    def root(self) -> str:
        return self.layout.root

    @property
    def max_bytes(self) -> int | None:
        """The bound on the bytes charged for entries and downloads (``None``: the disk's)."""
        return self.room.max_bytes

    def __repr__(self) -> str:
        return f"ShardCache({self.root!r}, max_bytes={self.max_bytes})"

    def wants(self, url: str) -> bool:
        """Whether ``url`` (as resolved) goes through the cache: remote URLs always, local paths
        only with ``cache_local``; never ``pipe:``, ``-`` or a file inside the cache."""
        if url == "-" or split_scheme(url)[0] in _UNCACHED:
            return False
        path = local_file(url)
        if path is not None:
            return self.cache_local and not path.startswith(os.path.realpath(self.root) + os.sep)
        return True

    def entry_name(self, url: str) -> str:
        """The name of ``url``'s entry (a local path: of the file it names, see
        :func:`~wds_cloud.cache.layout.entry_url`)."""
        return self.layout.name_for(entry_url(url), self.url_to_name)

    def published(self, url: str) -> str | None:
        """The file of ``url``'s published entry, if there is one. It is not locked: it may be
        evicted once returned; :meth:`open` reads it safely."""
        key, name = url_key(entry_url(url)), self.entry_name(url)
        return self.layout.data(name) if self._published(name, key, skip=None) else None

    def on_disk(self, url: str) -> bool:
        """Whether ``url``'s entry has a file in ``data/``: one ``stat``, for a caller that only
        needs a hint (is the first byte a round trip away?); :meth:`open` checks the entry."""
        return os.path.exists(self.layout.data(self.entry_name(url)))

    def open(self, url: str, open_stream: Callable[[], BinaryIO]) -> BinaryIO:
        """A read stream of ``url`` from the cache; ``open_stream()`` opens it at the store
        (called at most once, and only when the store has to be asked). A local path is the
        entry of the file it names, wherever it is read from."""
        self.layout.record_bound(self.max_bytes)
        url = entry_url(url)
        name = self.layout.name_for(url, self.url_to_name)
        return self._attach(url, url_key(url), name, open_stream, pos=0, version=None)

    # -- reading -----------------------------------------------------------------------------

    def _attach(
        self, url: str, key: str, name: str, open_stream: Callable[[], BinaryIO], *, pos: int,
        version: str | None,
    ) -> BinaryIO:
        """A stream of ``url`` from byte ``pos`` (of ``version`` when given): the published
        entry, a download this process starts, or another process's download."""
        stale: str | None = None
        remote: BinaryIO | None = None
        delay = _POLL_FIRST
        while True:
            hit = self._open_entry(name, key, url, skip=stale)
            if hit is not None:
                stream, record = hit
                if self.revalidate and remote is None and pos == 0:
                    try:
                        remote = open_stream()
                    except BaseException:
                        stream.close()
                        raise
                    if stream_facts(remote)[1] in (None, record.version):
                        remote.close()
                        self.report.note("hit", url, f"{name} (still version {record.version})")
                        return stream
                    stream.close()
                    stale = record.version
                    self.report.note("changed", url,
                                     f"{name}: version {record.version} is out of date")
                    continue
                self.report.note("hit", url, name)
                return _positioned(stream, record.version, pos, version, url)
            self.layout.ensure()  # made again if removed; a hit needs none of it
            self.layout.record_bound(self.max_bytes)  # if it could not be noted before
            lock = self.layout.try_lock(name)
            if lock is not None:
                if self._published(name, key, skip=stale):
                    self.layout.unlock(lock, name)
                    continue
                return self._fill(url, key, name, lock, open_stream, remote, pos, version)
            along = self._follow(url, key, name, open_stream, pos, version)
            if along is not None:
                if remote is not None:
                    remote.close()
                return along
            time.sleep(delay)
            delay = min(2 * delay, _POLL_MAX)

    def _open_entry(
        self, name: str, key: str, url: str, *, skip: str | None,
    ) -> tuple[BinaryIO, Record] | None:
        """The published entry, opened and locked against eviction, with its record."""
        try:
            fd = os.open(self.layout.data(name), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            record = self.layout.read_record(self.layout.meta(name))
            problem = check_record(record, st.st_size, key)
            if st.st_nlink == 0 or problem or (record and record.version == skip
                                               and skip is not None):
                os.close(fd)
                if problem and st.st_nlink:
                    self._discard(name, url, problem)
                return None
            os.utime(fd)
            stream = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        stream.local_path = self.layout.data(name)  # type: ignore[attr-defined]
        assert record is not None  # checked by check_record
        return stream, record

    def _published(self, name: str, key: str, *, skip: str | None) -> bool:
        record = self.layout.read_record(self.layout.meta(name))
        return (os.path.exists(self.layout.data(name)) and record is not None
                and record.key == key and (skip is None or record.version != skip))

    def _follow(
        self, url: str, key: str, name: str, open_stream: Callable[[], BinaryIO], pos: int,
        version: str | None,
    ) -> BinaryIO | None:
        """A stream over another process's download of ``name``, if one is under way."""
        record = self.layout.read_record(self.layout.part_record(name))
        if record is None or record.key != key:
            return None
        try:
            fd = os.open(self.layout.part(name), os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_nlink == 0:
            os.close(fd)
            return None
        if version is not None and record.version != version:
            os.close(fd)
            raise _changed(url, pos, version, record.version)
        self.report.note("follow", url, f"{name}: reading along another process's download")
        reattach = partial(self._reattach, url, key, name, open_stream)
        return cast(BinaryIO, GrowingFile(
            fd, size=record.size, version=record.version, pos=pos,
            probe=partial(self._probe, name), reattach=reattach))

    def _reattach(self, url: str, key: str, name: str, open_stream: Callable[[], BinaryIO],
                  pos: int, version: str | None) -> BinaryIO:
        self.report.note("takeover", url, f"{name}: its download stopped; going on from byte {pos}")
        return self._attach(url, key, name, open_stream, pos=pos, version=version)

    def _probe(self, name: str, fd: int) -> None:
        """Raise :class:`FillGone` unless the download read through ``fd`` is alive or done."""
        st = os.fstat(fd)
        try:
            if os.stat(self.layout.data(name)).st_ino == st.st_ino:
                return
        except FileNotFoundError:
            pass
        if st.st_nlink == 0 or self.layout.lock_free(name):
            raise FillGone(name)

    # -- filling -----------------------------------------------------------------------------

    def _fill(
        self, url: str, key: str, name: str, lock: int, open_stream: Callable[[], BinaryIO],
        remote: BinaryIO | None, pos: int, version: str | None,
    ) -> BinaryIO:
        """Download ``url`` into the entry (we hold its lock) through the stream returned: the
        store's own stream, teed into the entry's file, or not teed when it cannot be cached."""
        self.layout.drop_partial(name)  # a dead process's download: nobody may follow it now
        try:
            remote = remote if remote is not None else open_stream()
            size, got = stream_facts(remote)
            if version is not None and got != version:
                raise _changed(url, pos, version, got)
            if size is None or not self.room.reserve(url, key, name, size, got):
                if size is None:
                    self.report.warn(url, "no-size", f"not caching {redact(url)}: the store "
                                     "did not say its size", shard=name)
                self.layout.unlock(lock, name)
                uncached, remote = remote, None
                return _skip(uncached, pos)
            fill = Fill(os.open(self.layout.part(name), os.O_WRONLY), size, label=redact(url),
                        publish=partial(self._publish, name, Record(redact(url), key, size, got)),
                        abandon=partial(self._abandon, name, url),
                        release=partial(self.layout.unlock, lock, name))
        except BaseException:
            if remote is not None:
                remote.close()
            self.layout.drop_partial(name)
            self.layout.unlock(lock, name)
            raise
        self.report.note("miss", url, f"{name}: downloading {human_size(size)}")
        fill.start()
        probe = os.open(self.layout.part(name), os.O_RDONLY)
        try:
            return cast(BinaryIO, TeeStream(
                remote, fill, version=got, probe_fd=probe, pos=pos,
                reopen=partial(_reopen, open_stream, url, got)))
        except BaseException:  # the fill was told and gives up
            remote.close()
            os.close(probe)
            raise

    def _publish(self, name: str, record: Record, fill: Fill) -> None:
        """Called by the thread that wrote the last byte: record, then rename into place."""
        done = Record(url=record.url, key=record.key, size=record.size, version=record.version,
                      crc32=fill.crc32)
        unlink(self.layout.data(name))
        write_atomic(self.layout.meta(name), done.to_json())
        os.replace(self.layout.part(name), self.layout.data(name))
        unlink(self.layout.part_record(name))
        self.report.note("fill", record.url, f"{name}: {human_size(record.size)} cached")

    def _abandon(self, name: str, url: str, fill: Fill, exc: BaseException) -> None:
        self.layout.drop_partial(name)
        why = "the reader stopped" if fill.error is None else f"{type(exc).__name__}: {exc}"
        self.report.note("abandon", url, f"{name}: download stopped at byte {fill.written} ({why})")

    # -- room --------------------------------------------------------------------------------

    def evict(self, name: str) -> int:
        """Remove the entry ``name`` unless it is being read or filled; the bytes it freed."""
        return self.room.evict(name)

    def _discard(self, name: str, url: str, problem: str) -> None:
        self.layout.ensure()
        lock = self.layout.try_lock(name)
        if lock is None:
            return
        try:
            if unlink(self.layout.data(name)):
                log.warning("cache entry %s of %s was invalid (%s); fetching it again", name,
                            redact(url), problem)
            unlink(self.layout.meta(name))
        finally:
            self.layout.unlock(lock, name)

def _positioned(stream: BinaryIO, got: str | None, pos: int, version: str | None,
                url: str) -> BinaryIO:
    if version is not None and got != version:
        stream.close()
        raise _changed(url, pos, version, got)
    if pos:
        stream.seek(pos)
    return stream


def _skip(remote: BinaryIO, pos: int) -> BinaryIO:
    """``remote`` moved on to byte ``pos`` by reading (a takeover that cannot be cached)."""
    left = pos
    while left > 0:
        got = remote.read(min(left, 4 * 2**20))
        if not got:
            raise TransferError(f"the object ended before byte {pos}", offset=pos - left)
        left -= len(got)
    return remote


def _reopen(open_stream: Callable[[], BinaryIO], url: str, version: str | None,
            pos: int) -> BinaryIO:
    """The store's stream from byte ``pos``, of ``version``."""
    remote = open_stream()
    got = stream_facts(remote)[1]
    if version is not None and got != version:
        remote.close()
        raise _changed(url, pos, version, got)
    return _skip(remote, pos)


def _changed(url: str, pos: int, want: str | None, got: str | None) -> TransferError:
    return TransferError(f"{redact(url)} changed while it was read (version {want!r}, now "
                         f"{got!r}, at byte {pos})", url=redact(url), offset=pos)
