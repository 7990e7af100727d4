"""Packing a directory into tar shards, in parallel and reproducibly.

Three steps, each usable on its own: :func:`scan_directory` groups the files into samples
(webdataset's rule, as every reader applies it: the key of ``dir/sub/a.b.c`` is ``sub/a``, the
part of the relative path up to the basename's first dot, and its field is ``b.c``);
:func:`plan_shards` cuts the samples, sorted by key, into shards from the files' sizes alone
(``maxcount`` samples, tar files of ``maxsize`` bytes at most; a sample is never split, and
one larger than ``maxsize`` gets a shard of its own, as :class:`~wds_cloud.ShardWriter` does);
:func:`write_shards` writes each planned shard as an independent task on an executor. The
members of a sample are written sorted by name, through :class:`~wds_cloud.TarWriter` (fixed
mtime, owner and gzip header): the same files give the same bytes whatever the number of
workers or the executor. Outputs are written atomically (a temporary file renamed, or an
object uploaded once complete): a failed shard leaves nothing behind.

Left out of every sample, and reported in :attr:`DirectoryScan.skipped`: hidden files and
directories (a name starting with ``.``), files whose basename has no dot (no field: readers
would drop them) and names readers skip as metadata (``__*__`` at the top). Symbolic links
to files are followed; links to directories are not.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError, OpenError
from ..settings import Settings, parse_size
from ..tar.header import FORMATS, HeaderBuilder, padding
from ..tar.samples import base_plus_ext
from ..urls import split_scheme
from .executors import run_tasks, task_settings, where_workers_see
from .report import RunReport, ShardDone, ShardReport, shard_callback

__all__ = [
    "DirectoryScan",
    "SampleFiles",
    "ShardPlan",
    "create_shards",
    "plan_shards",
    "scan_directory",
    "shard_names",
    "tar_file_size",
    "write_shard",
    "write_shards",
]

log = logging.getLogger(__name__)

#: names readers skip as webdataset metadata (tar.samples' default ``skip_meta``)
_READER_META = re.compile(r"__[^/]*__($|/)")
#: TarWriter's header fields (user, group, mode, mtime): header sizes depend on none of them
_HEADERS = HeaderBuilder(user="bigdata", group="bigdata", mode=0o444, mtime=0,
                         fmt=str(FORMATS[None]))
_END = 2 * 512  # the two zero blocks that end an archive
_RECORD = 10240  # archives are padded to whole records


@dataclass(frozen=True)
class SampleFiles:
    """One sample to pack: its key and its files ``(field, path, size)`` sorted by field."""

    key: str
    files: tuple[tuple[str, str, int], ...]

    @property
    def tar_size(self) -> int:
        """Bytes its members take in a tar: headers and payloads padded to 512 bytes."""
        return sum(member_size(f"{self.key}.{name}", size) for name, _, size in self.files)


def member_size(name: str, size: int) -> int:
    """Bytes a member ``name`` of ``size`` bytes takes in a tar written by TarWriter."""
    headers = _HEADERS.member(name.encode("utf-8", "surrogateescape"), size)
    return sum(map(len, headers)) + size + len(padding(size))


@dataclass
class DirectoryScan:
    """A directory's samples, sorted by key, and the files left out, by reason: ``hidden``
    (files and directories, with a trailing ``/``), ``no_extension``, ``reserved``."""

    root: str
    samples: list[SampleFiles] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    @property
    def files(self) -> int:
        return sum(len(s.files) for s in self.samples)

    def describe_skipped(self) -> str:
        """``2 hidden, 1 without an extension`` (``nothing left out`` if none)."""
        words = {"hidden": "hidden", "no_extension": "without an extension",
                 "reserved": "with a reserved __name__"}
        parts = [f"{len(v)} {words.get(k, k)}" for k, v in self.skipped.items() if v]
        return ", ".join(parts) + " left out" if parts else "nothing left out"


def _walk(root: str, rel: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """``(relative path, entry)`` of everything under ``root``, in name order; hidden
    directories are yielded but not entered."""
    with os.scandir(os.path.join(root, rel) if rel else root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        yield path, entry
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            yield from _walk(root, path)


def scan_directory(root: str | os.PathLike[str]) -> DirectoryScan:
    """Group the files under ``root`` into samples (see the module docstring). Two files of a
    sample whose fields differ only in case (``a.JPG``, ``a.jpg``) are a :class:`ConfigError`:
    readers lower-case fields, so they would meet the same field twice."""
    given = os.fspath(root)
    root = os.path.abspath(given)
    if not os.path.isdir(root):
        what = "does not exist" if not os.path.exists(root) else "is not a directory"
        raise ConfigError(f"{given!r} {what}; give the directory of files to pack")
    scan = DirectoryScan(root, skipped={"hidden": [], "no_extension": [], "reserved": []})
    groups: dict[str, dict[str, tuple[str, str, int]]] = {}
    clashes: list[str] = []
    for rel, entry in _walk(root):
        if entry.name.startswith("."):
            scan.skipped["hidden"].append(rel + ("/" if entry.is_dir() else ""))
            continue
        if not entry.is_file():
            continue
        key, name = base_plus_ext(rel)
        if key is None or name is None:
            scan.skipped["no_extension"].append(rel)
            continue
        if _READER_META.match(rel):
            scan.skipped["reserved"].append(rel)
            continue
        fields = groups.setdefault(key, {})
        seen = fields.get(name.lower())
        if seen is not None:
            clashes.append(f"{key}.{seen[0]} and {rel}")
            continue
        fields[name.lower()] = (name, entry.path, entry.stat().st_size)
    if clashes:
        raise ConfigError(
            f"in {root!r}: readers lower-case field names, so these files would be the same "
            f"field of one sample: {'; '.join(clashes[:5])}; rename one of each")
    for key in sorted(groups, key=_name_order):
        files = sorted(groups[key].values(), key=lambda f: _name_order(f[0]))
        scan.samples.append(SampleFiles(key, tuple(files)))
    return scan


def _name_order(name: str) -> bytes:
    """Names sort as their bytes do (``tar --sort=name``)."""
    return name.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its number, URL and samples, and its planned ``size`` in bytes
    (the whole tar file)."""

    index: int
    url: str
    samples: tuple[SampleFiles, ...]
    size: int


