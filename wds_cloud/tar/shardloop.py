"""Tar shards to samples in one loop that keeps its place: :func:`samples_from_shards` (what
``tarfile_to_samples`` and ``WebDataset`` use) and its :class:`ShardCursor`.

The loop opens, parses and groups (what webdataset's ``url_opener | tar_file_expander |
group_by_keys`` do, with the grouping, handler and damage rules of :mod:`.samples`), and the
cursor records where each sample lies, for resumable state.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable, Iterator
from typing import Any, BinaryIO

from ..handlers import Handler, reraise_exception
from ..urls import redact
from .reader import Following, Marks, Member, member_start
from .samples import (
    _META,
    OpenStream,
    Renamer,
    Sample,
    Selector,
    _batches,
    _duplicate,
    _hooks,
    _is_meta,
    _open_error,
    _Outcome,
    _split_path,
    _url_of,
    valid_sample,
)

__all__ = ["ShardCursor", "samples_from_shards"]

log = logging.getLogger(__name__)


class ShardCursor:
    """Where a reader of shards stands, for resumable state (kept by
    :func:`samples_from_shards` when given one).

    ``started``: shard items taken from the source (failed ones too); ``url`` and ``version``
    (ETag, generation; ``""`` if unknown) of the shard being read; ``ordinal``: its samples
    yielded so far; ``done``: it has no more samples (the next comes from the next shard).
    :meth:`next_offset` is where the next sample of the shard begins and :meth:`last` where the
    last yielded one lies, as byte offsets in the tar bytes (``-1`` when they cannot be read
    from an offset: a compressed shard). An item ``{"url", "offset", "ordinal"}`` resumes a
    shard: the stream is opened at ``offset`` (``open_stream(url, offset=...)``) when there
    is one, else from the start, skipping ``ordinal`` samples.
    """

    __slots__ = ("_at", "_base", "_prev", "done", "marks", "ordinal", "started", "url",
                 "version")

    def __init__(self) -> None:
        self.started = 0
        self.url = ""
        self.version = ""
        self.ordinal = 0
        self.done = True
        self.marks: list[Marks] = [(0, 0, [], False)]
        self._at: tuple[Marks, list[Member], int] | int = 0
        self._prev: tuple[Marks, list[Member], int] | int = 0
        self._base = 0  # where the stream began in the shard: the reader counts from there

    def begin(self, url: str, version: str, base: int, ordinal: int) -> None:
        """A shard starts (at byte ``base``, after ``ordinal`` samples)."""
        self.url, self.version, self.ordinal, self.done = url, version, ordinal, False
        self._at = self._prev = self._base = base

    def boundary(self, batch: list[Member], j: int) -> None:
        """The sample about to be yielded ends where member ``j`` of ``batch`` begins."""
        self._prev, self._at = self._at, (self.marks[0], batch, j)
        self.ordinal += 1

    def boundary_at(self, offset: int) -> None:
        """The sample about to be yielded ends at byte ``offset`` of the stream (-1:
        unknown)."""
        self._prev, self._at = self._at, offset if offset < 0 else self._base + offset
        self.ordinal += 1

    def finish(self) -> None:
        """The shard's last sample is about to be yielded."""
        self._prev, self._at = self._at, -1
        self.ordinal += 1
        self.done = True

    def _resolve(self, at: tuple[Marks, list[Member], int] | int) -> int:
        if isinstance(at, int):
            return at
        marks, batch, j = at  # (the marks count from where the stream began)
        return -1 if marks[3] else self._base + member_start(marks, batch, j)

    def next_offset(self) -> int:
        """Where the next sample of this shard begins (-1: unknown, or none)."""
        return -1 if self.done else self._resolve(self._at)

    def last(self) -> tuple[int, int]:
        """``(ordinal, byte offset)`` of the sample yielded last (offset -1 if unknown)."""
        return self.ordinal - 1, self._resolve(self._prev)


def samples_from_shards(
    src: Iterable[dict[str, Any]], handler: Handler = reraise_exception,
    select_files: Selector | None = None, rename_files: Renamer | None = None, *,
    open_stream: OpenStream, cursor: ShardCursor | None = None, zero_copy: bool = False,
) -> Iterator[Sample]:
    """Samples from the tar shards ``{"url": ...}`` of ``src``: open, parse and group in one
    loop (what webdataset's url_opener | tar_file_expander | group_by_keys do).

    Each stream is closed when its shard is done, on error, and when the consumer stops.
    ``cursor`` keeps the position (see :class:`ShardCursor`), and items with ``offset`` or
    ``ordinal`` resume a shard there. ``zero_copy``: the members of local and cached shards
    (memory-mapped) are ``memoryview`` slices of the map, not ``bytes`` (see
    :func:`~wds_cloud.tar.reader.iter_member_batches`).
    """
    for source in src:
        url = _url_of(source)
        offset, skip = _resume_point(source)
        if cursor is not None:
            cursor.started += 1
        try:
            stream = open_stream(url, offset=offset) if offset > 0 else open_stream(url)
        except Exception as exn:
            if handler(_open_error(exn, url)):
                continue
            return
        try:
            if cursor is not None:
                cursor.begin(url, str(getattr(stream, "version", None) or ""), offset, skip)
                if _changed(source, cursor.version, url):  # reseeding: read it from its start
                    stream.close()
                    stream = open_stream(url)
                    offset = skip = 0
                    cursor.begin(url, str(getattr(stream, "version", None) or ""), 0, 0)
            samples = _shard_samples(stream, url, handler, select_files, rename_files, cursor,
                                     zero_copy, resumed=offset > 0)
            if skip and offset <= 0:
                samples = _skipping(samples, skip, cursor)
            go_on = yield from samples
        finally:
            stream.close()
        if not go_on:
            return


