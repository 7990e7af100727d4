"""Read-ahead: open the next shards in the background while the current one is consumed.

:class:`ReadAhead` wraps a stream-opening callable (``open_stream(url) -> BinaryIO``) and a
source of ``{"url": ...}`` items (or URL strings)::

    with ReadAhead(open_stream, depth=2, max_bytes=64 << 20) as ra:
        for item in ra.sources(src):
            stream = ra.open(item["url"])   # the stream prepared for this item
            ...

Contract:

- ``sources(src)`` yields the items of ``src`` unchanged and in order. When it yields item *k*,
  items *k+1 … k+n* have been pulled from ``src`` and are being opened by at most ``depth``
  daemon threads named ``wds-readahead`` (a thread with nothing to open waits a few seconds for
  the next shard before it ends); item *k+n+1* is not pulled before the consumer asks for
  item *k+1*. ``n`` is ``depth`` while pre-reading pays (below), else ``min(depth, lead)``
  (default 1): opening a shard ahead costs a request (S3 and GCS bill each GET) that is wasted
  if the run stops before it, and while the connections keep up with their consumer one shard
  opened ahead hides the next one's first-byte latency; more only pay where shards come faster
  on many connections at once. So a run stopped early wastes at most ``lead`` GETs per
  ReadAhead while its connections keep up. Items without a URL pass through without being
  opened. An item marked ``{"url": ..., "readahead": False}`` comes from a queue that recycles
  a shard when the next one is asked for (``DirectoryShardList``): from it on nothing is
  pulled ahead.
- ``worth(url)``, when given, says which URLs are worth opening ahead (those whose first byte
  is a round trip away); the others are opened by ``open`` when their turn comes, as with
  ``depth=0``, and hold neither a thread nor memory before.
- Each prepared shard is opened exactly once with ``open_stream(url)``; then up to
  ``max_bytes // depth`` of its first bytes are read (above 1 MiB, in whole MiB), while
  pre-reading pays (below). The pre-read bytes of all shards not yet consumed never exceed
  ``max_bytes`` (0: open ahead without pre-reading). They are read into buffers of one size
  (1 MiB, or a shard's share if smaller) that the ReadAhead reuses once their bytes are
  consumed: memory the process already touched, not new pages for every byte read ahead.
- Pre-reading pays only where a connection is slower than its consumer: the consumer's reads
  of each shard after its pre-read bytes (also of a shard it asked for before any thread
  opened it, which ``open`` then opens itself) are timed and judged by ``pace`` (a
  :class:`~wds_cloud.io.pace.Pace`; by default one that starts without pre-reading). While
  its connections keep up, the shards opened are not pre-read; once they do not, the shards
  already opened ahead without pre-read bytes are pre-read too ("topped up"), each by a
  thread of the ReadAhead.
- ``open(url)`` returns the stream prepared for the item just yielded, waiting for it if it is
  still being opened; the stream serves the pre-read bytes, then reads on from the underlying
  stream, and forwards other attributes (``local_path``, ``name``, …) to it
  (:mod:`wds_cloud.io.prefetched`). If the background open failed, ``open`` raises that very
  exception; an error met while pre-reading is raised by ``read`` once the bytes read before it
  were served. Any other URL (or any keyword option, or ``depth=0``) is opened directly.
- A shard opened ahead and never asked for (the consumer skipped it, stopped, or failed) is
  closed, by its stream's ``close_unread()`` if it has one (a cache entry's download then
  stops, unless it is complete or others read along), else ``close()``. ``close()`` (also
  ``__exit__`` and closing the ``sources`` generator) stops pulling from ``src``, closes
  every prepared stream (a stream in the middle of a read is closed from
  another thread, so a stalled read cannot hold ``close`` up), and joins the threads for at most
  about a second; the threads are daemons, so none can hold up interpreter exit.

This module is layer-neutral: standard library only; its values come as arguments.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, BinaryIO, TypeVar, cast

from ..errors import ConfigError
from ..urls import redact
from .pace import Pace
from .prefetched import Chunk, Pieces, prefetched_stream

__all__ = ["ReadAhead", "ReadAheadStats"]

log = logging.getLogger(__name__)

T = TypeVar("T")

THREAD_NAME = "wds-readahead"
_PIECE = 1 << 20  # pre-read in pieces of this size, checking for cancellation in between
_JOIN_TIMEOUT = 1.0  # seconds close() waits, in all, for busy threads
_LINGER = 10.0  # seconds an idle thread waits for the next shard before it ends

# a slot goes _QUEUED -> _OPENING -> _READING -> _READY (an open that failed: straight to
# _READY), or to _CLOSED from any of these when discarded; a slot _READY without pre-read
# bytes may go on to _TOPPING (queued for a top-up), then _READING and _READY again; the
# consumer takes a slot out of ``_current`` and nothing looks at it after that
_QUEUED, _OPENING, _READING, _READY, _CLOSED, _TOPPING = range(6)


@dataclass(frozen=True)
class ReadAheadStats:
    """Counters of one :class:`ReadAhead` (a snapshot).

    ``opened_ahead``: shards opened in the background (``failed``: background opens that
    raised); ``hits``: shards ready when asked for; ``waits``/``wait_seconds``: shards asked for
    while still being opened, and the time spent waiting for them; ``direct``: opens done in the
    caller (not prepared, other URL, read-ahead off); ``discarded``: prepared shards closed
    unused; ``bytes_prefetched``: bytes pre-read in all; ``peak_bytes``: most pre-read bytes
    held at once, not yet consumed; ``pre_reading``: whether shards opened now are pre-read,
    ``turns``: how often that changed, ``topped_up``: shards pre-read after they were opened
    (see the module doc).
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
    pre_reading: bool = False
    turns: int = 0
    topped_up: int = 0


