"""Reading the store's stream of an entry being filled (see :mod:`wds_cloud.cache.fill`).

The downloading reader reads through a :class:`TeeStream`, which hands every piece to the
entry's :class:`~wds_cloud.cache.fill.Fill` before the reader sees it. When readers elsewhere
wait on an idle downloader, or it closes early while they read along, a pump thread pulls the
rest; a reader closing within :data:`FINISH_TAIL` of the end pulls the rest itself. A stream
that a read-ahead opened (perhaps pre-read) and dropped without handing it to a reader is
closed with :meth:`TeeStream.close_unread`: its download stops there, since nobody reads it.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from ..errors import CacheError, TransferError
from ..io.streams import SequentialStream
from .fill import Cancelled, Fill

__all__ = ["FINISH_TAIL", "TeeStream"]

FINISH_TAIL = 4 << 20  # a reader closing this close to the end lets the download finish
_SETTLE = 30.0  # seconds a reader at the end waits for the entry to be written and published


class TeeStream(SequentialStream):
    """The store's stream ``remote`` read by the downloading process, every piece also written
    to ``fill`` by the thread that read it; starts at byte ``pos`` (the bytes before it are
    still written).

    The reader pulls from the store itself, so the download goes at its pace, as without a
    cache. When readers in other processes wait on the file (they hold shared locks on it,
    which ``probe_fd`` detects) while this one is idle or closes early, a thread
    (``wds-cache-pump``) pulls the rest; this reader then catches up from the file, or, if the
    file could not be written, from ``reopen(pos)``: the store's stream from ``pos``. A close
    within :data:`FINISH_TAIL` of the end pulls the rest itself.
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
        self._unread = False  # closed by a read-ahead that never handed it to a reader
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

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes: while this reader is the one pulling from the store, the very
        ``bytes`` the store's stream returned (written to the fill first), with no buffer of
        its own to fill and copy."""
        if size is None or size < 0:
            return self.readall()
        if not self.closed and size and self._pos < self._fill.size:
            with self._lock:
                if self._fed == self._pos:
                    data = self._pull_bytes(size)
                    self._pos += len(data)
                    return data
        return cast(bytes, super().read(size))  # behind the pump, or done: as readinto says

    def _pull(self, view: memoryview) -> int:
        """The next piece from the store into ``view``, written to the fill (lock held)."""
        try:
            n = self._readinto(view[: self._fill.size - self._fed])
            self._feed(view[:n])
        except BaseException as exc:
            self._end(exc)
            raise
        return n

    def _pull_bytes(self, size: int) -> bytes:
        """The next piece from the store as the ``bytes`` it returned (lock held)."""
        try:
            data = self._remote.read(min(size, self._fill.size - self._fed))
            self._feed(memoryview(data))
        except BaseException as exc:
            self._end(exc)
            raise
        return data

    def _feed(self, piece: memoryview) -> None:
        """``piece`` came from the store: write it to the fill before the caller sees it (its
        buffer, not a copy), and publish after the last one."""
        if not len(piece):
            raise TransferError(f"{self._fill.label} ended at byte {self._fed} of "
                                f"{self._fill.size}", url=self._fill.label, offset=self._fed)
        if self._feeding:
            self._feeding = self._fill.write(piece)
        self._fed += len(piece)
        if self._fed >= self._fill.size:
            self._end(None)

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
        """All bytes read: wait for the entry to be published (by this thread as a rule; by
        the pump when it pulled the last piece, which a script exiting right after reading
        would otherwise kill first)."""
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
        """Called by the watcher thread, which must never wait: a reader holding the lock is
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

    def _pull_tail(self) -> None:
        """Pull the last bytes (at most :data:`FINISH_TAIL`) in the closing thread, which would
        otherwise start a pump and wait for it (a thread and a hand-off per shard: 10% of a
        first epoch of 16 MiB shards on loopback). After :data:`_SETTLE` seconds (a store
        holding the tail up) a pump takes over the rest and the close returns."""
        deadline = time.monotonic() + _SETTLE
        view = memoryview(bytearray(self._fill.size - self._fed))
        with self._lock:
            try:
                while not self._done and self._feeding and time.monotonic() < deadline:
                    self._pull(view)
            except Exception:  # the fill ended with it (and says why); this reader is done
                return
        if not self._done and self._feeding:
            self._start_pump()

    def close_unread(self) -> None:
        """Close a stream that no reader read (a read-ahead opened, perhaps pre-read, then
        dropped it): the download stops here, even within :data:`FINISH_TAIL` of the end,
        unless it is complete or readers elsewhere read along (then the pump goes on)."""
        self._unread = True
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        left = self._fill.size - self._fed
        if self._done or left <= 0:
            self._finish()
        elif self._unread and not (self._pumping or self._followed()):
            self._end(Cancelled())  # nobody reads it: no download for nobody
        elif left <= FINISH_TAIL and not self._pumping:
            self._pull_tail()  # a tar reader stops before the padding
        elif left <= FINISH_TAIL or self._pumping or self._followed():
            self._start_pump()  # others read along
            if left <= FINISH_TAIL:
                self._fill.wait_finished(_SETTLE)
        else:
            self._end(Cancelled())
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
