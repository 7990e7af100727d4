"""Filling a cache entry while it is read (see :mod:`wds_cloud.cache`).

The process that downloads an entry reads the store's response through a :class:`TeeStream`:
the reader gets each piece as it arrives, exactly as without a cache, and the piece is handed
to the entry's :class:`Fill`; the process's one writer thread (``wds-cache-write``) writes it
to the file under ``partial/`` and adds it to the CRC-32. When all ``size`` bytes are written
the file goes to ``publish``; after an error, or when the reader closes with more than
:data:`FINISH_TAIL` bytes still to come, to ``abandon``. Either way ``release`` is called last.

Every other reader, in this process or another, follows the file as it grows with a
:class:`GrowingFile`, holding a shared ``flock`` on it so the entry is not evicted under it once
published. If the downloading process dies or gives up, ``reattach(pos, version)`` finds the
bytes from ``pos`` on elsewhere (the published entry, a new download, or the store).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from ..errors import CacheError, TransferError, WdsCloudError
from ..io.streams import SequentialStream

__all__ = ["FINISH_TAIL", "Fill", "FillGone", "GrowingFile", "TeeStream", "wait_fills"]

FINISH_TAIL = 1 << 20  # a reader closing this close to the end lets the download finish
_BACKLOG = 64 << 20  # bytes read, not yet written, in all fills, before readers wait for the disk
_POLL_FIRST, _POLL_MAX = 0.002, 0.05
_IDLE = 0.05  # seconds without a piece after which the writer checks for readers along
_SETTLE = 30.0  # seconds a reader at the end waits for the entry to be written and published


class FillGone(Exception):
    """The process filling an entry stopped before finishing it."""


class _Writer:
    """The one thread of a process (``wds-cache-write``) that writes its cache files, in the
    order pieces were fed: one writer keeps the disk and the kernel's page allocator from
    being contended by every download at once."""

    def __init__(self) -> None:
        self._items: deque[tuple[Fill, bytes | BaseException | None]] = deque()
        self._backlog = 0
        self._cond = threading.Condition()
        self.fills: set[Fill] = set()
        threading.Thread(target=self._run, name="wds-cache-write", daemon=True).start()

    def put(self, fill: Fill, item: bytes | BaseException | None) -> bool:
        """Queue ``item`` of ``fill``. A piece waits while the pieces of all fills not yet
        written add up to :data:`_BACKLOG` (memory stays bounded when the disk is slow); it is
        refused (``False``) once ``fill`` has ended."""
        with self._cond:
            if isinstance(item, bytes):
                self._cond.wait_for(lambda: self._backlog < _BACKLOG or fill.finished)
                if fill.finished:
                    return False
                self._backlog += len(item)
            self._items.append((fill, item))
            self._cond.notify_all()
            return True

    def start(self, fill: Fill) -> None:
        with self._cond:
            self.fills.add(fill)
            self._cond.notify_all()  # from waiting for ever to checking on idle readers

    def _run(self) -> None:
        checked = time.monotonic()
        while True:
            with self._cond:
                if not self._items:  # no fill: sleep until one starts; else check on them
                    self._cond.wait(_IDLE if self.fills else None)
                fill, item = self._items.popleft() if self._items else (None, None)
            if time.monotonic() - checked >= _IDLE:  # even while other fills keep it busy
                self._idle()
                checked = time.monotonic()
            if fill is None:
                continue
            fill.handle(item)
            with self._cond:
                self._backlog -= len(item) if isinstance(item, bytes) else 0
                self._cond.notify_all()

    def _idle(self) -> None:
        now = time.monotonic()
        for fill in list(self.fills):
            if now - fill.fed_at > _IDLE and fill.on_idle is not None:
                fill.on_idle()


_writers: dict[int, _Writer] = {}
_writers_lock = threading.Lock()


def wait_fills(timeout: float | None = None) -> bool:
    """Wait until this process's fills have ended (published or dropped); ``False`` if some
    were still running after ``timeout`` seconds."""
    writer = _writers.get(os.getpid())
    deadline = None if timeout is None else time.monotonic() + timeout
    for fill in list(writer.fills) if writer is not None else []:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        fill.wait_finished(left)
    return writer is None or not writer.fills


def _writer() -> _Writer:
    """This process's writer (per process id: a forked child starts its own)."""
    pid = os.getpid()
    with _writers_lock:
        if pid not in _writers:
            _writers[pid] = _Writer()
        return _writers[pid]


