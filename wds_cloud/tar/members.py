"""The general path of the tar reader: :class:`MemberReader`, a buffer and a position over
the (uncompressed) tar bytes that reads one header and one member at a time (ustar, GNU
long names and links, base-256 numbers, pax records, v7; directories, links and devices
skipped), reporting damage as :class:`~wds_cloud.errors.ShardFormatError` with the member and
offset. :mod:`.reader` takes it wherever its fast paths (:mod:`.bulk`, large members read on
their own, :mod:`.positional`) stop at something unusual.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ShardFormatError
from ..urls import redact
from .bulk import Far, Member
from .header import (
    BLOCK,
    checksum_ok,
    header_name,
    padded,
    parse_number,
    pax_overrides,
)

__all__ = ["BAD_CHECKSUM", "DIRECT_MIN", "END", "MAX_EXTENDED", "READ_PIECE", "MemberReader"]

DIRECT_MIN = 1 << 16  # members at least this large are read from the stream directly
MAX_EXTENDED = 16 << 20  # limit for the data of a long-name or pax header
READ_PIECE = 16 << 20  # never ask a stream for more at once (a bogus size must not allocate)

_ZERO_BLOCK = bytes(BLOCK)
_EXTENDED = frozenset(b"LKxXg")  # GNU long name/link, pax extended/Solaris/global
_REGULAR = frozenset(b"07\0")  # regular, contiguous, old (v7) regular
_NO_DATA = frozenset(b"123456")  # links, devices, dirs, fifos: size ignored, as in tarfile
END = object()  # what :meth:`MemberReader.step` gives at the end of the archive
BAD_CHECKSUM = "bad tar header checksum: this is not a tar archive, or it is corrupt here"


class MemberReader:
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
            data = self.read(min(target - have, READ_PIECE))
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
            data: bytes | memoryview
            if self.view is not None and entry is None:  # a member of a regular file: a view
                data = self.view[self.off + pos:self.off + pos + size]
            else:
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
            data = self.read(min(size - have, READ_PIECE))
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
            raise self.error(BAD_CHECKSUM)
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
        None for a skipped member, ``END`` at the end of the archive."""
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
                return END
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
