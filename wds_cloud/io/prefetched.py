"""A stream that serves bytes read ahead of time, then reads on from the stream they came from.

:func:`prefetched_stream` is what :class:`~wds_cloud.io.readahead.ReadAhead` hands the consumer for
a shard it pre-read. Contract of the returned stream:

- It yields the pre-read chunks, then what the underlying stream (``raw``) reads after them:
  the same bytes, in the same order, as reading ``raw`` from the start. It is read-only and not
  seekable; ``tell()`` counts the bytes served.
- ``error``, an exception met while pre-reading, is raised by ``read`` once the bytes read before
  it were served; an error of ``raw`` met while some pre-read bytes are being served waits for
  the next ``read`` in the same way, so a read never loses bytes.
- ``on_drained`` is called once, when the pre-read bytes are all served or the stream is closed
  (the caller gives back its memory budget then).
- A chunk is ``bytes`` (served as it is when a read takes it whole) or a view of a buffer the
  caller reuses: ``recycle``, when given, gets each chunk back once its bytes are copied out
  (or the stream is closed); nothing here refers to it after that.
- Other attributes (``local_path``, ``name``, …) are ``raw``'s; closing the stream closes ``raw``.
- ``on_pace``, when given, gets ``(bytes, seconds)`` of each read from ``raw`` after the
  pre-read bytes: how fast the connection serves its reader (see
  :class:`~wds_cloud.io.readahead.ReadAhead`).

This module is layer-neutral: standard library only.
"""

from __future__ import annotations

import io
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO, cast

__all__ = ["Pieces", "PrefetchedStream", "prefetched_stream"]


Chunk = bytes | memoryview


def prefetched_stream(raw: BinaryIO, chunks: deque[Chunk], error: Exception | None,
                      on_drained: Callable[[], None],
                      recycle: Callable[[Chunk], None] | None = None, *,
                      on_pace: Callable[[int, float], None] | None = None) -> BinaryIO:
    """``raw`` itself when there is nothing to serve first (``on_drained`` is called now) and
    nobody to tell the pace of its reads, else a :class:`PrefetchedStream` over it (see the
    module doc)."""
    if not chunks and error is None:
        on_drained()
        if on_pace is None:
            return raw
        on_drained = _nothing
    return cast(BinaryIO, PrefetchedStream(raw, chunks, error, on_drained, recycle,
                                           on_pace=on_pace))


def _nothing() -> None:
    pass


