"""Regular local files read through a read-only memory map: the reader's path for local and
cached shards.

A member's data sliced out of the map is a ``bytes`` of its own: one copy from the page cache,
as ``read(size)`` makes, but with no system call, no buffer joined and no fresh pages for each
read (a 4 MB ``read`` into a new ``bytes`` faults in 1,024 new pages of the process's memory).
Headers are parsed straight out of the map. The pages behind the reader are dropped from the
process's resident set every :data:`DROP_EVERY` bytes (``MADV_DONTNEED``: the page cache keeps
them), so a shard of any size costs a few MiB of RSS, not its size.

Shards of small members gain most (a member every few pages: no read call, buffer join or
fresh page per member); a shard whose first two members are large (:data:`LARGE_FIRST`) is read
with exact ``read`` calls as before, since there a map only adds page faults. Only an uncompressed
regular file whose stream is a plain ``open(path, "rb")`` (or its raw
``FileIO``) at a block boundary is mapped, and only the bytes it had when it was opened: a file
that grows is read to its size then; one that another process truncates under the reader would
fault (as any memory map of it would), which is why pipes, sockets, remote streams and files
still being written (the cache's stream-while-fill) are never mapped.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
from typing import Any

from .header import BLOCK

__all__ = ["DROP_EVERY", "LARGE_FIRST", "MIN_MAPPED", "MappedFile", "at_end", "map_file"]

MIN_MAPPED = 1 << 16  # smaller files are read as before: a map costs more than it saves
DROP_EVERY = 8 << 20  # bytes consumed between two drops of the pages behind the reader
LARGE_FIRST = 1 << 16  # a shard whose first two members are this large is not mapped
_MAGICS = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz: read by decompressing


class MappedFile:
    """A read-only map of a whole regular file; the reader starts at ``start``."""

    __slots__ = ("_dropped", "map", "start")

    def __init__(self, mapping: mmap.mmap, start: int) -> None:
        self.map, self.start = mapping, start
        self._dropped = start - start % mmap.PAGESIZE

    def consumed(self, pos: int) -> None:
        """The reader is at ``pos``: drop the pages before it once enough have piled up."""
        upto = pos - pos % mmap.PAGESIZE
        if upto - self._dropped >= DROP_EVERY:
            # (not where madvise exists or is allowed: the pages stay)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                self.map.madvise(mmap.MADV_DONTNEED, self._dropped, upto - self._dropped)
            self._dropped = upto

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a numpy view still alive: left to the GC
            self.map.close()


def at_end(n: int) -> bytes:
    """The read function of a mapped reader: everything is in the map already."""
    return b""


def map_file(stream: Any) -> MappedFile | None:
    """A map of ``stream``'s file from its position when that pays and is safe (see the module
    doc), else None (the stream is then read as usual; nothing of it was consumed)."""
    kind = type(stream)
    if kind is io.BufferedReader:
        if type(stream.raw) is not io.FileIO:
            return None
    elif kind is not io.FileIO:
        return None
    try:
        fd = stream.fileno()
        start = stream.tell()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or start % BLOCK or st.st_size - start < MIN_MAPPED:
            return None
        mapping = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    if mapping[start:start + 6].startswith(_MAGICS) or _large_members(mapping, start):
        mapping.close()
        return None
    return MappedFile(mapping, start)


def _large_members(mapping: mmap.mmap, start: int) -> bool:
    """Whether the first two members from ``start`` both have :data:`LARGE_FIRST` bytes or
    more: such a shard is read with exact reads instead (a map would fault in pages of data
    around every header, and drop them again, for no copy saved)."""
    at = start
    for _ in range(2):
        size = _size(mapping[at:at + BLOCK])
        if size < LARGE_FIRST:
            return False
        at += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    return True


def _size(head: bytes) -> int:
    """The size in a plain header (-1 if ``head`` is not one)."""
    if len(head) < BLOCK or head[156] not in b"07\0":
        return -1
    try:
        return int(head[124:136].strip(b" \0") or b"0", 8)
    except ValueError:
        return -1

