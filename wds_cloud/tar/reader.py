"""Low-level streaming tar parsing: numbers, headers, pax records, compression, members.

:func:`iter_member_batches` reads a byte stream front to back with ``read(n)`` only (never a
seek) and yields the regular members, in order, as lists of ``(name, data)`` (one list per
buffer of about ``chunk_size`` bytes). It reads ustar, GNU (``L``/``K`` long names and links,
base-256 numbers), pax (``x``/``X`` ``path`` and ``size`` records; ``g`` global headers are
skipped) and v7 archives, plain or gzip/bzip2/xz compressed (detected by magic bytes;
concatenated members are read in turn). Directories, links, devices and fifos are skipped; the
data of members of unknown type is skipped by its size, as :mod:`tarfile` does.

The archive ends at the first all-zero block, or at a clean end of stream on a member boundary
(as :mod:`tarfile` in stream mode). A truncated header or member, a bad header checksum, a bad
number or pax record, or corrupt compressed data raises
:class:`~wds_cloud.errors.ShardFormatError` naming the URL, member and offset in the
uncompressed stream, after every whole member before it was yielded; never a partial member.
Its ``member`` is set only when the damage is in a regular member (one that would have been
yielded); an extended header or a skipped entry is named in the message instead, so that
grouping never mistakes it for a member of a sample.
``OSError`` from the stream passes through unchanged.

Speed: small members are parsed straight out of a large buffer (:mod:`.bulk`, with numpy when
they are many) and a whole buffer's header checksums are verified in one numpy operation.
Large members are read one at a time with exact reads and no read-ahead: a member's ``bytes``
is what the stream's ``read(size)`` returned (for a local file, one copy from the page cache,
and none more), and its padding comes with the next header in one small read. The reader
switches to that mode at the first large member that is not buffered yet, and back to large
buffers after a run of small members. Anything unusual takes the general one-header-at-a-time
path (:class:`~.members.MemberReader`).

A regular local file (a local or cached shard) is instead read with positional reads
(:mod:`.positional`): windows of its headers and small members, and each large member's data
on its own, one copy from the page cache; with ``zero_copy``, members' data are views of a
memory map of the file (no copy).
"""

from __future__ import annotations

import bisect
import contextlib
import sys
from collections.abc import Iterator
from typing import BinaryIO, TypeGuard

from .bulk import Member, fast_batch
from .compress import CHUNK_SIZE, tar_source
from .header import (
    BLOCK,
    checksum_ok,
    first_bad_header,
    header_name,
    padded,
    parse_number,
    parse_pax,
)
from .members import BAD_CHECKSUM, DIRECT_MIN, END, READ_PIECE, MemberReader
from .positional import FileRead, file_view, positional

__all__ = [
    "BLOCK",
    "CHUNK_SIZE",
    "DIRECT_MIN",
    "Following",
    "Marks",
    "Member",
    "checksum_ok",
    "iter_member_batches",
    "member_start",
    "parse_number",
    "parse_pax",
]

_SMALL_RUN = 64  # small members in a row after which reading goes back to large buffers
_BATCH_BYTES = 1 << 20  # large members are handed on in batches of about this many bytes




#: the name of the member after a batch and the offset of its header (-1 in a compressed
#: stream), when its header is read already and is a plain one with a sound checksum
Following = list[tuple[str, int] | None]


def _plain_header(reader: MemberReader) -> tuple[str, int, int] | None:
    """``(name, size, offset)`` of the header at the reader's position when it is the last
    thing buffered (no byte of its data is) and a plain one with a sound checksum; else None.
    Consumes nothing."""
    buf, pos = reader.buf, reader.pos
    if len(buf) != pos + BLOCK or buf[pos + 156] != 48 or buf[pos + 135] or buf[pos + 345]:
        return None
    header = buf[pos:pos + BLOCK]
    try:
        size = int(header[124:135], 8)
    except ValueError:
        return None
    if not checksum_ok(header):
        return None
    return header_name(header), size, reader.off + pos