class Fill:
    """Writes the ``size`` bytes of one entry to the descriptor ``fd`` as they are fed."""

    def __init__(
        self, fd: int, size: int, *, label: str, publish: Callable[[Fill], None],
        abandon: Callable[[Fill, BaseException], None], release: Callable[[], None],
    ) -> None:
        self.fd, self.size, self.label = fd, size, label
        self._publish, self._abandon, self._release = publish, abandon, release
        self.written = 0
        self.crc32 = 0
        self.error: BaseException | None = None
        self.finished = False
        self.on_idle: Callable[[], None] | None = None
        self.fed_at = time.monotonic()
        self._cond = threading.Condition()
        self._writer = _writer()

    def start(self) -> None:
        self._writer.start(self)

    def feed(self, piece: bytes) -> bool:
        """Queue ``piece`` for writing (waiting while the disk is far behind); ``False`` once
        writing has failed (a full disk): the entry is dropped, the reader goes on."""
        self.fed_at = time.monotonic()
        return self._writer.put(self, piece)

    def end(self, failure: BaseException | None = None) -> None:
        """No more pieces: publish once written, or give up because of ``failure``."""
        self._writer.put(self, failure)

    def wait_finished(self, timeout: float | None) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.finished, timeout=timeout)

    def wait_written(self, pos: int) -> int:
        """How many bytes are written, once more than ``pos`` are; the fill's error if it
        ended first."""
        with self._cond:
            self._cond.wait_for(lambda: self.written > pos or self.finished)
            if self.written > pos:
                return self.written
            raise self.error or CacheError(
                f"the cache entry of {self.label} was dropped at byte {self.written}")

    def handle(self, item: bytes | BaseException | None) -> None:
        """In the writer: write a piece, or finish on the end marker (``None``: publish)."""
        if self.finished:
            return
        try:
            if isinstance(item, bytes):
                self._write(item)
                return
            if item is not None:
                raise item
            if self.written != self.size:
                raise TransferError(f"{self.label} ended at byte {self.written} of {self.size}"
                                    "; nothing was cached", url=self.label, offset=self.written)
            self._publish(self)
        except BaseException as exc:  # handed to the reader, never lost
            with self._cond:
                self.error = _as_cache_error(exc, self.label)
            self._abandon(self, exc)
        self._writer.fills.discard(self)
        os.close(self.fd)
        self._release()
        with self._cond:
            self.finished = True
            self._cond.notify_all()

    def _write(self, piece: bytes) -> None:
        with memoryview(piece) as view:
            done = 0
            while done < len(view):
                done += os.write(self.fd, view[done:])
        self.crc32 = zlib.crc32(piece, self.crc32)
        with self._cond:
            self.written += len(piece)
            self._cond.notify_all()


class _Cancelled(Exception):
    """The reader closed far from the end: the download is dropped."""


def _as_cache_error(exc: BaseException, label: str) -> BaseException | None:
    """What readers are told: the store's errors as they are, a local write error (a full disk)
    as :class:`CacheError`; nothing for a cancelled fill."""
    if isinstance(exc, _Cancelled):
        return None
    if isinstance(exc, OSError) and not isinstance(exc, WdsCloudError):
        error = CacheError(f"cannot write the cache entry of {label}: {exc}")
        error.__cause__ = exc
        return error
    return exc


