"""The counters of remote transfers: :func:`io_stats` and what adds to them.

They are **per process**: a DataLoader worker counts in its own copy (starting from what its
parent had counted when it was forked). :func:`report_io_to` has a process also add its
counts to shared memory that another process reads: ``WebLoader(...).io_stats()`` gives each
of its workers a slot of a ``multiprocessing.RawArray`` this way and sums them. The attempt loop
of :mod:`wds_cloud.stores.retry` counts requests, retries and failures; the streams count bytes
and uploads; the router cache hits.

A spec's sources are counted apart as well (:func:`source_stats`): a thread opening a shard of
source ``s`` does it within :func:`reading_for` ``(s)``, and the transfer it starts (its
:class:`~wds_cloud.stores.retry.Retrier`, whichever thread later reads) counts for ``s``; the
mix tells the samples each source gave (:func:`count_samples`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, MutableSequence, Sequence
from dataclasses import asdict, dataclass, fields

from ..io.forks import ForkSafeLock

__all__ = ["IO_FIELDS", "SOURCE_FIELDS", "IOStats", "count_io", "count_samples",
           "count_source", "current_source", "io_stats", "reading_for", "reading_metadata",
           "report_io_to", "reset_io_stats", "source_stats", "with_gets_per_shard"]


@dataclass
class IOStats:
    """Counters of this process's remote transfers (a snapshot from :func:`io_stats`):
    ``requests`` made (reads, uploads, listings and lookups), ``retries`` after a transient
    failure, ``resumes`` of a read where it stopped, ``bytes_read``, ``failures`` (transfers
    given up), ``uploads`` committed, ``shards`` opened for reading at a store (a shard opened
    ahead counts, read or not) and the ``gets`` their reads took (the first GET of each, its
    retries and resumes)."""

    requests: int = 0
    retries: int = 0
    resumes: int = 0
    bytes_read: int = 0
    failures: int = 0
    uploads: int = 0
    #: shards served by the shard cache without a request to the store
    cache_hits: int = 0
    #: remote shard reads started, and their GETs (the first, then one per resume or retry)
    shards: int = 0
    gets: int = 0


#: the counters' names, in the order :func:`report_io_to` lays them out
IO_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(IOStats))
_IO_INDEX = {name: i for i, name in enumerate(IO_FIELDS)}
#: what is counted per source of a spec (:func:`source_stats`): samples given by the mix,
#: shards opened, and the transfers of those shards
SOURCE_FIELDS: tuple[str, ...] = ("samples", "shards", "requests", "bytes_read", "cache_hits",
                                  "retries", "resumes", "failures")
_SOURCE_INDEX = {name: i for i, name in enumerate(SOURCE_FIELDS)}
_by_source: dict[str, list[int]] = {}
#: what this thread reads: .source, the source whose shard it opens (reading_for);
#: .metadata, a dataset's metadata rather than shards (reading_metadata)
_reading = threading.local()

_stats = IOStats()
_stats_lock = ForkSafeLock()  # (a forked child gets its own)
_counting = threading.local()  # .later: counts made while this thread counts (see _count)
#: where this process adds its counts as well (:func:`report_io_to`): shared slots, first
#: index, and the first index of each source's counters
_report: tuple[MutableSequence[int], int, dict[str, int]] | None = None


def count_io(source: str | None = None, **increments: int) -> None:
    """Add ``increments`` to the counters of :func:`io_stats` (``bytes_read=n``, ...) and,
    with ``source`` (a spec source's name), to that source's (:func:`source_stats`)."""
    _count(source, increments, process=True)


def count_source(source: str, **increments: int) -> None:
    """Add ``increments`` to the counters of ``source`` alone (``samples``, ``shards`` opened
    from any store or the cache: :data:`SOURCE_FIELDS`), not to :func:`io_stats`'s."""
    _count(source, increments, process=False)


def reading_metadata() -> contextlib.AbstractContextManager[None]:
    """What this thread reads meanwhile is a dataset's metadata (Energon's ``.nv-meta``
    files), not shards: its requests and bytes count, as ``shards`` and their ``gets`` it
    does not (``gets_per_shard`` stays about shards)."""
    return _reading_as("metadata", True)


_NOT_METADATA = ("shards", "gets")


def _count(source: str | None, increments: dict[str, int], *, process: bool) -> None:
    if getattr(_reading, "metadata", None) and any(k in increments for k in _NOT_METADATA):
        increments = {k: n for k, n in increments.items() if k not in _NOT_METADATA}
    later = getattr(_counting, "later", None)
    if later is not None:  # this thread holds the lock (see _locked): added on its way out
        later.append((source, increments, process))
        return
    with _locked():
        _add(source, increments, process)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Holds the counters' lock. A count this thread makes meanwhile (the garbage collector
    closed a reader at an allocation in here, and the reader's ``finally`` counted) is added
    on the way out, rather than waiting for the lock this thread holds."""
    with _stats_lock:
        later: list[tuple[str | None, dict[str, int], bool]] = []
        _counting.later = later
        try:
            yield
            while later:
                _add(*later.pop(0))
        finally:
            _counting.later = None


def _add(source: str | None, increments: dict[str, int], process: bool) -> None:
    """:func:`_count`'s additions, under its lock."""
    if process:
        for name, n in increments.items():
            setattr(_stats, name, getattr(_stats, name) + n)
    if source is not None:
        mine = _by_source.get(source)
        if mine is None:
            mine = _by_source[source] = [0] * len(SOURCE_FIELDS)
        for name, n in increments.items():
            if name in _SOURCE_INDEX:
                mine[_SOURCE_INDEX[name]] += n
    if _report is not None:
        slots, first, sources = _report
        if process:
            for name, n in increments.items():
                slots[first + _IO_INDEX[name]] += n
        at = sources.get(source) if source is not None else None
        if at is not None:
            for name, n in increments.items():
                if name in _SOURCE_INDEX:
                    slots[at + _SOURCE_INDEX[name]] += n


def count_samples(names: Sequence[str], counts: Sequence[int]) -> None:
    """Count ``counts[i]`` samples given by the source ``names[i]``: a spec mix's ``count``."""
    for name, n in zip(names, counts, strict=True):
        if n:
            count_source(name, samples=n)


def current_source() -> str | None:
    """The spec source whose shard this thread is opening (:func:`reading_for`), if any: a
    transfer started now counts for it."""
    source: str | None = getattr(_reading, "source", None)
    return source


def reading_for(source: str) -> contextlib.AbstractContextManager[None]:
    """Within: this thread opens a shard of ``source`` (transfers it starts count for it)."""
    return _reading_as("source", source)


@contextlib.contextmanager
def _reading_as(name: str, value: object) -> Iterator[None]:
    """``_reading.<name>`` is ``value`` within, for this thread; as it was after."""
    before = getattr(_reading, name, None)
    setattr(_reading, name, value)
    try:
        yield
    finally:
        setattr(_reading, name, before)


def source_stats() -> dict[str, dict[str, int]]:
    """Per spec source, what **this process** counted (:data:`SOURCE_FIELDS`): samples the
    mix gave, shards opened, their requests, bytes read, cache hits, retries, resumes and
    failures. ``WebLoader(...).stats()`` sums them over its workers (and ranks)."""
    with _locked():
        return {name: dict(zip(SOURCE_FIELDS, counts, strict=True))
                for name, counts in _by_source.items()}


def io_stats() -> dict[str, float]:
    """Requests, retries, resumes, bytes read, failures, uploads, shard-cache hits, remote shard
    reads started (``shards``) and their GETs of **this process** so far (ints), and
    ``gets_per_shard`` (``gets / shards``; 0.0 before any): a shard costs one GET, and one
    more for each resume or retry of its read.

    Counters are per process: what DataLoader workers did is counted in the workers, not
    here. ``WebLoader(...).io_stats()`` sums what its workers did (see :func:`report_io_to`).
    """
    with _locked():
        return with_gets_per_shard(asdict(_stats))


def with_gets_per_shard(counts: dict[str, int]) -> dict[str, float]:
    """``counts`` (of :data:`IO_FIELDS`) with ``gets_per_shard`` added."""
    out: dict[str, float] = dict(counts)
    out["gets_per_shard"] = counts["gets"] / counts["shards"] if counts["shards"] else 0.0
    return out


def report_io_to(slots: MutableSequence[int] | None, first: int = 0,
                 sources: Sequence[str] = ()) -> None:
    """From now on, also add this process's counts to ``slots[first + i]`` (``i`` the index of
    the counter in :data:`IO_FIELDS`), e.g. a ``multiprocessing.RawArray("q", ...)`` that the
    parent of a DataLoader worker reads; ``None`` stops it. The counters of source
    ``sources[k]`` (:data:`SOURCE_FIELDS`) follow: from ``first + len(IO_FIELDS) + k *
    len(SOURCE_FIELDS)``. Counts made before are not added: a forked worker starts with its
    parent's counters, which are not its own. Each process must have slots of its own (no
    lock guards them across processes)."""
    global _report
    start = first + len(IO_FIELDS)
    at = {name: start + k * len(SOURCE_FIELDS) for k, name in enumerate(sources)}
    with _locked():
        _report = None if slots is None else (slots, first, at)


def reset_io_stats() -> None:
    """Zero the counters of :func:`io_stats`."""
    global _stats
    with _locked():
        _stats = IOStats()
        _by_source.clear()