def shard_names(pattern: str, count: int, start: int = 0) -> list[str]:
    """``pattern % i`` for the ``count`` shards from ``start``; a pattern without a ``%d``
    field names a single shard. A :class:`ConfigError` when that does not give ``count``
    distinct file names."""
    if pattern.endswith("/"):
        raise ConfigError(f"output pattern {pattern!r} names a directory; give shard file "
                          f"names, e.g. '{pattern}shard-%06d.tar'")
    if count == 1 and "%" not in pattern:
        return [pattern]
    try:
        names = [pattern % i for i in range(start, start + count)]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"output pattern {pattern!r} must have one %d-style field for the "
                          f"shard number, e.g. 'out/train-%06d.tar' ({count} shards to write)"
                          ) from exc
    if len(set(names)) != len(names):
        raise ConfigError(f"output pattern {pattern!r} gives the same name to different "
                          "shards; add a %d-style field, e.g. 'out/train-%06d.tar'")
    return names


def plan_shards(samples: Sequence[SampleFiles], pattern: str, *, maxcount: int = 10000,
                maxsize: float = 1e9, start: int = 0) -> list[ShardPlan]:
    """Cut ``samples`` (in order) into shards named ``pattern % number`` from ``start``: a new
    shard starts when the current one holds ``maxcount`` samples, or when the next sample
    would make its tar file larger than ``maxsize`` bytes (ShardWriter's rule, counting the
    end of the archive too); a sample alone larger than that gets a shard of its own."""
    if maxcount < 1 or maxsize <= 0:
        raise ConfigError(f"maxcount ({maxcount}) and maxsize ({maxsize}) must be positive")
    groups: list[list[SampleFiles]] = []
    sizes: list[int] = []
    for sample in samples:
        size = sample.tar_size
        if not groups or len(groups[-1]) >= maxcount \
                or tar_file_size(sizes[-1] + size) > maxsize:
            groups.append([])
            sizes.append(0)
        groups[-1].append(sample)
        sizes[-1] += size
    names = shard_names(pattern, len(groups), start)
    return [ShardPlan(start + i, name, tuple(group), tar_file_size(size))
            for i, (name, group, size) in enumerate(zip(names, groups, sizes, strict=True))]


def tar_file_size(members: int) -> int:
    """Bytes of a tar file whose members take ``members`` bytes (with the end blocks and the
    padding to whole records)."""
    end = members + _END
    return end + (-end % _RECORD)