class TeeStream(SequentialStream):
    """The store's stream ``remote`` read by the downloading process, every piece also fed to
    ``fill``; starts at byte ``pos`` (the bytes before it are still fed).

    The reader pulls from the store itself, so the download goes at its pace, as without a
    cache. When readers in other processes wait on the file (they hold shared locks on it,
    which ``probe_fd`` detects) while this one is idle, or when this one closes early, a
    thread (``wds-cache-pump``) pulls the rest; this reader then catches up from the file, or,
    if the file could not be written, from ``reopen(pos)``: the store's stream from ``pos``.
    """

    def __init__(self, remote: BinaryIO, fill: Fill, *, version: str | None, probe_fd: int,
                 reopen: Callable[[int], BinaryIO], pos: int = 0) -> None:
        super().__init__()
        self._reopen = reopen
        self._delegate: BinaryIO | None = None
        self._remote, self._fill, self._version, self._fd = remote, fill, version, probe_fd
        self._size = fill.size
        self._readinto = cast(Any, remote).readinto
        self._pos = self._fed = 0
        self._done = self._pumping = False
        self._feeding = True
        self._lock = threading.Lock()  # held while pulling from the store
        self._state = threading.Lock()  # guards the probe descriptor and the pump's hand-off
        self._closing = False
        fill.on_idle = self._on_idle
        if pos:
            self._skip(pos)

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed cache stream")
        view = memoryview(buffer).cast("B")
        if self._pos >= self._fill.size:
            self._finish()
            return 0
        if not len(view):
            return 0
        with self._lock:
            if self._fed == self._pos:
                n = self._pull(view)
                self._pos += n
                return n
        if self._delegate is None:
            try:
                have = self._fill.wait_written(self._pos)  # the pump went ahead: read it back
            except CacheError:  # it could not be written (a full disk): ask the store again
                self._delegate = self._reopen(self._pos)
            else:
                with self._state:
                    n = os.preadv(self._fd, [view[: have - self._pos]], self._pos)
                self._pos += n
                return n
        n = cast(Any, self._delegate).readinto(view) or 0
        self._pos += n
        return n

    def _pull(self, view: memoryview) -> int:
        """The next piece from the store into ``view``, fed to the fill (lock held)."""
        try:
            n = self._readinto(view[: self._fill.size - self._fed])
            if not n:
                raise TransferError(f"{self._fill.label} ended at byte {self._fed} of "
                                    f"{self._fill.size}", url=self._fill.label, offset=self._fed)
            if self._feeding:
                self._feeding = self._fill.feed(bytes(view[:n]))
        except BaseException as exc:
            self._end(exc)
            raise
        self._fed += n
        if self._fed >= self._fill.size:
            self._end(None)
        return n

    def _skip(self, pos: int) -> None:
        buffer = bytearray(min(pos, 4 << 20))
        while self._pos < pos:
            if not self.readinto(memoryview(buffer)[: pos - self._pos]):
                raise TransferError(f"{self._fill.label} ended before byte {pos}",
                                    url=self._fill.label, offset=self._pos)

    def _end(self, failure: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._fill.end(failure)

    def _finish(self) -> None:
        """All bytes read: wait for them to be written and the entry published (a script
        that exits right after reading would otherwise kill the writer first)."""
        self._end(None)
        self._fill.wait_finished(_SETTLE)

    def _followed(self) -> bool:
        """Whether a reader elsewhere holds a shared lock on the file (is reading along)."""
        with self._state:
            if self._fd < 0:
                return False
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            return False

    def _on_idle(self) -> None:
        """Called by the writer thread, which must never wait: a reader holding the lock is
        pulling, so no pump is needed."""
        if not self._done and not self._pumping and self._feeding and self._followed():
            self._start_pump(wait=False)

    def _start_pump(self, *, wait: bool = True) -> None:
        if not self._lock.acquire(blocking=wait):
            return
        try:
            if self._pumping or self._done:
                return
            self._pumping = True
        finally:
            self._lock.release()
        threading.Thread(target=self._pump, name="wds-cache-pump", daemon=True).start()

    def _pump(self) -> None:
        view = memoryview(bytearray(1 << 20))
        try:
            while not self._done and self._feeding:
                with self._lock:
                    if self._done or not self._feeding:
                        break
                    self._pull(view)
        except BaseException:
            pass
        finally:
            with self._state:
                self._pumping = False
                orphaned = self._closing
            if orphaned:
                self._remote.close()

    def close(self) -> None:
        if self.closed:
            return
        left = self._fill.size - self._fed
        if self._done or left <= 0:
            self._finish()
        elif left <= FINISH_TAIL or self._pumping or self._followed():
            self._start_pump()  # a tar reader stops before the padding; others read along
            if left <= FINISH_TAIL:
                self._fill.wait_finished(_SETTLE)
        else:
            self._end(_Cancelled())
        super().close()
        with self._state:
            self._closing = True
            pumping = self._pumping
            fd, self._fd = self._fd, -1
            os.close(fd)
        if not pumping:  # else the pump closes it when done
            self._remote.close()
        if self._delegate is not None:
            self._delegate.close()


class GrowingFile(SequentialStream):
    """A read stream over an entry another reader is downloading (in this process or another).

    ``probe(fd)`` is called when the file makes no progress: it returns while the download is
    alive or done and raises :class:`FillGone` when it is not.
    """

    def __init__(
        self, fd: int, *, size: int, version: str | None, pos: int,
        probe: Callable[[int], None], reattach: Callable[[int, str | None], BinaryIO],
    ) -> None:
        super().__init__()
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd, self._size, self._version, self._pos = fd, size, version, pos
        self._stop = size
        self._probe, self._reattach = probe, reattach
        self._delegate: BinaryIO | None = None
        self._io = threading.Lock()
        self._delay = _POLL_FIRST

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while True:
            if self._delegate is not None:
                n = self._delegate.readinto(view)  # type: ignore[attr-defined]
                self._pos += n or 0
                return n or 0
            if self.closed:
                raise ValueError("I/O operation on closed cache stream")
            if self._pos >= self._stop or not len(view):
                return 0
            with self._io:  # close() from another thread must not free the fd mid-read
                if self._fd < 0:
                    continue
                have = os.fstat(self._fd).st_size
                n = os.preadv(self._fd, [view[: have - self._pos]], self._pos) \
                    if have > self._pos else 0
            if n:
                self._pos += n
                self._delay = _POLL_FIRST
                return n
            self._wait()

    def _wait(self) -> None:
        time.sleep(self._delay)
        self._delay = min(2 * self._delay, _POLL_MAX)
        if os.fstat(self._fd).st_size > self._pos:
            return
        try:
            self._probe(self._fd)
        except FillGone:
            self._delegate = self._reattach(self._pos, self._version)
            self._close_fd()

    def _close_fd(self) -> None:
        with self._io:
            fd, self._fd = self._fd, -1
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        if not self.closed:
            self._close_fd()
            if self._delegate is not None:
                self._delegate.close()
        super().close()