class _Slot:
    """One shard being prepared by a thread; ``state`` changes under the owner's lock."""

    __slots__ = ("chunks", "done", "error", "read_error", "reserved", "state", "stream", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.state = _QUEUED
        self.stream: BinaryIO | None = None
        self.chunks: deque[Chunk] = deque()
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
    """Close a stream opened ahead that its consumer never got: with its ``close_unread()``
    where it has one (a cache fill it feeds stops there, rather than finish the download for
    nobody), else ``close()``."""
    try:
        close = getattr(stream, "close_unread", None)
        (close if callable(close) else stream.close)()
    except Exception as exc:  # closing a shard nobody reads: nothing to report but a log line
        log.debug("read-ahead: closing an unused stream failed: %r", exc)


class ReadAhead:
    """Opens the next ``depth`` shards of a source in the background (see the module doc)."""

    def __init__(self, open_stream: Callable[..., BinaryIO], *, depth: int = 2,
                 max_bytes: int = 64 << 20, worth: Callable[[str], bool] | None = None,
                 pace: Pace | None = None, lead: int = 1) -> None:
        for name, value in (("depth", depth), ("max_bytes", max_bytes), ("lead", lead)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"read-ahead {name} must be an integer >= 0, got {value!r}")
        self._open_stream = open_stream
        self._worth = worth
        self.depth = depth
        self.lead = lead  # shards opened ahead while pre-reading does not pay (at most depth)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # a slot queued, or closed
        self._queue: deque[_Slot] = deque()  # slots no thread has claimed yet, in order
        self._topups: deque[_Slot] = deque()  # opened slots to pre-read, no thread on them yet
        self._pace = pace or Pace()  # whether pre-reading pays, judged by the consumer's reads
        self._pending: deque[tuple[Any, _Slot | None]] = deque()  # pulled, not yet yielded
        self._current: _Slot | None = None  # the slot of the item just yielded, until taken
        self._threads: list[threading.Thread] = []
        self._workers = 0
        self._idle = 0  # workers waiting for a slot (see _work)
        self._in_flight = 0  # budget held: reserved and pre-read bytes not yet consumed
        self._buffered = 0  # pre-read bytes not yet consumed (below _in_flight: a pre-read runs)
        self._stats = ReadAheadStats(pre_reading=self._pace.pays)
        self._pieces = Pieces(min(_PIECE, max_bytes // depth) if depth else _PIECE)
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
        """Pull from ``it`` until ``depth`` items (``lead`` while pre-reading does not pay)
        wait behind the one to yield next."""
        while len(self._pending) <= self._ahead() and not self._closed:
            try:
                item = next(it)
            except StopIteration:
                return
            if isinstance(item, dict) and item.get("readahead") is False:
                self.depth = 0  # a queue: asking for its next item would recycle this one
            url = _url_of(item)
            if isinstance(item, dict) and item.get("offset"):
                url = None  # resumed mid-shard: opened at its offset when its turn comes
            if url is not None and self._worth is not None and not self._worth(url):
                url = None  # opened by open() when its turn comes
            slot = None if url is None else self._schedule(url)
            with self._lock:
                self._pending.append((item, slot))

    def _ahead(self) -> int:
        """How many items to pull ahead now (see the module doc)."""
        return self.depth if self._pace.pays else min(self.depth, self.lead)

    def open(self, url: str, **options: Any) -> BinaryIO:
        """The stream prepared for the item just yielded if it has this URL, else a direct open.

        Raises the background open's exception when that failed.
        """
        paced = False
        with self._lock:
            slot = self._current
            if slot is not None and slot.url == url and not options:
                self._current = None
                if slot.state == _QUEUED:  # no thread got to it yet: open it here
                    self._queue.remove(slot)
                    slot, paced = None, True
                elif slot.state == _TOPPING:  # nor to its top-up: read it as it is
                    self._topups.remove(slot)
                    slot.state = _READY
                    slot.done.set()
            else:
                slot = None
            if slot is None:
                self._count(direct=1)
        if slot is not None:
            return self._take(slot)
        log.debug("read-ahead: opening %s directly", redact(url))
        stream = self._open_stream(url, **options)
        if paced and self.max_bytes:  # a shard of the queue: its reads are judged too
            return prefetched_stream(stream, deque(), None, partial(self._release, 0),
                                     on_pace=self._paced)
        return stream

    def _take(self, slot: _Slot) -> BinaryIO:
        """Wait for ``slot`` to be prepared; its stream, or its open's exception raised."""
        ready, start = slot.done.is_set(), time.monotonic()
        slot.done.wait()
        waited = time.monotonic() - start
        with self._lock:
            self._count(**{"hits": 1} if ready else {"waits": 1, "wait_seconds": waited})
        how = "ready" if ready else f"waited {waited:.3f} s"
        if slot.error is not None:
            log.debug("read-ahead: %s %s, its open failed", redact(slot.url), how)
            error, slot.error = slot.error, None
            raise error
        log.debug("read-ahead: %s %s, %d bytes pre-read", redact(slot.url), how, slot.reserved)
        return prefetched_stream(cast(BinaryIO, slot.stream), slot.chunks, slot.read_error,
                                 partial(self._release, slot.reserved), self._pieces.give,
                                 on_pace=self._paced if self.max_bytes else None)

    def _paced(self, nbytes: int, seconds: float) -> None:
        """The consumer read ``nbytes`` from a shard's connection in ``seconds``: start or
        stop pre-reading when that pays or stops paying (see :mod:`wds_cloud.io.pace`)."""
        prereading = self._in_flight > self._buffered  # bytes reserved, not read yet
        if not self._pace.note(nbytes, seconds, prereading=prereading):
            return
        with self._lock:
            if self._closed:
                return
            pays = self._pace.pays
            self._stats = replace(self._stats, pre_reading=pays, turns=self._stats.turns + 1)
            if pays:
                self._top_up()

    def _top_up(self) -> None:
        """Queue the slots opened ahead without pre-read bytes for a thread to pre-read, and
        wake the idle threads for them (the caller holds the lock)."""
        for _, slot in self._pending:
            if (slot is not None and slot.state == _READY and slot.stream is not None
                    and not slot.chunks and slot.read_error is None):
                slot.state = _TOPPING
                slot.done.clear()
                self._topups.append(slot)
        self._wake.notify(len(self._topups))

    def _count(self, **deltas: float) -> None:
        """Add to the counters (the caller holds the lock)."""
        s = self._stats
        self._stats = replace(s, **{k: getattr(s, k) + v for k, v in deltas.items()})

    def _release(self, nbytes: int) -> None:
        """Give back ``nbytes`` of pre-read bytes: consumed, or dropped with their stream."""
        with self._lock:
            self._in_flight -= nbytes
            self._buffered -= nbytes

    # -- background threads ------------------------------------------------------------------

    def _schedule(self, url: str) -> _Slot:
        """Queue ``url``; wake a waiting thread for it, or start one unless ``depth`` threads
        are at work."""
        slot = _Slot(url)
        with self._lock:
            self._queue.append(slot)
            if self._idle >= len(self._queue):
                self._wake.notify()
                return slot
            if self._workers >= self.depth:
                return slot
            self._workers += 1
            self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
        try:
            thread.start()  # outside the lock, so the thread can claim the slot at once
        except RuntimeError:  # no new threads (interpreter shutdown): open() opens directly
            with self._lock:
                self._workers -= 1
            return slot
        with self._lock:
            self._threads.append(thread)
        return slot

    def _work(self) -> None:
        """Prepare queued slots one after the other; end when none came for :data:`_LINGER`
        seconds (the next shard is usually scheduled before then: no thread to start for
        it, which takes a GIL hand-off from the consumer), or at close."""
        while True:
            with self._lock:
                if not (self._queue or self._topups) and not self._closed:
                    self._idle += 1
                    try:
                        self._wake.wait_for(
                            lambda: self._closed or bool(self._queue or self._topups), _LINGER)
                    finally:
                        self._idle -= 1
                if self._closed or not (self._queue or self._topups):
                    self._workers -= 1
                    return
                if self._queue:
                    slot, state, prepare = self._queue.popleft(), _OPENING, self._prepare
                else:  # a top-up: the slot's stream is open already
                    slot, state, prepare = self._topups.popleft(), _READING, self._read_ahead
                    self._count(topped_up=1)
                slot.state = state
            try:
                prepare(slot)
            finally:
                slot.done.set()

    def _prepare(self, slot: _Slot) -> None:
        """Open the shard of ``slot`` and pre-read its first bytes, unless it is discarded
        meanwhile: then close it."""
        try:
            slot.stream = self._open_stream(slot.url)
        except BaseException as exc:  # handed to the consumer, who raises it in open()
            with self._lock:
                slot.error, slot.state = exc, _READY
                self._count(failed=1)
            return
        with self._lock:
            self._count(opened_ahead=1)
        if self._advance(slot, _READING):
            self._read_ahead(slot)
        else:
            self._drop(slot)

    def _read_ahead(self, slot: _Slot) -> None:
        """Pre-read the opened ``slot`` (in state _READING) while pre-reading pays, unless it
        is discarded meanwhile: then close it."""
        self._preread(slot, cast(BinaryIO, slot.stream))
        if self._advance(slot, _READY):
            return
        self._drop(slot)

    def _advance(self, slot: _Slot, state: int) -> bool:
        """Move ``slot`` on to ``state``; False if it was discarded meanwhile."""
        with self._lock:
            if slot.state != _CLOSED:
                slot.state = state
            return slot.state == state

    def _preread(self, slot: _Slot, stream: BinaryIO) -> None:
        """Reserve a share of the budget (none while pre-reading does not pay), read up to
        that many bytes while the slot is not discarded, then give back the unused part of
        the budget."""
        with self._lock:
            paying = self._stats.pre_reading and self.depth
            share = self.max_bytes // self.depth if paying else 0
            if share > _PIECE:  # whole pieces: odd shares measured 5x the page faults
                share -= share % _PIECE
            slot.reserved = min(share, self.max_bytes - self._in_flight)
            self._in_flight += slot.reserved
        got = 0
        read_into = getattr(stream, "readinto", None)
        try:
            while got < slot.reserved and slot.state == _READING:
                want = min(_PIECE, slot.reserved - got)
                data: Chunk
                error: Exception | None
                if read_into is None:
                    data, error = bytes(stream.read(want)), None  # bytes already: no copy
                else:
                    data, error = self._pieces.read(read_into, want)
                if not data:
                    break
                slot.chunks.append(data)
                got += len(data)
                with self._lock:
                    self._buffered += len(data)
                    self._count(bytes_prefetched=len(data),
                                peak_bytes=max(0, self._buffered - self._stats.peak_bytes))
                if error is not None:
                    raise error
        except Exception as exc:  # raised by read() once the bytes before it were served
            slot.read_error = exc
        with self._lock:
            self._in_flight -= slot.reserved - got
            slot.reserved = got

    # -- discarding and closing --------------------------------------------------------------

    def _discard(self, slots: list[_Slot]) -> list[_Slot]:
        """Mark ``slots`` closed (the caller holds the lock); returns those whose stream the
        caller must drop now (the others are not opened yet, or their thread drops them)."""
        ready = []
        for slot in slots:
            if slot.state == _QUEUED:
                self._queue.remove(slot)
            elif slot.state == _TOPPING:
                self._topups.remove(slot)
                ready.append(slot)
            elif slot.state == _READY and slot.stream is not None:
                ready.append(slot)
            slot.state = _CLOSED
            self._count(discarded=1)
        return ready

    def _drop(self, slot: _Slot) -> None:
        """Close the stream of a discarded slot; give back its budget."""
        log.debug("read-ahead: %s was not asked for; closing it", redact(slot.url))
        _close_quietly(slot.stream)
        self._release(slot.reserved)  # its pre-read is over: all of it is in chunks
        slot.chunks.clear()

    def _discard_current(self) -> None:
        with self._lock:
            ready = self._discard([self._current] if self._current else [])
            self._current = None
        for slot in ready:
            self._drop(slot)

    def close(self) -> None:
        """Stop pulling, close every prepared stream, let the threads end (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
            self._pieces.close()
            slots = [s for _, s in self._pending if s is not None]
            if self._current is not None:
                slots.append(self._current)
            self._pending.clear()
            self._current = None
            busy = [cast(BinaryIO, s.stream) for s in slots if s.state == _READING]
            ready = self._discard(slots)
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for slot in ready:
            self._drop(slot)
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

    def _close_from_aside(self, streams: list[BinaryIO]) -> list[threading.Thread]:
        """Close streams that a thread is reading from another thread (closing a buffered
        stream waits for the read in progress to return)."""
        def close_all() -> None:
            for stream in streams:
                _close_quietly(stream)

        closer = threading.Thread(target=close_all, name=THREAD_NAME + "-close", daemon=True)
        try:
            closer.start()
        except RuntimeError:  # interpreter shutdown: the daemon readers die with it
            return []
        return [closer]