def _resume_point(source: Any) -> tuple[int, int]:
    """``(byte offset, samples before it)`` where an item resumes its shard (0, 0: start)."""
    if not isinstance(source, dict):
        return 0, 0
    return int(source.get("offset", 0) or 0), int(source.get("ordinal", 0) or 0)


def _changed(source: Any, version: str, url: str) -> bool:
    """Whether a resumed shard changed since its state was saved: a
    :class:`~wds_cloud.errors.ResumeError`, or True (after a WARNING) when the item says
    ``reseed``."""
    want = source.get("version") if isinstance(source, dict) else None
    if not (want and version and want != version):
        return False
    message = (f"{redact(url)} changed since the state was saved (version {want!r} then, "
               f"{version!r} now)")
    if source.get("reseed"):
        log.warning("%s; reading it from its start (on_mismatch='reseed')", message)
        return True
    from ..errors import ResumeError

    raise ResumeError(message + "; load the state with on_mismatch='reseed' to go on",
                      field="version")


def _skipping(samples: Generator[Sample, None, bool], skip: int,
              cursor: ShardCursor | None) -> Generator[Sample, None, bool]:
    """``samples`` without the first ``skip`` (a shard resumed by re-reading its start)."""
    if cursor is not None:
        cursor.ordinal = 0
    for _ in range(skip):
        try:
            next(samples)
        except StopIteration as stop:
            return bool(stop.value)
    return (yield from samples)


def _shard_samples(
    stream: BinaryIO, url: str, handler: Handler, select_files: Selector | None,
    rename_files: Renamer | None, cursor: ShardCursor | None = None, zero_copy: bool = False,
    *, resumed: bool = False,
) -> Generator[Sample, None, bool]:
    """The fused loop for one shard (``resumed``: its stream starts mid-archive); returns
    False when the handler says stop."""
    local_path = getattr(stream, "local_path", None)
    hooks = select_files is not None or rename_files is not None
    current: Sample = {}
    key: str | None = None
    outcome = _Outcome()
    marks = None if cursor is None else cursor.marks
    following: Following = [None]
    # the handler sees a read error only once the sample complete before it is out
    for batch in _batches(stream, url, None, outcome, marks, None if hooks else following,
                          zero_copy, resumed):
        for j, (name, data) in enumerate(batch):
            if name.startswith("__") and _is_meta(name, _META):
                continue
            if hooks:
                new, outcome.go_on = _hooks(name, url, handler, select_files, rename_files)
                if new is None:
                    if outcome.go_on:
                        continue
                    break
                name = new
            if "/" not in name:  # key = up to the first dot (which must not be the first char)
                prefix, dot, suffix = name.partition(".")
                if not (prefix and dot):
                    continue
            else:
                split = _split_path(name)
                if split is None:
                    continue
                prefix, suffix = split
            suffix = suffix.lower()
            if prefix != key:
                # (empty after an early hand-on; valid_sample's check, inlined: hot loop)
                if current and not current.get("__bad__", False):
                    if cursor is not None:
                        cursor.boundary(batch, j)
                    yield current
                key = prefix
                current = {"__key__": prefix, "__url__": url}
                if local_path is not None:
                    current["__local_path__"] = local_path
            if suffix in current:
                outcome.go_on = bool(handler(_duplicate(url, name, suffix, prefix)))
                if outcome.go_on:
                    continue
                break
            current[suffix] = data
        if not outcome.go_on:
            break
        if following[0] is not None and current and _key(following[0][0]) not in (key, None):
            if valid_sample(current):  # the next member starts another sample: hand it on now
                if cursor is not None:
                    cursor.boundary_at(following[0][1])
                yield current
            current, key = {}, None
    # A sample still open when damage cut the shard short may lack members that were lost:
    # unlike webdataset, it is dropped rather than passed on as if complete, unless the damage
    # is in a member of the next sample.
    if valid_sample(current) and (not outcome.damaged or _ends_before(
            outcome.broken, key, select_files, rename_files)):
        if cursor is not None:
            cursor.finish()
        yield current
    elif cursor is not None:
        cursor.done = True
    return outcome.handle(handler)


def _key(name: str) -> str | None:
    """The key grouping gives member ``name`` (None: a member it skips)."""
    if name.startswith("__") and _is_meta(name, _META):
        return None
    if "/" not in name:
        prefix, dot, _ = name.partition(".")
        return prefix if prefix and dot else None
    split = _split_path(name)
    return None if split is None else split[0]


def _ends_before(broken: str | None, key: str | None, select_files: Selector | None,
                 rename_files: Renamer | None) -> bool:
    """Whether the sample ``key`` was complete when the shard broke in member ``broken``:
    that member, as grouping would have seen it, starts another sample. False when unknown
    (no member named, a metadata member, one the hooks drop or fail on)."""
    if broken is None or key is None or _is_meta(broken, _META):
        return False
    try:
        name = broken if rename_files is None else rename_files(broken)
        if name is None or (select_files is not None and not select_files(name)):
            return False
    except Exception:  # not the error that broke the shard: the handler saw that one
        return False
    split = _split_path(name)
    return split is not None and split[0] != key
