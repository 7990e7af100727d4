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

Speed: plain headers are parsed straight out of a large buffer (with numpy when members are
small) and a whole buffer's header checksums are verified in one numpy operation; anything
unusual takes the general one-header-at-a-time path (:class:`_Reader`). Large members that are
not buffered yet are read from the stream directly.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import numpy as np

from ..errors import ShardFormatError
from ..urls import redact
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

__all__ = [
    "BLOCK",
    "CHUNK_SIZE",
    "DIRECT_MIN",
    "Marks",
    "Member",
    "checksum_ok",
    "iter_member_batches",
    "member_start",
    "parse_number",
    "parse_pax",
]

DIRECT_MIN = 1 << 18  # members at least this large are read from the stream directly
MAX_EXTENDED = 16 << 20  # limit for the data of a long-name or pax header
_READ_PIECE = 16 << 20  # never ask a stream for more at once (a bogus size must not allocate)
_PROBE = 32  # members parsed one by one before deciding whether to vectorize
_DENSE_BLOCKS = 16  # vectorize when those members take at most this many blocks on average
_OCTAL = 8 ** np.arange(10, -1, -1, dtype=np.int64)  # weights of an 11-digit octal field

Member = tuple[str, bytes]

_ZERO_BLOCK = bytes(BLOCK)
_EXTENDED = frozenset(b"LKxXg")  # GNU long name/link, pax extended/Solaris/global
_REGULAR = frozenset(b"07\0")  # regular, contiguous, old (v7) regular
_NO_DATA = frozenset(b"123456")  # links, devices, dirs, fifos: size ignored, as in tarfile
_END = object()
_BAD_CHECKSUM = "bad tar header checksum: this is not a tar archive, or it is corrupt here"



def _fast_batch(buf: bytes, pos: int) -> tuple[list[Member], list[int], list[int], int]:
    """Parse consecutive plain members from ``pos``: a type ``0`` header without ustar prefix
    (optionally after one pax or GNU long-name header), data buffered.

    Returns the members, their header offsets, the offsets of the extended headers before them
    (checksums still unverified) and where it stopped. The first members are parsed one by one;
    if they are small, the rest of the buffer is walked with numpy.
    """
    members: list[Member] = []
    headers: list[int] = []
    extended: list[int] = []
    start = pos
    pos = _walk(buf, pos, members, headers, extended, _PROBE)
    if len(members) == _PROBE and pos - start <= _PROBE * _DENSE_BLOCKS * BLOCK:
        pos = _walk_dense(buf, pos, members, headers, extended)
    pos = _walk(buf, pos, members, headers, extended, len(buf))
    return members, headers, extended, pos


def _walk(buf: bytes, pos: int, members: list[Member], headers: list[int], extended: list[int],
          count: int) -> int:
    """Append up to ``count`` plain members from ``pos``; return where it stopped."""
    add, mark, find = members.append, headers.append, buf.find
    end = len(buf)
    limit = end - BLOCK
    for _ in range(count):
        if pos > limit:
            break
        start = pos
        name = size = None
        if buf[pos + 156] != 48:
            ext = _fast_extended(buf, pos, limit)
            if ext is None:
                break
            pos, name, size = ext
            if buf[pos + 156] != 48:
                pos = start
                break
        if buf[pos + 135] or (buf[pos + 345] and name is None):
            pos = start
            break
        try:
            header_size = int(buf[pos + 124:pos + 135], 8)
        except ValueError:
            pos = start
            break
        size = header_size if size is None else size
        data = pos + BLOCK
        nxt = data + ((size + 511) & -512)
        if nxt > end or size < 0 or header_size < 0:
            pos = start
            break
        if name is None:
            nul = find(b"\0", pos, pos + 100)
            name = buf[pos:nul if nul >= 0 else pos + 100].decode("utf-8", "surrogateescape")
        add((name, buf[data:data + size]))
        mark(pos)
        if start != pos:
            extended.append(start)
        pos = nxt
    return pos


def _walk_dense(buf: bytes, pos: int, members: list[Member], headers: list[int],
                extended: list[int]) -> int:
    """:func:`_walk` vectorized: every block from ``pos`` is parsed as if it were a plain
    header in one numpy pass, then Python follows the chain of next-header indexes."""
    nblocks = (len(buf) - pos) // BLOCK
    rows = np.frombuffer(buf, np.uint8, nblocks * BLOCK, pos).reshape(nblocks, BLOCK)
    digits = rows[:, 124:135].astype(np.int64) - 48
    sizes = digits @ _OCTAL
    plain = ((rows[:, 156] == 48) & (rows[:, 135] == 0) & (rows[:, 345] == 0)
             & ((digits >= 0) & (digits <= 7)).all(axis=1))
    nxt = np.arange(1, nblocks + 1) + ((sizes + 511) >> 9)
    nxt[~plain | (nxt > nblocks)] = -1
    links, is_plain = nxt.tolist(), plain.tolist()
    found: list[int] = []
    overrides: dict[int, tuple[str | None, int | None]] = {}
    i = 0
    while i < nblocks:
        j = links[i]
        if j < 0:  # not a plain member: maybe a pax/long-name header before one
            ext = _fast_extended(buf, pos + i * BLOCK, len(buf) - BLOCK)
            if ext is None:
                break
            k = (ext[0] - pos) // BLOCK
            j = links[k] if ext[2] is None else k + 1 + ((ext[2] + 511) >> 9)
            if not is_plain[k] or not 0 < j <= nblocks or (ext[2] or 0) < 0:
                break
            if ext[1] is not None or ext[2] is not None:
                overrides[k] = ext[1:]
            extended.append(pos + i * BLOCK)
            i = k
        found.append(i)
        i = j
    if found:
        _collect(buf, pos, rows, sizes, found, overrides, members)
        headers.extend(pos + b * BLOCK for b in found)
    return pos + i * BLOCK


