"""Looking after a shard cache directory: list, measure, verify, prune, clear, recover.

Each function takes a :class:`~wds_cloud.cache.ShardCache` and is safe to run while other
processes use the cache: an entry being read or filled is never removed (it is reported as
kept), and a download whose process is gone is removed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .layout import check_record, crc32, footprint, unlink
from .shardcache import CacheEntry, CacheUsage, ShardCache

__all__ = ["Problem", "clear", "entries", "prune", "recover", "usage", "verify"]


@dataclass(frozen=True)
class Problem:
    """An entry :func:`verify` found wrong, and whether it was removed."""

    name: str
    url: str
    why: str
    removed: bool


def entries(cache: ShardCache) -> list[CacheEntry]:
    """The published entries, least recently used first."""
    found = []
    for e in cache.layout.names("data"):
        try:
            st = e.stat()
        except FileNotFoundError:
            continue
        record = cache.layout.read_record(cache.layout.meta(e.name))
        found.append(CacheEntry(
            name=e.name, path=e.path, url=record.url if record else "?", size=st.st_size,
            version=record.version if record else None, last_used=st.st_mtime))
    return sorted(found, key=lambda entry: (entry.last_used, entry.name))


def usage(cache: ShardCache) -> CacheUsage:
    """How many entries and bytes the cache holds, and its live downloads (those of processes
    that died are not counted: the next look at the cache removes them)."""
    published = entries(cache)
    downloads = []
    for e in cache.layout.names("partial"):
        record = cache.layout.read_record(e.path) if e.name.endswith(".json") else None
        if record is not None and not cache.layout.lock_free(e.name[:-5]):
            downloads.append(record)
    return CacheUsage(entries=len(published), bytes=sum(e.size for e in published),
                      downloads=len(downloads), download_bytes=sum(r.size for r in downloads),
                      limit=cache.max_bytes,
                      charged=sum(footprint(e.size) for e in published))


def verify(cache: ShardCache, *, remove: bool = True) -> tuple[int, list[Problem]]:
    """Re-read every entry not being filled against its record (key, size, CRC-32); wrong ones
    are removed unless ``remove=False``. Returns how many were checked, and the problems."""
    checked, problems = 0, []
    for entry in entries(cache):
        lock = cache.layout.try_lock(entry.name)
        if lock is None:
            continue
        try:
            why = _problem(cache, entry)
            checked += 1
            if why:
                if remove:
                    unlink(cache.layout.data(entry.name))
                    unlink(cache.layout.meta(entry.name))
                problems.append(Problem(entry.name, entry.url, why, remove))
        finally:
            cache.layout.unlock(lock, entry.name)
    return checked, problems


def _problem(cache: ShardCache, entry: CacheEntry) -> str:
    record = cache.layout.read_record(cache.layout.meta(entry.name))
    problem = check_record(record, entry.size, cache.layout.key_of(entry.name))
    if problem or record is None:
        return problem
    crc, checksum = 0, crc32()
    try:
        with open(entry.path, "rb") as f:
            while chunk := f.read(4 * 2**20):
                crc = checksum(chunk, crc)
    except FileNotFoundError:
        return ""
    if record.crc32 is not None and crc != record.crc32:
        return f"CRC-32 {crc:08x}, {record.crc32:08x} recorded"
    return ""


def prune(cache: ShardCache, to: int) -> tuple[list[str], int]:
    """Evict least-recently-used entries not in use until the cache holds at most ``to``
    bytes; the names evicted and the bytes still charged."""
    evicted = []
    with cache.layout.admission():
        found = entries(cache)
        used = sum(footprint(e.size) for e in found)
        for entry in found:
            if used <= to:
                break
            freed = cache.evict(entry.name)
            if freed:
                evicted.append(entry.name)
                used -= freed
    return evicted, used


def clear(cache: ShardCache) -> tuple[int, int, int]:
    """Remove downloads of dead processes (:func:`recover`), then every entry not in use; how
    many entries were removed and kept, and how many downloads were recovered."""
    recovered = recover(cache)
    evicted, _ = prune(cache, 0)
    return len(evicted), len(entries(cache)), recovered


def recover(cache: ShardCache) -> int:
    """Remove what dead processes left: downloads (counted), orphaned records, lock files and
    temporary files. Returns how many downloads were removed."""
    lay = cache.layout
    lay.ensure()
    removed = 0
    for name in {e.name.removesuffix(".json") for e in lay.names("partial")}:
        lock = lay.try_lock(name)
        if lock is not None:
            lay.drop_partial(name)
            lay.unlock(lock, name, remove=not os.path.exists(lay.data(name)))
            removed += 1
    for e in lay.names("meta"):
        name = e.name.removesuffix(".json")
        if not os.path.exists(lay.data(name)):
            lock = lay.try_lock(name)
            if lock is not None:
                unlink(e.path)
                lay.unlock(lock, name, remove=True)
    for e in lay.names("locks"):
        name = e.name.removesuffix(".lock")
        if e.name != "cache.lock" and not os.path.exists(lay.data(name)):
            lock = lay.try_lock(name)
            if lock is not None:
                lay.unlock(lock, name, remove=not os.path.exists(lay.part_record(name)))
    for sub in ("data", "meta", "partial"):
        with os.scandir(os.path.join(lay.root, sub)) as it:
            for e in it:
                if e.name.endswith(".tmp") and not _alive(e.name):
                    unlink(e.path)
    return removed


def _alive(tmp_name: str) -> bool:
    """Whether the process that wrote ``<file>.<pid>-<thread>.tmp`` is still running."""
    try:
        pid = int(tmp_name.rsplit(".", 2)[-2].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
