"""Room in a shard cache directory: reservations for downloads, LRU eviction, the log.

All reservations are made under the directory's admission lock, and every download in progress
is charged its full size from the moment it is reserved, so the files of the directory never
add up to more than the bound. An entry is evicted only while nobody holds its lock (nobody is
filling or replacing it) and nobody holds a shared ``flock`` on its file (nobody is reading it).
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import shutil

from ..settings import human_size
from ..urls import redact
from .layout import CacheLayout, Record, footprint, unlink, write_atomic

__all__ = ["CacheLog", "Room"]

log = logging.getLogger("wds_cloud.cache")

_FREE_MARGIN = 64 * 2**20  # an unbounded cache leaves at least this much of its disk free
_warned: set[tuple[str, str]] = set()


class CacheLog:
    """The cache's lines: DEBUG, or INFO when ``verbose`` (shown on stderr if logging is not
    configured); warnings once per run (see :meth:`warn`)."""

    def __init__(self, root: str, *, verbose: bool) -> None:
        self.root = root
        self._level = logging.INFO if verbose else logging.DEBUG
        if verbose:
            _show_on_stderr()

    def note(self, event: str, url: str, text: str) -> None:
        log.log(self._level, "cache %s %s: %s", event, redact(url), text)

    def warn(self, url: str, kind: str, text: str, *, shard: str | None = None) -> None:
        """Warn (logger ``wds_cloud.cache``) once per run, cache directory, ``kind`` and entry
        name ``shard`` (``None``: once per kind); after that, log at the cache's level.

        A run is the process that started this one through :mod:`multiprocessing` (a
        DataLoader's workers, started anew each epoch, belong to the training process), or this
        process; ``<root>/warned/<kind>[-<shard>]`` holds the run that last gave the warning."""
        key = kind if shard is None else f"{kind}-{shard}"
        if (self.root, key) in _warned or not self._first_in_run(key):
            _warned.add((self.root, key))
            log.log(self._level, "cache skip: %s", text)
            return
        _warned.add((self.root, key))
        log.warning("%s", text)

    def _first_in_run(self, key: str) -> bool:
        run = _run_id().encode()
        try:
            os.makedirs(os.path.join(self.root, "warned"), exist_ok=True)
            fd = os.open(os.path.join(self.root, "warned", key), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # a read-only directory: warn once per process
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # two workers meeting the shard at once: one warns
            if os.pread(fd, 256, 0) == run:
                return False
            os.ftruncate(fd, 0)
            os.pwrite(fd, run, 0)
            return True
        except OSError:
            return True
        finally:
            os.close(fd)


class Room:
    """Admission and eviction for the directory of ``layout``, bounded by ``max_bytes``
    (``None``: only the disk's free space)."""

    def __init__(self, layout: CacheLayout, max_bytes: int | None, report: CacheLog) -> None:
        self.layout, self.max_bytes, self.report = layout, max_bytes, report

    def reserve(self, url: str, key: str, name: str, size: int, version: str | None) -> bool:
        """Make room for ``size`` bytes and record the download, or say why not."""
        need = footprint(size)
        limit = self.max_bytes
        if limit is not None and need > limit:
            self.report.warn(url, "too-big", f"{redact(url)} ({human_size(size)}) is larger than "
                             f"the whole cache ({human_size(limit)} in {self.layout.root}): it "
                             "is streamed without caching; raise cache_size (WDS_CACHE_SIZE) "
                             "to cache it", shard=name)
            return False
        with self.layout.admission():
            if limit is None:
                free = shutil.disk_usage(self.layout.root).free
                if free < size + _FREE_MARGIN:
                    self.report.warn(url, "disk", f"not caching {redact(url)}: only "
                                     f"{human_size(free)} free in {self.layout.root}")
                    return False
            else:
                used = self.used(exclude=name)
                if used + need > limit:
                    used = self._evict_lru(used + need - limit, used)
                if used + need > limit:
                    self.report.warn(url, "full", f"not caching {redact(url)}: the cache is "
                                     f"full of shards being read ({human_size(used)} of "
                                     f"{human_size(limit)})")
                    return False
            record = Record(url=redact(url), key=key, size=size, version=version,
                            pid=os.getpid())
            write_atomic(self.layout.part_record(name), record.to_json())
            os.close(os.open(self.layout.part(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                             0o644))
        return True

    def used(self, *, exclude: str | None = None) -> int:
        """Bytes charged for entries and for downloads in progress; downloads whose process is
        gone are removed on the way. Downloads are listed first: one published between the two
        listings is then counted twice for a moment, never not at all."""
        total = 0
        for entry in list(self.layout.names("partial")):
            if not entry.name.endswith(".json") or entry.name[:-5] == exclude:
                continue
            name = entry.name[:-5]
            record = self.layout.read_record(entry.path)
            if self._drop_if_stale(name) or record is None:
                continue
            total += footprint(record.size)
        return total + sum(footprint(size) for _, size, _ in self.published_files())

    def published_files(self) -> list[tuple[float, int, str]]:
        """(last use, size, name) of each published entry."""
        found = []
        for e in self.layout.names("data"):
            try:
                st = e.stat()
            except FileNotFoundError:  # evicted meanwhile
                continue
            found.append((st.st_mtime, st.st_size, e.name))
        return found

    def _drop_if_stale(self, name: str) -> bool:
        lock = self.layout.try_lock(name)
        if lock is None:
            return False
        try:
            self.layout.drop_partial(name)
        finally:
            self.layout.unlock(lock, name)
        log.debug("removed the stale download of %s", name)
        return True

    def _evict_lru(self, excess: int, used: int) -> int:
        """Evict least-recently-used entries not in use until ``excess`` bytes are freed."""
        for _, _, name in sorted(self.published_files()):
            if excess <= 0:
                break
            freed = self.evict(name)
            excess -= freed
            used -= freed
        return used

    def evict(self, name: str) -> int:
        """Remove the entry ``name`` unless it is being read or filled; the bytes charged."""
        lock = self.layout.try_lock(name)
        if lock is None:
            return 0
        fd = -1
        try:
            fd = os.open(self.layout.data(name), os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            size = os.fstat(fd).st_size
            unlink(self.layout.data(name))
            unlink(self.layout.meta(name))
        except (FileNotFoundError, BlockingIOError):
            return 0
        finally:
            if fd >= 0:
                os.close(fd)
            self.layout.unlock(lock, name, remove=True)
        self.report.note("evict", name, f"{name}: {human_size(size)} evicted")
        return footprint(size)


def _run_id() -> str:
    """The process id of this run's first process (see :meth:`CacheLog.warn`) and its start
    time (a process id used again later is another run)."""
    parent = multiprocessing.parent_process()
    pid = parent.pid if parent is not None and parent.pid else os.getpid()
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # field 22: start time (Linux)
            started = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        started = "?"
    return f"{pid} {started}"


def _show_on_stderr() -> None:
    """``WDS_VERBOSE_CACHE=1`` with logging not configured: show the cache's lines anyway."""
    if not log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
