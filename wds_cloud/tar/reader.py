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
path (:class:`_Reader`).

A regular local file (a local or cached shard) is instead read with positional reads
(:mod:`.positional`): windows of its headers and small members, and each large member's data
on its own, one copy from the page cache; with ``zero_copy``, members' data are views of a
memory map of the file (no copy).
"""

from __future__ import annotations

import bisect
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeGuard

from ..errors import ShardFormatError
from ..urls import redact
from .bulk import Far, Member, fast_batch
from .compress import CHUNK_SIZE, tar_source
from .header import (
    BLOCK,
    checksum_ok,
    first_bad_header,
    header_name,
    padded,
    parse_number,
    parse_pax,
    pax_overrides,
)
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

DIRECT_MIN = 1 << 16  # members at least this large are read from the stream directly
_SMALL_RUN = 64  # small members in a row after which reading goes back to large buffers
MAX_EXTENDED = 16 << 20  # limit for the data of a long-name or pax header
_READ_PIECE = 16 << 20  # never ask a stream for more at once (a bogus size must not allocate)
_BATCH_BYTES = 1 << 20  # large members are handed on in batches of about this many bytes

_ZERO_BLOCK = bytes(BLOCK)
_EXTENDED = frozenset(b"LKxXg")  # GNU long name/link, pax extended/Solaris/global
_REGULAR = frozenset(b"07\0")  # regular, contiguous, old (v7) regular
_NO_DATA = frozenset(b"123456")  # links, devices, dirs, fifos: size ignored, as in tarfile
_END = object()
_BAD_CHECKSUM = "bad tar header checksum: this is not a tar archive, or it is corrupt here"


class _Reader:
    """Buffer and position over the (uncompressed) tar bytes; the general, one-header path.

    ``ahead`` is how much more than needed :meth:`fill` reads: ``chunk`` while members are
    small, :data:`BLOCK` (just the next header) while they are large (see :func:`_large_members`).
    """

    def __init__(self, read: Callable[[int], bytes], head: bytes, url: str,
                 chunk: int) -> None:
        self.read, self.buf, self.url, self.chunk = read, head, url, chunk
        self.ahead = chunk
        #: reads large members' data out of a regular file (see :data:`~.bulk.Far`)
        self.far: Far | None = None
        #: a view of a regular file, from where reading began, that every member's data is
        #: sliced out of (zero-copy reading)
        self.view: memoryview | None = None
        self.pos = 0  # position in buf
        self.off = 0  # stream offset of buf[0]; always a multiple of BLOCK

    def error(self, what: str, *, member: str | None = None, at: int | None = None
              ) -> ShardFormatError:
        offset = self.off + self.pos if at is None else at
        return ShardFormatError(what, url=redact(self.url), member=member, offset=offset)

    def fill(self, need: int) -> int:
        """Buffer at least ``need`` bytes from the position (reading a chunk or more at once).

        Returns the bytes available, fewer than ``need`` only at the end of the stream.
        """
        buf, pos = self.buf, self.pos
        have = len(buf) - pos
        if have >= need:
            return have
        parts = [buf[pos:]] if have else []
        target = need + self.ahead
        while have < need:
            data = self.read(min(target - have, _READ_PIECE))
            if not data:
                break
            parts.append(data)
            have += len(data)
        self.off += pos
        self.buf, self.pos = b"".join(parts), 0
        return have

    def take(self, size: int, member: str, header_at: int, *, entry: str | None = None
             ) -> bytes | memoryview:
        """The next ``size`` bytes (a member's data), consuming their padding to a block.

        ``entry`` describes what is read when it is not a regular member (an extended header):
        errors then name it in their message, with no ``member``."""
        total = padded(size)
        have = len(self.buf) - self.pos
        if have < total and (size < DIRECT_MIN or have >= size):
            have = self.fill(total)
        if have >= size:
            pos = self.pos
            self.pos = pos + size
            data: bytes | memoryview | None = None
            if self.view is not None and entry is None:
                at = self.off + pos
                data = self.view[at:at + size]
            if data is None:
                data = self.buf[pos:pos + size]
        else:
            data = self._read_direct(size, member, header_at, entry)
        if total > size:
            self.skip(total - size, member, header_at, entry=entry)
        return data

    def _truncated(self, what: str, member: str, header_at: int, entry: str | None
                   ) -> ShardFormatError:
        if entry is None:
            return self.error(f"truncated member: {what}", member=member, at=header_at)
        return self.error(f"truncated {entry}: {what}", at=header_at)

    def _read_direct(self, size: int, member: str, header_at: int, entry: str | None
                     ) -> bytes:
        """A large member's data: what is buffered, then straight from the stream. From here
        on, reads go no further than the next header (large members: one by one)."""
        buf, pos = self.buf, self.pos
        parts = [buf[pos:]] if len(buf) > pos else []
        have = len(buf) - pos
        self.off += len(buf)
        self.buf, self.pos, self.ahead = b"", 0, BLOCK
        while have < size:
            data = self.read(min(size - have, _READ_PIECE))
            if not data:
                raise self._truncated(
                    f"{size} bytes of data expected at offset {header_at + BLOCK} but the "
                    f"stream ends after {have}", member, header_at, entry)
            parts.append(data)
            have += len(data)
            self.off += len(data)
        return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)

    def skip(self, count: int, member: str, header_at: int, *, entry: str | None = None
             ) -> None:
        """Consume ``count`` bytes (data of skipped members, padding); ``entry`` as in
        :meth:`take`."""
        while count:
            have = self.fill(min(count, self.chunk))
            if have == 0:
                raise self._truncated(
                    f"the stream ends {count} bytes before the end of its data (at offset "
                    f"{self.off + self.pos + count})", member, header_at, entry)
            step = min(have, count)
            self.pos += step
            count -= step

    def header(self) -> bytes | None:
        """The next 512-byte header (consumed), or None at the end of the archive."""
        have = self.fill(BLOCK)
        buf, pos = self.buf, self.pos
        if have < BLOCK:
            if buf[pos:].count(0) == have:  # clean end, or cut inside the end-of-archive blocks
                return None
            raise self.error(f"truncated tar header: the stream ends {have} bytes into it")
        header = buf[pos:pos + BLOCK]
        if header == _ZERO_BLOCK:
            return None
        if not checksum_ok(header):
            raise self.error(_BAD_CHECKSUM)
        self.pos = pos + BLOCK
        return header

    def _size(self, header: bytes, at: int, name: str | None) -> int:
        try:
            value = parse_number(header[124:136])
        except ValueError:
            value = -1
        if value < 0:
            name = header_name(header) if name is None else name
            if header[156] in _REGULAR:
                raise self.error(f"invalid size field {header[124:136]!r} in tar header",
                                 member=name, at=at)
            raise self.error(f"invalid size field {header[124:136]!r} in the tar header of "
                             f"{name!r} (type {chr(header[156])!r})", at=at)
        return value

    def step(self) -> Member | object | None:
        """Read one member with the general parser: ``(name, data)`` for a regular file,
        None for a skipped member, ``_END`` at the end of the archive."""
        name: str | None = None
        size: int | None = None
        first = self.off + self.pos
        while True:
            at = self.off + self.pos
            header = self.header()
            if header is None:
                if at != first:
                    raise self.error("archive ends right after an extended (long name or pax) "
                                     "header, before the member it describes", at=first)
                return _END
            kind = header[156]
            hsize = self._size(header, at, None if kind in _EXTENDED else name)
            if kind in _EXTENDED:
                name, size = self._extended(header, hsize, at, name, size)
                continue
            name = header_name(header) if name is None else name
            size = hsize if size is None else size
            if kind in _REGULAR and not (kind == 0 and name.endswith("/")):  # v7 directory
                return name, self.take(size, name, at)
            if kind == 0x53:  # "S"
                raise self.error("GNU sparse members are not supported: re-create the shard "
                                 "without --sparse", member=name, at=at)
            if kind not in _NO_DATA and kind != 0:
                self.skip(padded(size), name, at, entry=f"entry {name!r} of type {chr(kind)!r}")
            return None

    def _extended(self, header: bytes, size: int, at: int, name: str | None,
                  size_override: int | None) -> tuple[str | None, int | None]:
        """Consume a ``L``/``K``/``x``/``X``/``g`` header; the first name/size given wins."""
        label = header_name(header)
        if size > MAX_EXTENDED:
            raise self.error(f"extended header {label!r} of {size} bytes is larger than the "
                             f"{MAX_EXTENDED}-byte limit", at=at)
        data = self.take(size, label, at, entry=f"extended header {label!r}")
        if not isinstance(data, bytes):  # (never a view: those are for members' data)
            data = bytes(data)
        kind = header[156]
        if kind == 0x4C and name is None:  # "L": GNU long name
            nul = data.find(b"\0")
            name = data[:nul if nul >= 0 else size].decode("utf-8", "surrogateescape")
        elif kind in b"xX":
            try:
                path, pax_size = pax_overrides(data)
            except ValueError as exc:
                raise self.error(f"invalid pax header {label!r}: {exc}", at=at) from exc
            name = path if name is None else name
            size_override = pax_size if size_override is None else size_override
        return name, size_override


#: the name of the member after a batch and the offset of its header (-1 in a compressed
#: stream), when its header is read already and is a plain one with a sound checksum
Following = list[tuple[str, int] | None]


def _plain_header(reader: _Reader) -> tuple[str, int, int] | None:
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


def _large_members(reader: _Reader, marks: list[Marks] | None, compressed: bool,
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
    return head is not None and DIRECT_MIN <= head[1] <= _READ_PIECE


def _read_large(reader: _Reader, name: str, size: int, at: int) -> bytes:
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
    zero_copy: bool = False,
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
    are ``bytes``.
    """
    read = positional(stream)
    if read is None:
        # the first read is one header: a large first member is then read like any other
        source, head = tar_source(stream, url, peek=BLOCK)
        compressed = getattr(source, "__self__", None) is not stream
        reader = _Reader(source, head, url, max(chunk_size, BLOCK))
        yield from _batches(reader, compressed, marks, following)
        return
    reader = _Reader(read, b"", url, max(chunk_size, BLOCK))
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


_MIN_WINDOW = 8 << 10  # the smallest window of a regular file's headers and small members
_FIRST_WINDOW = 64 << 10  # the first; each next one twice what the last held (to a chunk)


def _file_batches(reader: _Reader, marks: list[Marks] | None) -> Iterator[list[Member]]:
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
            if marks is not None:
                marks[0] = (reader.off + start, reader.off, headers, False)
            good, error = _checked(reader, buf, headers, extended, vectorize)
            if error is not None:
                if good:
                    yield batch[:good]
                raise error
            reader.pos = pos
            yield batch
            held = min(pos, len(buf)) - start - large  # what headers and small members took
            size = min(reader.chunk, max(_MIN_WINDOW, 2 * held))
            continue
        before = reader.off + reader.pos  # anything unusual: the general path, one member
        item = reader.step()
        if item is _END:
            return
        if item is not None:
            if marks is not None:
                marks[0] = (before, 0, [], False)
            yield [item]  # type: ignore[list-item]


def _checked(reader: _Reader, buf: bytes, headers: list[int], extended: list[int],
             vectorize: bool) -> tuple[int, ShardFormatError | None]:
    """``(members before the first bad header, its error)`` for the headers (and the extended
    headers before them) at those offsets of ``buf``; ``(len(headers), None)`` when all hold."""
    bad = first_bad_header(buf, headers + extended if extended else headers, vectorize=vectorize)
    if bad < 0:
        return len(headers), None
    return bisect.bisect_left(headers, bad), reader.error(_BAD_CHECKSUM, at=reader.off + bad)


def _batches(reader: _Reader, compressed: bool, marks: list[Marks] | None,
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
                if marks is not None:
                    marks[0] = (reader.off + start, reader.off, headers, compressed)
                good, error = _checked(reader, buf, headers, extended, vectorize)
                if error is not None:
                    if good:
                        yield batch[:good]
                    raise error
                yield batch
        else:
            yield from _large_members(reader, marks, compressed, following)
        if following is not None:
            following[0] = None
        before = reader.off + reader.pos
        item = reader.step()
        if item is _END:
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
