"""Every entry of a tar stream, with its type and offset: what the sample reader hides.

:class:`TarEntries` walks a tar stream (plain, gzip, bzip2 or xz: detected by magic bytes, as
the reader does) header by header, reading ``read(n)`` only (never a seek), and yields each
:class:`Entry`: regular files, directories, links, devices and fifos alike, with the type flag,
data size, the offset of its first header in the uncompressed bytes, and the link target. GNU
long names and links and pax ``path``/``linkpath``/``size`` records are applied; pax global
headers are skipped. The data of regular members is skipped, never kept.

It is the slow, exact path for audits (``wds-cloud inspect``); reading samples goes through
:mod:`.reader`, which is much faster and yields only regular members with their data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import ShardFormatError
from ..urls import redact
from .compress import CHUNK_SIZE, Decompressed, tar_source
from .header import BLOCK, checksum_ok, header_name, padded, parse_number, parse_pax

__all__ = ["TYPES", "Entry", "TarEntries", "compression_of_name"]

#: names of the entry types that carry no data (the regular types are "0" and "7")
TYPES = {"1": "hard link", "2": "symbolic link", "3": "character device",
         "4": "block device", "5": "directory", "6": "fifo"}
_MAX_EXTENDED = 16 << 20
_ZERO_BLOCK = bytes(BLOCK)


@dataclass(frozen=True)
class Entry:
    """One tar entry: its name, type flag (``"0"`` regular, ``"5"`` directory, ...; a NUL flag
    reads as ``"0"``), data size, the offset of its first header (extended headers included)
    and link target (empty unless a link)."""

    name: str
    type: str
    size: int
    offset: int
    linkname: str = ""

    @property
    def regular(self) -> bool:
        return self.type in ("0", "7")


class _Blocks:
    """Position and buffer over ``read(n)``; :attr:`offset` counts the bytes consumed."""

    def __init__(self, read: Callable[[int], bytes], head: bytes) -> None:
        self.read, self.buf, self.pos, self.offset = read, head, 0, 0

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes, fewer only at the end of the stream."""
        buf, pos = self.buf, self.pos
        if len(buf) - pos < n:
            parts, have = [buf[pos:]], len(buf) - pos
            while have < n:
                data = self.read(max(n - have, CHUNK_SIZE))
                if not data:
                    break
                parts.append(data)
                have += len(data)
            buf, pos = self.buf, self.pos = b"".join(parts), 0
        out = buf[pos:pos + n]
        self.pos += len(out)
        self.offset += len(out)
        return out

    def skip(self, n: int) -> int:
        """Consume up to ``n`` bytes without keeping them; how many there were."""
        done = min(n, len(self.buf) - self.pos)
        self.pos += done
        while done < n:
            data = self.read(min(n - done, CHUNK_SIZE) if n - done > BLOCK else CHUNK_SIZE)
            if not data:
                break
            step = min(len(data), n - done)
            done += step
            self.buf, self.pos = data, step
        self.offset += done
        return done


class TarEntries:
    """The entries of the tar archive in ``stream``, in order, as an iterable (read once);
    :attr:`compression` is what the data is compressed with: ``gzip``, ``bzip2``, ``xz`` or
    ``""`` (found when the object is made, from the first bytes).

    Iterating raises :class:`~wds_cloud.errors.ShardFormatError` (with the offset) where the
    archive is truncated or corrupt, after yielding every whole entry before it; ``OSError``
    from the stream passes through."""

    def __init__(self, stream: BinaryIO, *, url: str = "") -> None:
        read, head = tar_source(stream, url)
        owner = getattr(read, "__self__", None)
        self.compression: str = owner.kind if isinstance(owner, Decompressed) else ""
        self.url = redact(url)
        self._blocks = _Blocks(read, head)

    @property
    def offset(self) -> int:
        """Uncompressed bytes read so far."""
        return self._blocks.offset

    def __iter__(self) -> Iterator[Entry]:
        while (entry := _next_entry(self._blocks, self.url)) is not None:
            yield entry


def compression_of_name(url: str) -> str:
    """The compression a shard's name announces: ``gzip``, ``bzip2``, ``xz`` or ``""``."""
    name = url.rsplit("?", 1)[0].lower()
    for suffixes, kind in ((".gz", ".tgz"), "gzip"), ((".bz2", ".tbz2"), "bzip2"), \
            ((".xz", ".txz"), "xz"):
        if name.endswith(suffixes):
            return kind
    return ""


def _next_entry(blocks: _Blocks, url: str) -> Entry | None:
    name: str | None = None
    link: str | None = None
    size: int | None = None
    first = blocks.offset
    while True:
        at = blocks.offset
        header = blocks.take(BLOCK)
        if len(header) < BLOCK or header == _ZERO_BLOCK:
            if header.count(0) != len(header):
                raise ShardFormatError(f"truncated tar header: the stream ends {len(header)} "
                                       "bytes into it", url=url, offset=at)
            if at != first:
                raise ShardFormatError("archive ends right after an extended (long name or pax)"
                                       " header", url=url, offset=first)
            return None
        if not checksum_ok(header):
            raise ShardFormatError("bad tar header checksum: not a tar archive, or corrupt "
                                   "here", url=url, offset=at)
        kind = chr(header[156]) if header[156] else "0"
        try:
            declared = parse_number(header[124:136])
        except ValueError:
            declared = -1
        if declared < 0:
            raise ShardFormatError(f"invalid size field {header[124:136]!r} in tar header",
                                   url=url, member=name or header_name(header), offset=at)
        if kind in "LKxXg":
            name, link, size = _extended(blocks, kind, declared, (name, link, size), url, at)
            continue
        name = header_name(header) if name is None else name
        if link is None:
            nul = header.find(b"\0", 157, 257)
            link = header[157:nul if nul >= 0 else 257].decode("utf-8", "surrogateescape")
        if kind == "0" and name.endswith("/"):
            kind = "5"  # a v7 directory
        size = 0 if kind in TYPES else (declared if size is None else size)
        if blocks.skip(padded(size)) < padded(size):
            raise ShardFormatError(f"truncated member: {size} bytes of data expected at "
                                   f"offset {at + BLOCK}, the stream ends before",
                                   url=url, member=name, offset=at)
        return Entry(name, kind, size, first, link)


def _extended(blocks: _Blocks, kind: str, size: int,
              current: tuple[str | None, str | None, int | None], url: str, at: int
              ) -> tuple[str | None, str | None, int | None]:
    """Consume a GNU long name/link or pax header; the first override given wins."""
    name, link, override = current
    if size > _MAX_EXTENDED:
        raise ShardFormatError(f"extended header of {size} bytes is larger than the "
                               f"{_MAX_EXTENDED}-byte limit", url=url, offset=at)
    data = blocks.take(padded(size))[:size]
    if len(data) < size:
        raise ShardFormatError("truncated extended header", url=url, offset=at)
    text = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    if kind == "L":
        name = text if name is None else name
    elif kind == "K":
        link = text if link is None else link
    elif kind in "xX":
        try:
            records = parse_pax(data)
            pax_size = int(records["size"]) if "size" in records else None
        except ValueError as exc:
            raise ShardFormatError(f"invalid pax header: {exc}", url=url, offset=at) from exc
        name = records.get("path") if name is None else name
        link = records.get("linkpath") if link is None else link
        override = pax_size if override is None else override
    return name, link, override


