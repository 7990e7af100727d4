"""Read-ahead: open the next shards in the background while the current one is consumed.

:class:`ReadAhead` wraps a stream-opening callable (``open_stream(url) -> BinaryIO``) and a
source of ``{"url": ...}`` items (or URL strings)::

    with ReadAhead(open_stream, depth=2, max_bytes=64 << 20) as ra:
        for item in ra.sources(src):
            stream = ra.open(item["url"])   # the stream prepared for this item
            ...

Contract:

- ``sources(src)`` yields the items of ``src`` unchanged and in order. When it yields item *k*,
  items *k+1 … k+depth* have been pulled from ``src`` and are being opened by at most ``depth``
  daemon threads named ``wds-readahead``; item *k+depth+1* is not pulled before the consumer asks
  for item *k+1*. Items without a URL pass through without being opened.
- Each prepared shard is opened exactly once with ``open_stream(url)``; then up to
  ``max_bytes // depth`` of its first bytes are read. The pre-read bytes of all shards not yet
  consumed never exceed ``max_bytes`` (0: open ahead without pre-reading).
- ``open(url)`` returns the stream prepared for the item just yielded, waiting for it if it is
  still being opened; the stream serves the pre-read bytes, then reads on from the underlying
  stream, and forwards other attributes (``local_path``, ``name``, …) to it. If the background
  open failed, ``open`` raises that very exception; an error met while pre-reading is raised by
  ``read`` once the bytes read before it were served. Any other URL (or any keyword option, or
  ``depth=0``) is opened directly with ``open_stream``.
- A shard opened ahead and never asked for (the consumer skipped it, stopped, or failed) is
  closed. ``close()`` (also ``__exit__`` and closing the ``sources`` generator) stops pulling
  from ``src``, closes every prepared stream (a stream in the middle of a read is closed from
  another thread, so a stalled read cannot hold ``close`` up), and joins the threads for at most
  about a second; the threads are daemons, so none can hold up interpreter exit.

This module is layer-neutral: standard library only; its values come as arguments.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, TypeVar, cast

from .errors import ConfigError
from .urls import redact

__all__ = ["ReadAhead", "ReadAheadStats"]

log = logging.getLogger(__name__)

T = TypeVar("T")

THREAD_NAME = "wds-readahead"
_PIECE = 1 << 20  # pre-read in pieces of this size, checking for cancellation in between
_JOIN_TIMEOUT = 1.0  # seconds close() waits, in all, for busy threads

_QUEUED, _OPENING, _READING, _READY, _TAKEN, _CLOSED = range(6)


@dataclass(frozen=True)
class ReadAheadStats:
    """Counters of one :class:`ReadAhead` (a snapshot).

    ``opened_ahead``: shards opened in the background (``failed``: background opens that
    raised); ``hits``: shards ready when asked for; ``waits``/``wait_seconds``: shards asked for
    while still being opened, and the time spent waiting for them; ``direct``: opens done in the
    caller (not prepared, other URL, read-ahead off); ``discarded``: prepared shards closed
    unused; ``bytes_prefetched``: bytes pre-read in all; ``peak_bytes``: most pre-read bytes
    held at once, not yet consumed.
    """

    opened_ahead: int = 0
    failed: int = 0
    hits: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    direct: int = 0
    discarded: int = 0
    bytes_prefetched: int = 0
    peak_bytes: int = 0


class _Slot:
    """One shard being prepared; ``state`` and the fields below change under the owner's lock."""

    __slots__ = ("chunks", "done", "error", "read_error", "reserved", "state", "stream", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.state = _QUEUED
        self.stream: BinaryIO | None = None
        self.chunks: deque[bytes] = deque()
        self.reserved = 0  # bytes of the budget held: reserved before, then pre-read
        self.error: BaseException | None = None  # the open failed
        self.read_error: Exception | None = None  # the pre-read failed after some bytes
        self.done = threading.Event()


def _url_of(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    url = item.get("url") if isinstance(item, dict) else None
    return url if isinstance(url, str) else None


def _close_quietly(stream: Any) -> None:
    try:
        stream.close()
    except Exception as exc:  # closing a shard nobody reads: nothing to report but a log line
        log.debug("read-ahead: closing an unused stream failed: %r", exc)


class ReadAhead:
    """Opens the next ``depth`` shards of a source in the background (see the module doc)."""

    def __init__(self, open_stream: Callable[..., BinaryIO], *, depth: int = 2,
                 max_bytes: int = 64 << 20) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ConfigError(f"read-ahead depth must be an integer >= 0, got {depth!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f"read-ahead max_bytes must be an integer >= 0, got {max_bytes!r}")
        self._open_stream = open_stream
        self.depth = depth
        self.max_bytes = max_bytes
        self._per_shard = max_bytes // depth if depth else 0
        self._lock = threading.Lock()
        self._queue: deque[_Slot] = deque()  # slots no thread has claimed yet, in order
        self._pending: deque[tuple[Any, _Slot | None]] = deque()  # pulled, not yet yielded
        self._current: _Slot | None = None  # the slot of the item just yielded
        self._threads: list[threading.Thread] = []
        self._workers = 0
        self._in_flight = 0  # budget held: reserved and pre-read bytes not yet consumed
        self._buffered = 0  # pre-read bytes not yet consumed
        self._stats = ReadAheadStats()
        self._closed = False
        self._started = False

    @property
    def stats(self) -> ReadAheadStats:
        """A snapshot of the counters."""
        with self._lock:
            return self._stats

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReadAhead(depth={self.depth}, max_bytes={self.max_bytes})"

    # -- the consumer's side -----------------------------------------------------------------

    def sources(self, src: Iterable[T]) -> Generator[T, None, None]:
        """The items of ``src``, in order, with the next ``depth`` shards opened ahead.

        One call per ReadAhead; closing the generator closes the ReadAhead.
        """
        if self._started or self._closed:
            raise RuntimeError("ReadAhead.sources() may be called once, before close()")
        self._started = True
        if self.depth == 0:
            yield from src
            return
        it = iter(src)
        try:
            while True:
                self._discard_current()
                self._fill(it)
                with self._lock:
                    if self._closed or not self._pending:
                        return
                    item, self._current = self._pending.popleft()
                yield item
        finally:
            self.close()

    def _fill(self, it: Any) -> None:
        """Pull from ``it`` until ``depth`` items wait behind the one to yield next."""
        while len(self._pending) <= self.depth and not self._closed:
            try:
                item = next(it)
            except StopIteration:
                return
            url = _url_of(item)
            slot = None if url is None else self._schedule(url)
            with self._lock:
                self._pending.append((item, slot))

    def open(self, url: str, **options: Any) -> BinaryIO:
        """The stream prepared for the item just yielded if it has this URL, else a direct open.

        Raises the background open's exception when that failed.
        """
        with self._lock:
            slot = self._current
            if slot is None or slot.url != url or options or slot.state == _TAKEN:
                slot = None
            else:
                self._current = None
                if slot.state == _QUEUED:  # no thread got to it yet: open it here
                    self._queue.remove(slot)
                    slot.state = _TAKEN
                    slot = None
        if slot is None:
            with self._lock:
                self._count(direct=1)
            log.debug("read-ahead: opening %s directly", redact(url))
            return self._open_stream(url, **options)
        return self._take(slot)

    def _take(self, slot: _Slot) -> BinaryIO:
        ready, waited = slot.done.is_set(), 0.0
        if not ready:
            start = time.monotonic()
            slot.done.wait()
            waited = time.monotonic() - start
        with self._lock:
            slot.state = _TAKEN
            self._count(hits=1) if ready else self._count(waits=1, wait_seconds=waited)
        how = "ready" if ready else f"waited {waited:.3f} s"
        if slot.error is not None:
            log.debug("read-ahead: %s %s, its open failed", redact(slot.url), how)
            error, slot.error = slot.error, None
            raise error
        log.debug("read-ahead: %s %s, %d bytes pre-read", redact(slot.url), how, slot.reserved)
        stream = cast(BinaryIO, slot.stream)
        if not slot.chunks and slot.read_error is None:
            self._release(slot.reserved)
            return stream
        reserved = slot.reserved
        return cast(BinaryIO, _PrefetchedStream(
            stream, slot.chunks, slot.read_error, lambda: self._release(reserved)))

    def _count(self, **deltas: float) -> None:
        """Add to the counters (the caller holds the lock)."""
        s = self._stats
        self._stats = replace(s, **{k: getattr(s, k) + v for k, v in deltas.items()})

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self._in_flight -= nbytes
            self._buffered -= nbytes

    # -- background threads ------------------------------------------------------------------

    def _schedule(self, url: str) -> _Slot:
        slot = _Slot(url)
        with self._lock:
            self._queue.append(slot)
            if self._workers >= self.depth:
                return slot
            self._workers += 1
            self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no new threads (interpreter shutdown): open() opens directly
            with self._lock:
                self._workers -= 1
            return slot
        with self._lock:
            self._threads.append(thread)
        return slot

    def _work(self) -> None:
        """Prepare queued slots one after the other; end when none is left."""
        while True:
            with self._lock:
                if self._closed or not self._queue:
                    self._workers -= 1
                    return
                slot = self._queue.popleft()
                slot.state = _OPENING
            try:
                self._prepare(slot)
            finally:
                slot.done.set()

    def _prepare(self, slot: _Slot) -> None:
        try:
            stream = self._open_stream(slot.url)
        except BaseException as exc:  # handed to the consumer, who raises it in open()
            with self._lock:
                slot.error, slot.state = exc, _READY
                self._count(failed=1)
            return
        with self._lock:
            slot.stream = stream
            self._count(opened_ahead=1)
            if slot.state == _CLOSED:  # discarded while opening
                cancelled = True
            else:
                cancelled = False
                slot.state = _READING
                slot.reserved = min(self._per_shard, self.max_bytes - self._in_flight)
                self._in_flight += slot.reserved
        if not cancelled:
            self._preread(slot, stream)
            with self._lock:
                cancelled = slot.state == _CLOSED
                if not cancelled:
                    slot.state = _READY
        if cancelled:
            _close_quietly(stream)
            self._forget(slot)

    def _preread(self, slot: _Slot, stream: BinaryIO) -> None:
        """Read up to ``slot.reserved`` bytes, then give back the unused part of the budget."""
        got = 0
        try:
            while got < slot.reserved and slot.state == _READING:
                data = stream.read(min(_PIECE, slot.reserved - got))
                if not data:
                    break
                if not isinstance(data, bytes):
                    data = bytes(data)
                slot.chunks.append(data)
                got += len(data)
                with self._lock:
                    self._buffered += len(data)
                    self._count(bytes_prefetched=len(data),
                                peak_bytes=max(0, self._buffered - self._stats.peak_bytes))
        except Exception as exc:  # raised by read() once the bytes before it were served
            slot.read_error = exc
        with self._lock:
            self._in_flight -= slot.reserved - got
            slot.reserved = got

    def _forget(self, slot: _Slot) -> None:
        """Give back the budget of a discarded slot."""
        with self._lock:
            held, slot.reserved = slot.reserved, 0
            self._in_flight -= held
            self._buffered -= sum(len(c) for c in slot.chunks)
            slot.chunks.clear()

    # -- discarding and closing --------------------------------------------------------------

    def _discard(self, slot: _Slot) -> BinaryIO | None:
        """Mark ``slot`` closed (under the lock); returns a stream the caller must close now,
        or None (not opened yet, or its thread will close it)."""
        state, slot.state = slot.state, _CLOSED
        self._count(discarded=1)
        if state == _QUEUED:
            self._queue.remove(slot)
        if state != _READY or slot.stream is None:
            return None
        return slot.stream

    def _discard_current(self) -> None:
        with self._lock:
            slot, self._current = self._current, None
            stream = None if slot is None or slot.state == _TAKEN else self._discard(slot)
        if slot is not None and stream is not None:
            log.debug("read-ahead: %s was not asked for; closing it", redact(slot.url))
            _close_quietly(stream)
            self._forget(slot)

    def close(self) -> None:
        """Stop pulling, close every prepared stream, let the threads end (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots = [s for _, s in self._pending if s is not None]
            if self._current is not None and self._current.state != _TAKEN:
                slots.append(self._current)
            self._pending.clear()
            self._current = None
            busy = [s.stream for s in slots if s.state == _READING]
            ready = [s for s in slots if s.state == _READY]
            for slot in slots:
                self._discard(slot)
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for slot in ready:
            _close_quietly(slot.stream)
            self._forget(slot)
        if sys.is_finalizing():  # daemon threads are frozen now: joining them would only wait
            return
        deadline = time.monotonic() + _JOIN_TIMEOUT
        if busy:
            threads += self._close_from_aside(busy)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            log.debug("read-ahead: %d thread(s) still busy after close; they are daemons",
                      sum(t.is_alive() for t in threads))

    def _close_from_aside(self, streams: list[BinaryIO | None]) -> list[threading.Thread]:
        """Close streams that a thread is reading from another thread (closing a buffered
        stream waits for the read in progress to return)."""
        def close_all() -> None:
            for stream in streams:
                if stream is not None:
                    _close_quietly(stream)

        closer = threading.Thread(target=close_all, name=THREAD_NAME + "-close", daemon=True)
        try:
            closer.start()
        except RuntimeError:  # interpreter shutdown: the daemon readers die with it
            return []
        return [closer]


class _PrefetchedStream(io.RawIOBase):
    """The pre-read bytes of a shard, then the rest of its stream; other attributes are the
    underlying stream's. Closing it closes the underlying stream."""

    def __init__(self, raw: BinaryIO, chunks: deque[bytes], error: Exception | None,
                 on_drained: Callable[[], None]) -> None:
        super().__init__()
        self._raw = raw
        self._chunks = chunks
        self._offset = 0  # position in chunks[0]
        self._error = error
        self._on_drained: Callable[[], None] | None = on_drained
        self._pos = 0

    def __getattr__(self, name: str) -> Any:
        raw = self.__dict__.get("_raw")
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
        if self.closed:
            raise ValueError("I/O operation on closed file")
        want = -1 if size is None or size < 0 else size
        parts: list[bytes] = []
        while self._chunks and want != 0:
            head, start = self._chunks[0], self._offset
            if want < 0 or want >= len(head) - start:
                parts.append(head[start:] if start else head)
                self._chunks.popleft()
                self._offset = 0
            else:
                parts.append(head[start:start + want])
                self._offset += want
            if want > 0:
                want -= len(parts[-1])
        if not self._chunks:
            self._drained()
            if want != 0 and not parts:
                parts.append(self._read_raw(want))
            elif want != 0 and self._error is None:
                try:
                    parts.append(self._read_raw(want))
                except Exception as exc:  # serve what we have; the next read raises it
                    self._error = exc
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self._pos += len(data)
        return data

    def _read_raw(self, size: int) -> bytes:
        if self._error is not None:
            raise self._error
        return self._raw.read(size)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._chunks or self._error is not None or not hasattr(self._raw, "readinto"):
            data = self.read(len(view))
            view[:len(data)] = data
            return len(data)
        if self.closed:
            raise ValueError("I/O operation on closed file")
        n = cast(int, self._raw.readinto(view))
        self._pos += n or 0
        return n

    def _drained(self) -> None:
        callback, self._on_drained = self._on_drained, None
        if callback is not None:
            callback()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._raw.close()
        finally:
            self._chunks.clear()
            self._drained()
            super().close()
