"""Regular local files read with positional reads: the reader's path for local and cached
shards.

A regular file is not read front to back like a stream. The reader takes a window of the
headers and small members before it (``os.pread``, from the file's page cache), and each
large member's data on its own (one ``pread`` of exactly its bytes: one copy, and none more);
the bytes of a large member never pass through a window. A window is as large as what the
last one held of small members, so a shard of large members with a small one or two between
them (an image with its ``.json`` and ``.cls``) costs one small read a sample beside the
image's, and a shard of small members is read a ``chunk`` at a time.

With ``zero_copy``, every member's data is instead a ``memoryview`` slice of a read-only
memory map of the file (:func:`file_view`): nothing is copied, and no page of it is touched
until the consumer reads it (headers still come from windows read with ``pread``: touching a
page of a map costs a page fault, several µs on a virtual machine, while a small ``pread``
costs one µs). A view keeps the map alive while it lives; the page cache, not the process,
holds its pages.

Only an uncompressed regular file whose stream is a plain ``open(path, "rb")`` (or its raw
``FileIO``) at a block boundary is read this way; pipes, sockets, remote streams, compressed
shards and files still being written (the cache's stream-while-fill, which is no plain file
object) are read as streams. A file that grows is read to its end; one truncated under the
reader reads short, which the reader reports as a truncated archive.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
from typing import Any

from .header import BLOCK, padded

__all__ = ["FileRead", "file_view", "positional"]

_MAGICS = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz: read by decompressing


class FileRead:
    """``read(n)`` of a file's bytes from a position it keeps (``at``), with ``os.pread``:
    the reader's sequential reads, between windows it places itself. Offsets count from
    ``start`` (where the stream was when it was handed over)."""

    __slots__ = ("at", "fd", "limit", "start")

    def __init__(self, fd: int, start: int, limit: int) -> None:
        self.fd, self.start, self.at = fd, start, 0
        self.limit = limit  # the bytes from ``start`` when the file was handed over

    def __call__(self, n: int) -> bytes:
        data = os.pread(self.fd, n, self.start + self.at)
        self.at += len(data)
        return data

    def window(self, offset: int, n: int) -> bytes:
        """``n`` bytes from ``offset`` (fewer at the end); sequential reads go on after them."""
        data = os.pread(self.fd, n, self.start + offset)
        self.at = offset + len(data)
        return data

    def member(self, size: int, offset: int) -> bytes | None:
        """A member's data: ``size`` bytes from ``offset``, the position left alone (None where
        the file held less than the data and its padding when it was handed over, or holds
        less now)."""
        if offset + padded(size) > self.limit:
            return None
        data = os.pread(self.fd, size, self.start + offset)
        return data if len(data) == size else None


def positional(stream: Any) -> FileRead | None:
    """A :class:`FileRead` of ``stream``'s file from its position when it is a plain regular
    file, uncompressed, at a block boundary (see the module doc), else None (the stream is
    then read as usual; nothing of it was consumed)."""
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
        if not stat.S_ISREG(st.st_mode) or start % BLOCK:
            return None
        if os.pread(fd, 6, start).startswith(_MAGICS):
            return None
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    return FileRead(fd, start, st.st_size - start)


class file_view(contextlib.AbstractContextManager["memoryview | None"]):
    """A read-only view of the whole file behind ``read``, from its ``start`` (None for an
    empty file, or where it cannot be mapped: members are then ``bytes``). On exit the map is
    closed unless views of it are still alive; those keep it open until they go."""

    def __init__(self, read: FileRead) -> None:
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        with contextlib.suppress(OSError, ValueError):
            size = os.fstat(read.fd).st_size
            if size > read.start:
                self._map = mmap.mmap(read.fd, size, access=mmap.ACCESS_READ)
                self._view = memoryview(self._map)[read.start:]

    def __enter__(self) -> memoryview | None:
        return self._view

    def __exit__(self, *exc: object) -> None:
        if self._view is not None:
            self._view.release()  # (the slices handed out keep the map alive)
        if self._map is not None:
            with contextlib.suppress(BufferError):  # views still alive: left to them
                self._map.close()