def _collect(buf: bytes, pos: int, rows: Any, sizes: Any, found: list[int],
             overrides: dict[int, tuple[str | None, int | None]], members: list[Member]) -> None:
    """Append the members whose headers are the blocks ``found`` (relative to ``pos``)."""
    idx = np.array(found, dtype=np.intp)
    nul = rows[idx, :100] == 0
    lengths = np.where(nul.any(axis=1), nul.argmax(axis=1), 100).tolist()
    starts = (idx * BLOCK + pos).tolist()
    lens = sizes[idx].tolist()
    names = [buf[p:p + n].decode("utf-8", "surrogateescape")
             for p, n in zip(starts, lengths, strict=True)]
    for n, k in enumerate(found) if overrides else ():
        if k in overrides:
            name, size = overrides[k]
            names[n] = names[n] if name is None else name
            lens[n] = lens[n] if size is None else size
    datas = [buf[p + BLOCK:p + BLOCK + n] for p, n in zip(starts, lens, strict=True)]
    members.extend(zip(names, datas, strict=True))


def _fast_extended(buf: bytes, pos: int, limit: int) -> tuple[int, str | None, int | None] | None:
    """A buffered pax (``x``) or GNU long-name (``L``) header at ``pos`` whose member header is
    buffered too: ``(member header offset, name or None, size or None)``; None otherwise."""
    kind = buf[pos + 156]
    if (kind != 120 and kind != 76) or buf[pos + 135]:
        return None
    try:
        size = int(buf[pos + 124:pos + 135], 8)
    except ValueError:
        return None
    nxt = pos + BLOCK + ((size + 511) & -512)
    if size < 0 or nxt > limit:
        return None
    data = buf[pos + BLOCK:pos + BLOCK + size]
    if kind == 76:
        nul = data.find(b"\0")
        return nxt, data[:nul if nul >= 0 else size].decode("utf-8", "surrogateescape"), None
    try:
        return (nxt, *pax_overrides(data))
    except ValueError:
        return None  # the general path reports it


class _Reader:
    """Buffer and position over the (uncompressed) tar bytes; the general, one-header path."""

    def __init__(self, read: Callable[[int], bytes], head: bytes, url: str, chunk: int) -> None:
        self.read, self.buf, self.url, self.chunk = read, head, url, chunk
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
        target = max(need, have + self.chunk)
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
             ) -> bytes:
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
        """A large member's data: what is buffered, then straight from the stream."""
        buf, pos = self.buf, self.pos
        parts = [buf[pos:]] if len(buf) > pos else []
        have = len(buf) - pos
        self.off += len(buf)
        self.buf, self.pos = b"", 0
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
            if buf.count(0, pos) == have:  # clean end, or cut inside the end-of-archive blocks
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
    marks: list[Marks] | None = None,
) -> Iterator[list[Member]]:
    """Yield the regular members of the tar archive in ``stream`` as lists of ``(name, data)``.

    ``url`` is used in error messages only (redacted). The stream is read, never seeked nor
    closed. Raises :class:`ShardFormatError` for a truncated or corrupt archive, after yielding
    every whole member before the damage. ``marks``: a one-item list set to the
    :data:`Marks` of each batch before it is yielded (for resumable positions).
    """
    read, head = tar_source(stream, url)
    compressed = getattr(read, "__self__", None) is not stream
    reader = _Reader(read, head, url, max(chunk_size, BLOCK))
    while True:
        buf, start = reader.buf, reader.pos
        batch, headers, extended, reader.pos = _fast_batch(buf, reader.pos)
        if headers:
            bad = first_bad_header(buf, headers + extended if extended else headers)
            if marks is not None:
                marks[0] = (reader.off + start, reader.off, headers, compressed)
            if bad >= 0:
                good = bisect.bisect_left(headers, bad)  # members before the bad header
                if good:
                    yield batch[:good]
                raise reader.error(_BAD_CHECKSUM, at=reader.off + bad)
            yield batch
        before = reader.off + reader.pos
        item = reader.step()
        if item is _END:
            return
        if item is not None:
            if marks is not None:
                marks[0] = (before, 0, [], compressed)
            yield [item]  # type: ignore[list-item]