class PrefetchedStream(io.RawIOBase):
    """The pre-read ``chunks`` of a stream, then the rest of ``raw`` (see the module doc).

    ``chunks`` is consumed in place.
    """

    def __init__(self, raw: BinaryIO, chunks: deque[Chunk], error: Exception | None,
                 on_drained: Callable[[], None],
                 recycle: Callable[[Chunk], None] | None = None, *,
                 on_pace: Callable[[int, float], None] | None = None) -> None:
        super().__init__()
        self._on_pace = on_pace
        self._raw = raw
        self._chunks = chunks
        self._recycle = recycle
        self._spent: list[Chunk] = []  # chunks served in full, recycled once copied out
        self._offset = 0  # bytes of chunks[0] already served
        self._error = error
        self._on_drained: Callable[[], None] | None = on_drained
        self._pos = 0

    def __getattr__(self, name: str) -> Any:
        raw = self.__dict__.get("_raw")  # absent while unpickling or before __init__
        if raw is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(raw, name)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        self._check_open()
        parts, want = self._serve(-1 if size is None or size < 0 else size)
        if not self._chunks:
            self._drained()
            if want != 0 and (not parts or self._error is None):
                try:
                    parts.append(self._read_raw(want))
                except Exception as exc:
                    if not parts:
                        raise
                    self._error = exc  # serve what we have; the next read raises it
        data = b"".join(parts)  # one copy; a whole ``bytes`` chunk alone is not copied
        self._give_back()
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._error is not None or not hasattr(self._raw, "readinto"):
            data = self.read(len(view))
            view[:len(data)] = data
            return len(data)
        self._check_open()
        if not self._chunks:
            start = time.perf_counter()
            n = cast(int, self._raw.readinto(view)) or 0
            if self._on_pace is not None:
                self._on_pace(n, time.perf_counter() - start)
            self._pos += n
            return n
        parts, _ = self._serve(len(view))  # pre-read bytes, copied once, into ``view``
        n = 0
        for part in parts:
            view[n:n + len(part)] = part
            n += len(part)
        self._give_back()
        if not self._chunks:
            self._drained()
        self._pos += n
        return n

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._raw.close()
        finally:
            self._spent.extend(self._chunks)
            self._chunks.clear()
            self._give_back()
            self._drained()
            super().close()

    def _serve(self, want: int) -> tuple[list[Chunk], int]:
        """Up to ``want`` pre-read bytes (all if negative): whole ``bytes`` chunks, or views
        into chunks to be copied out before :meth:`_give_back`. Returns them and what is still
        wanted (negative: all the rest)."""
        parts: list[Chunk] = []
        while self._chunks and want != 0:
            head = self._chunks[0]
            left = len(head) - self._offset
            take = left if want < 0 else min(want, left)
            if take == len(head) and isinstance(head, bytes):
                parts.append(head)
            else:
                parts.append(memoryview(head)[self._offset:self._offset + take])
            self._offset += take
            if take == left:
                self._spent.append(self._chunks.popleft())
                self._offset = 0
            if want > 0:
                want -= take
        return parts, want

    def _give_back(self) -> None:
        """Hand the chunks served in full to ``recycle``: their bytes are copied out."""
        spent, self._spent = self._spent, []
        if self._recycle is not None:
            for chunk in spent:
                self._recycle(chunk)

    def _read_raw(self, size: int) -> bytes:
        if self._error is not None:
            raise self._error
        start = time.perf_counter()
        data: bytes = self._raw.read(size)
        if self._on_pace is not None:
            self._on_pace(len(data), time.perf_counter() - start)
        return data

    def _drained(self) -> None:
        callback, self._on_drained = self._on_drained, None
        if callback is not None:
            callback()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


class Pieces:
    """Buffers of ``size`` bytes that pre-read chunks are read into, and read into again once
    the chunk's bytes are consumed (:meth:`give`, a :class:`PrefetchedStream`'s ``recycle``):
    memory the process already touched, not new pages for every byte read ahead."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self._closed = False

    def read(self, read_into: Callable[[memoryview], int | None],
             want: int) -> tuple[Chunk, Exception | None]:
        """Up to ``want`` bytes (fewer only at the end of the stream, or before an error)
        read into a buffer: the view of them (empty at the end), and the error that stopped
        the read after some bytes, which comes after them."""
        with self._lock:
            piece = self._free.pop() if self._free else None
        if piece is None or len(piece) < want:
            piece = bytearray(max(want, self.size))
        view = memoryview(piece)[:want]
        n = 0
        try:
            while n < want:
                got = read_into(view[n:])
                if not got:
                    break
                n += got
        except Exception as exc:
            if n:
                return view[:n], exc
            self.give(view)
            raise
        if not n:
            self.give(view)
            return b"", None
        return view[:n], None

    def give(self, chunk: Chunk) -> None:
        """A chunk whose bytes are consumed: its buffer is read into again."""
        if isinstance(chunk, memoryview) and isinstance(chunk.obj, bytearray):
            piece = chunk.obj
            try:
                chunk.release()
            except BufferError:  # still exported somewhere: never written into again
                return
            with self._lock:
                if not self._closed:
                    self._free.append(piece)

    def close(self) -> None:
        """Let the buffers go; those given back later are dropped."""
        with self._lock:
            self._closed = True
            self._free.clear()