def _large_members(reader: MemberReader, marks: list[Marks] | None, compressed: bool,
                   following: Following | None) -> Iterator[list[Member]]:
    """Plain members of at least :data:`DIRECT_MIN` bytes, read one by one: each member's data
    is the very ``bytes`` one ``read(size)`` returned, and its padding comes with the next
    header in one more read. They are handed on in batches of about :data:`_BATCH_BYTES`
    (one member when it is that large): the generators and grouping then run once a batch,
    not once a member. A member that cannot be read whole is raised after the batch of those
    before it. Returns, having consumed nothing of it, at a member that is anything else
    (small, extended, unusual, partly buffered), which the general path then reads."""
    read = reader.read
    if reader.pos == len(reader.buf):  # after a member read by the general path
        reader.off, reader.buf, reader.pos = reader.off + reader.pos, read(BLOCK), 0
    head = _plain_header(reader)
    while _large(head):
        batch: list[Member] = []
        starts: list[int] = []
        held, failure = 0, None
        try:
            while _large(head) and held < _BATCH_BYTES:
                name, size, at = head
                batch.append((name, _read_large(reader, name, size, at)))
                starts.append(at)
                held += size
                head = _plain_header(reader)
        except Exception as exc:
            if not batch:
                raise
            failure = exc  # the members read whole before the damage first
        if marks is not None:
            marks[0] = (starts[0], 0, starts, compressed)
        if following is not None:
            following[0] = None if failure or head is None else \
                (head[0], -1 if compressed else head[2])
        yield batch
        if failure is not None:
            raise failure


def _large(head: tuple[str, int, int] | None) -> TypeGuard[tuple[str, int, int]]:
    """Whether ``head`` (see :func:`_plain_header`) is that of a member read on its own."""
    return head is not None and DIRECT_MIN <= head[1] <= READ_PIECE


def _read_large(reader: MemberReader, name: str, size: int, at: int) -> bytes:
    """The data of the member whose plain header is at ``at`` (the ``bytes`` one ``read``
    returned), leaving the reader at the next header, read with the padding."""
    read = reader.read
    reader.off, reader.buf, reader.pos = at + BLOCK, b"", 0
    data = read(size)
    if len(data) != size:  # a short read: the general way (it reports truncation)
        reader.buf = data
        data = reader._read_direct(size, name, at, None)
    else:
        reader.off += size
    pad = -size & (BLOCK - 1)
    reader.buf = tail = read(pad + BLOCK)  # the padding and the next header
    if len(tail) >= pad:
        reader.pos = pad
    else:
        reader.skip(pad, name, at)
    return data


#: where a batch's members lie: ``(start, base, headers, compressed)``. Member ``j`` of the
#: batch begins (with any extended header before it) at ``start`` for ``j == 0``, else where
#: member ``j - 1`` ends: ``base + headers[j - 1] + BLOCK + padded(len(data))``. Offsets are
#: in the uncompressed tar bytes, counted from where the stream was opened.
Marks = tuple[int, int, list[int], bool]


def member_start(marks: Marks, batch: list[Member], j: int) -> int:
    """Where member ``j`` of ``batch`` begins (see :data:`Marks`)."""
    start, base, headers, _ = marks
    if j == 0:
        return start
    return base + headers[j - 1] + BLOCK + padded(len(batch[j - 1][1]))


def iter_member_batches(
    stream: BinaryIO, *, url: str = "", chunk_size: int = CHUNK_SIZE,
    marks: list[Marks] | None = None, following: Following | None = None,
    zero_copy: bool = False, resumed: bool = False,
) -> Iterator[list[Member]]:
    """Yield the regular members of the tar archive in ``stream`` as lists of ``(name, data)``.

    ``url`` is used in error messages only (redacted). The stream is read, never closed; a
    local file's is read with positional reads (:mod:`.positional`), then seeked to where
    reading stopped. Raises :class:`ShardFormatError` for a truncated or corrupt archive,
    after yielding every whole member before the damage. ``marks``: a one-item list set to the
    :data:`Marks` of each batch before it is yielded (for resumable positions).
    ``following``: a one-item list set before each batch to what is known of the member
    after it (see :data:`Following`; None when nothing is), so that grouping can hand a sample
    on before the next member's data is read (one large ``bytes`` fewer alive at a time).
    ``zero_copy``: a local file's members are ``memoryview`` slices of a memory map of it
    instead of ``bytes`` (no copy; each keeps the map alive while it lives); other streams'
    are ``bytes``. A stream with no byte at all is a :class:`ShardFormatError` (as
    webdataset's ``ReadError('empty file')``), unless it is ``resumed`` (it starts mid-archive).
    """
    read = positional(stream)
    if read is None:
        # the first read is one header: a large first member is then read like any other
        source, head = tar_source(stream, url, peek=BLOCK)
        compressed = getattr(source, "__self__", None) is not stream
        reader = MemberReader(source, head, url, max(chunk_size, BLOCK))
        if not (head or compressed or resumed):
            raise reader.error(_EMPTY, at=0)
        yield from _batches(reader, compressed, marks, following)
        return
    reader = MemberReader(read, b"", url, max(chunk_size, BLOCK))
    if read.limit == 0 and not resumed:
        raise reader.error(_EMPTY, at=0)
    with file_view(read) if zero_copy else contextlib.nullcontext() as view:
        if view is not None:
            reader.view = view
        else:
            reader.far = read.member
        try:
            yield from _file_batches(reader, marks)
        finally:
            with contextlib.suppress(OSError, ValueError):  # the stream is where reading stopped
                stream.seek(read.start + reader.off + reader.pos)