@dataclass(frozen=True)
class _WriteJob:
    plan: ShardPlan
    storage_options: dict[str, Any]
    settings: Settings


def write_shard(plan: ShardPlan, *, storage_options: dict[str, Any] | None = None,
                settings: Settings | None = None) -> ShardDone:
    """Write the shard ``plan`` describes (a task: runs in any process that sees the files).
    A file whose size changed since it was scanned fails the shard: the plan no longer holds."""
    from ..tar.writer import TarWriter

    with TarWriter(plan.url, encoder=False, storage_options=storage_options,
                   settings=settings) as sink:
        for sample in plan.samples:
            record: dict[str, Any] = {"__key__": sample.key}
            for name, path, size in sample.files:
                with open(path, "rb") as f:
                    data = f.read()
                if len(data) != size:
                    raise OpenError(f"{path!r} changed while the shards were written ({size} "
                                    f"bytes when scanned, {len(data)} now); run again",
                                    url=path)
                record[name] = data
            sink.write(record)
        members = sink.offset
    return ShardDone(plan.url, len(plan.samples), tar_file_size(members))


def _run_write(job: _WriteJob) -> ShardDone:
    return write_shard(job.plan, storage_options=job.storage_options, settings=job.settings)


def write_shards(plans: Sequence[ShardPlan], *, executor: Any = None, retries: int = 2,
                 storage_options: dict[str, Any] | None = None,
                 settings: Settings | None = None,
                 on_shard: Callable[[ShardReport], None] | None = None) -> RunReport:
    """Write each planned shard as a task on ``executor`` (see :func:`run_tasks`); local
    output directories are made first. The report has every shard, written or failed."""
    started = time.perf_counter()
    for plan in plans:
        if not split_scheme(plan.url)[0]:
            os.makedirs(os.path.dirname(os.path.abspath(plan.url)), exist_ok=True)
    settings = task_settings(settings)
    jobs = [(p.url, _WriteJob(replace(p, url=where_workers_see(p.url)),
                              dict(storage_options or {}), settings)) for p in plans]
    outcomes = run_tasks(_run_write, jobs, executor=executor, retries=retries,
                         on_outcome=shard_callback(on_shard, {p.url: (p.url, None)
                                                              for p in plans}))
    shards = [ShardReport.of(p.url, None, o) for p, o in zip(plans, outcomes, strict=True)]
    return RunReport(shards, time.perf_counter() - started)


def create_shards(
    source: str | os.PathLike[str], pattern: str, *, maxcount: int = 10000,
    maxsize: float | str = 1e9, executor: Any = None, retries: int = 2,
    storage_options: dict[str, Any] | None = None, start: int = 0,
    on_shard: Callable[[ShardReport], None] | None = None,
) -> RunReport:
    """Pack the files under the directory ``source`` into tar shards ``pattern % number``
    (local paths or ``s3://``, ``gs://``, ``az://`` URLs; ``.tar.gz`` names are compressed):
    files sharing a key form a sample, samples sorted by key, ``maxcount`` samples per shard
    and tar files of ``maxsize`` bytes (``1e9``, ``"500MiB"``) at most.

    Each shard is a task on ``executor``: None (this process, one shard after the other), a
    ``concurrent.futures`` thread or process pool, or a Dask ``distributed.Client`` (its
    workers must see ``source`` at the same path). A failed shard is tried ``retries`` more
    times; the shards are the same bytes whatever the executor. Returns the
    :class:`RunReport` (``skipped``: the files left out, by reason, also logged); raises
    :class:`~wds_cloud.errors.ShardTaskError` naming the shards that failed, after writing
    all the others."""
    scan = scan_directory(source)
    if not scan.samples:
        raise ConfigError(f"no files to pack in {os.fspath(source)!r} ({scan.describe_skipped()})")
    if any(scan.skipped.values()):
        log.warning("%s: %s: %s", scan.root, scan.describe_skipped(),
                    ", ".join(n for names in scan.skipped.values() for n in names[:5]))
    size = parse_size(maxsize, name="maxsize") if isinstance(maxsize, str) else maxsize
    plans = plan_shards(scan.samples, pattern, maxcount=maxcount, maxsize=size, start=start)
    report = write_shards(plans, executor=executor, retries=retries,
                          storage_options=storage_options, on_shard=on_shard)
    report.skipped = scan.skipped
    return report.raise_for_failures()
