"""The counters of remote transfers: :func:`io_stats` and what adds to them.

They are **per process**: a DataLoader worker counts in its own copy (starting from what its
parent had counted when it was forked). :func:`report_io_to` has a process also add its
counts to shared memory that another process reads: ``WebLoader(...).io_stats()`` gives each
of its workers a slot of a ``multiprocessing.RawArray`` this way and sums them. The attempt loop
of :mod:`wds_cloud.stores.retry` counts requests, retries and failures; the streams count bytes
and uploads.
"""

from __future__ import annotations

import threading
from collections.abc import MutableSequence
from dataclasses import asdict, dataclass, fields

__all__ = ["IO_FIELDS", "IOStats", "count_io", "io_stats", "report_io_to", "reset_io_stats",
           "with_gets_per_shard"]


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
    shards: int = 0
    gets: int = 0


#: the counters' names, in the order :func:`report_io_to` lays them out
IO_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(IOStats))

_stats = IOStats()
_stats_lock = threading.Lock()
#: where this process adds its counts as well (:func:`report_io_to`): shared slots, first index
_report: tuple[MutableSequence[int], int] | None = None


def count_io(**increments: int) -> None:
    """Add ``increments`` to the counters of :func:`io_stats` (``bytes_read=n``, ...)."""
    with _stats_lock:
        for name, n in increments.items():
            setattr(_stats, name, getattr(_stats, name) + n)
        if _report is not None:
            slots, first = _report
            for name, n in increments.items():
                slots[first + IO_FIELDS.index(name)] += n


def io_stats() -> dict[str, float]:
    """Requests, retries, resumes, bytes read, failures, uploads, shards opened and their GETs
    of **this process** so far (ints), and ``gets_per_shard`` (``gets / shards``; 0.0 before
    any): a shard costs one GET, and one more for each resume or retry of its read.

    Counters are per process: what DataLoader workers did is counted in the workers, not
    here. ``WebLoader(...).io_stats()`` sums what its workers did (see :func:`report_io_to`).
    """
    with _stats_lock:
        return with_gets_per_shard(asdict(_stats))


def with_gets_per_shard(counts: dict[str, int]) -> dict[str, float]:
    """``counts`` (of :data:`IO_FIELDS`) with ``gets_per_shard`` added."""
    out: dict[str, float] = dict(counts)
    out["gets_per_shard"] = counts["gets"] / counts["shards"] if counts["shards"] else 0.0
    return out


def report_io_to(slots: MutableSequence[int] | None, first: int = 0) -> None:
    """From now on, also add this process's counts to ``slots[first + i]`` (``i`` the index of
    the counter in :data:`IO_FIELDS`), e.g. a ``multiprocessing.RawArray("q", ...)`` that the
    parent of a DataLoader worker reads; ``None`` stops it. Counts made before are not added:
    a forked worker starts with its parent's counters, which are not its own. Each process
    must have slots of its own (no lock guards them across processes)."""
    global _report
    with _stats_lock:
        _report = None if slots is None else (slots, first)


def reset_io_stats() -> None:
    """Zero the counters of :func:`io_stats`."""
    global _stats
    with _stats_lock:
        _stats = IOStats()