_EMPTY = "empty shard: 0 bytes where a tar archive was expected"
_MIN_WINDOW = 8 << 10  # the smallest window of a regular file's headers and small members
_FIRST_WINDOW = 64 << 10  # the first; each next one twice what the last held (to a chunk)


def _file_batches(reader: MemberReader, marks: list[Marks] | None) -> Iterator[list[Member]]:
    """The loop of :func:`iter_member_batches` over a regular file (:mod:`.positional`):
    windows of headers and small members read where the next header is, each as large as
    twice what the last one held of them (from :data:`_MIN_WINDOW` to a chunk, the first
    :data:`_FIRST_WINDOW`); the data of large members, and of those that run past a window,
    read on their own (``reader.far``), or every member's sliced out of ``reader.view``."""
    read = reader.read
    assert isinstance(read, FileRead)
    size = min(reader.chunk, _FIRST_WINDOW)
    while True:
        if reader.pos > len(reader.buf) - BLOCK:  # used up, or a member read past its end
            at = reader.off + reader.pos
            reader.buf, reader.off, reader.pos = read.window(at, size), at, 0
        buf, start = reader.buf, reader.pos
        vectorize = reader.off + start >= reader.chunk or "numpy" in sys.modules
        batch, headers, extended, pos, large = fast_batch(buf, start, vectorize=vectorize,
                                                   far=reader.far, view=reader.view,
                                                   base=reader.off)
        if headers:
            yield from _checked(reader, batch, buf, start, headers, extended, vectorize, marks,
                                False)
            reader.pos = pos
            yield batch
            held = min(pos, len(buf)) - start - large  # what headers and small members took
            size = min(reader.chunk, max(_MIN_WINDOW, 2 * held))
            continue
        before = reader.off + reader.pos  # anything unusual: the general path, one member
        item = reader.step()
        if item is END:
            return
        if item is not None:
            if marks is not None:
                marks[0] = (before, 0, [], False)
            yield [item]  # type: ignore[list-item]


def _checked(reader: MemberReader, batch: list[Member], buf: bytes, start: int,
             headers: list[int], extended: list[int], vectorize: bool,
             marks: list[Marks] | None, compressed: bool) -> Iterator[list[Member]]:
    """Sets the :data:`Marks` of ``batch``, parsed from ``buf`` at ``start`` with its headers
    (and the extended headers before them) at those offsets; where a header's checksum is bad,
    yields the members before it, then raises its error. A good batch is the caller's to
    yield."""
    if marks is not None:
        marks[0] = (reader.off + start, reader.off, headers, compressed)
    bad = first_bad_header(buf, headers + extended if extended else headers, vectorize=vectorize)
    if bad >= 0:
        good = bisect.bisect_left(headers, bad)
        if good:
            yield batch[:good]
        raise reader.error(BAD_CHECKSUM, at=reader.off + bad)


def _batches(reader: MemberReader, compressed: bool, marks: list[Marks] | None,
             following: Following | None) -> Iterator[list[Member]]:
    """The loop of :func:`iter_member_batches` over a stream."""
    small = 0  # members read one by one since the last large one
    while True:
        if reader.ahead > BLOCK:  # small members: parse what a large buffer holds
            buf, start = reader.buf, reader.pos
            # numpy once loaded, or after the first chunk: the first samples never wait for it
            vectorize = reader.off + start >= reader.chunk or "numpy" in sys.modules
            batch, headers, extended, reader.pos, _ = fast_batch(buf, start,
                                                                 vectorize=vectorize)
            if headers:
                yield from _checked(reader, batch, buf, start, headers, extended, vectorize,
                                    marks, compressed)
                yield batch
        else:
            yield from _large_members(reader, marks, compressed, following)
        if following is not None:
            following[0] = None
        before = reader.off + reader.pos
        item = reader.step()
        if item is END:
            return
        if item is not None and len(item[1]) >= DIRECT_MIN:  # type: ignore[index]
            reader.ahead, small = BLOCK, 0  # large members: one by one, no read-ahead
        elif reader.ahead == BLOCK:
            small += 1
            if small == _SMALL_RUN:
                reader.ahead = reader.chunk
        if item is not None:
            if marks is not None:
                marks[0] = (before, 0, [], compressed)
            yield [item]  # type: ignore[list-item]
