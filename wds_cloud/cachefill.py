"""Filling a cache entry while it is read (see :mod:`wds_cloud.cache`).

A :class:`Fill` copies one remote stream into the entry's file under ``partial/``: a daemon
thread named ``wds-cache-fill`` downloads into a few reused buffers while another,
``wds-cache-write``, writes them and computes the CRC-32; once all ``size`` bytes are there the
file goes to ``publish``; on any error, or when every reader of this process has closed before
the end, it hands it to ``abandon`` instead. Either way it then calls ``release``.

A :class:`GrowingFile` reads such a file from its own descriptor while it grows, holding a
shared ``flock`` on it so the entry is not evicted under it once published. It follows a fill
of its own process through the fill's condition variable, and a fill of another process by
polling the file's size; if that process dies or gives up, ``reattach(pos, version)`` finds
the bytes from ``pos`` on elsewhere (the published entry, a new fill, or the store).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from .errors import CacheError, TransferError, WdsCloudError
from .remote import SequentialStream

__all__ = ["Fill", "FillGone", "GrowingFile"]

CHUNK = 1 << 20
_DEPTH = 8  # buffers in flight between a download and the writing of its file
_POLL_FIRST, _POLL_MAX = 0.002, 0.05
_WAIT = 1.0  # seconds between checks on a fill of this process that makes no progress
_SETTLE = 10.0  # seconds a reader at the end waits for its fill to publish
FINISH_TAIL = 1 << 20  # a download this close to its end is finished even with no reader left


class FillGone(Exception):
    """The process filling an entry stopped before finishing it."""


class _Cancelled(Exception):
    """Every reader of this process closed before the fill ended."""


class Fill:
    """One download of ``size`` bytes from ``remote`` into the descriptor ``fd``."""

    def __init__(
        self, remote: BinaryIO, fd: int, size: int, *, label: str,
        publish: Callable[[Fill], None], abandon: Callable[[Fill, BaseException], None],
        release: Callable[[], None],
    ) -> None:
        self.remote, self.fd, self.size, self.label = remote, fd, size, label
        self._publish, self._abandon, self._release = publish, abandon, release
        self._readinto = cast(Any, remote).readinto
        self.written = 0
        self.crc32 = 0
        self.error: BaseException | None = None
        self.finished = False
        self._readers = 0
        self._cancelled = False
        self._write_error: BaseException | None = None
        self._cond = threading.Condition()

    def start(self) -> None:
        threading.Thread(target=self._run, name="wds-cache-fill", daemon=True).start()

    def attach(self) -> None:
        with self._cond:
            self._readers += 1

    def detach(self) -> None:
        """A reader closed; with none left and more than a tail to go, the download stops (a
        tar reader stops at the end-of-archive blocks: the padding after them is still
        fetched, so the shard is cached)."""
        with self._cond:
            self._readers -= 1
            if self._readers <= 0 and self.size - self.written > FINISH_TAIL:
                self._cancelled = True

    def wait(self, pos: int) -> int:
        """How many bytes are there, once more than ``pos`` are (or the fill ended)."""
        with self._cond:
            self._cond.wait_for(lambda: self.written > pos or self.finished, timeout=_WAIT)
            if self.written <= pos and self.finished:
                raise self.error or TransferError(
                    f"the download of {self.label} stopped at byte {self.written}",
                    url=self.label, offset=self.written)
            return self.written

    def wait_finished(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.finished, timeout=timeout)

    def _run(self) -> None:
        chunks: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(_DEPTH):
            free.put(bytearray(CHUNK))
        writer = threading.Thread(target=self._write, args=(chunks, free),
                                  name="wds-cache-write", daemon=True)
        writer.start()
        failure: BaseException | None = None
        try:
            self._download(chunks, free)
        except BaseException as exc:  # handed to the readers, never lost
            failure = exc
        chunks.put(None)
        writer.join()
        try:
            failure = failure or self._write_error
            if failure is None:
                self._publish(self)
        except BaseException as exc:
            failure = exc
        if failure is not None:
            self.error = _as_cache_error(failure, self.label)
            self._abandon(self, failure)
        with contextlib.suppress(Exception):  # a broken connection may fail to close
            self.remote.close()
        os.close(self.fd)
        self._release()
        with self._cond:
            self.finished = True
            self._cond.notify_all()

    def _download(self, chunks: queue.Queue[tuple[bytearray, int] | None],
                  free: queue.Queue[bytearray]) -> None:
        """Read the response into free buffers and queue them for :meth:`_write`, so the next
        bytes arrive while the last ones are written."""
        got = 0
        while got < self.size and self._write_error is None:
            if self._cancelled:
                raise _Cancelled
            buf = free.get()
            n = self._readinto(memoryview(buf)[: min(CHUNK, self.size - got)])
            if not n:
                free.put(buf)
                raise TransferError(
                    f"{self.label} ended at byte {got} of {self.size}; nothing was cached",
                    url=self.label, offset=got)
            chunks.put((buf, n))
            got += n

    def _write(self, chunks: queue.Queue[tuple[bytearray, int] | None],
               free: queue.Queue[bytearray]) -> None:
        """Write queued buffers to the file and the CRC; readers see each as it lands."""
        while (item := chunks.get()) is not None:
            buf, n = item
            if self._write_error is None:
                try:
                    with memoryview(buf) as view:
                        done = 0
                        while done < n:
                            done += os.write(self.fd, view[done:n])
                        self.crc32 = zlib.crc32(view[:n], self.crc32)
                except BaseException as exc:  # a full disk: the download stops
                    self._write_error = exc
                else:
                    with self._cond:
                        self.written += n
                        self._cond.notify_all()
            free.put(buf)


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


class GrowingFile(SequentialStream):
    """A read stream over an entry being filled, by ``fill`` (this process) or another process.

    ``probe()`` is called when another process's fill makes no progress: it returns normally
    while that fill is alive and raises :class:`FillGone` when it is not.
    """

    def __init__(
        self, fd: int, *, size: int, version: str | None, pos: int, fill: Fill | None,
        probe: Callable[[int], None], reattach: Callable[[int, str | None], BinaryIO],
    ) -> None:
        super().__init__()
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd, self._size, self._version, self._pos = fd, size, version, pos
        self._fill, self._probe, self._reattach = fill, probe, reattach
        self._delegate: BinaryIO | None = None
        self._io = threading.Lock()
        self._delay = _POLL_FIRST
        if fill is not None:
            fill.attach()

    @property
    def size(self) -> int:
        return self._size

    @property
    def version(self) -> str | None:
        return self._version

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while True:
            if self._delegate is not None:
                n = self._delegate.readinto(view)  # type: ignore[attr-defined]
                self._pos += n or 0
                return n or 0
            if self.closed:
                raise ValueError("I/O operation on closed cache stream")
            if self._pos >= self._size:
                self._settle()
                return 0
            if not len(view):
                return 0
            with self._io:  # close() from another thread must not free the fd mid-read
                if self._fd < 0:
                    continue
                fill = self._fill
                have = fill.written if fill is not None else os.fstat(self._fd).st_size
                n = os.preadv(self._fd, [view[: have - self._pos]], self._pos) \
                    if have > self._pos else 0
            if n:
                self._pos += n
                self._delay = _POLL_FIRST
                return n
            self._wait()

    def _settle(self) -> None:
        """At the end, let this process's fill publish the entry before the caller goes on (a
        script that exits right after reading would otherwise kill it first)."""
        fill = self._fill
        if fill is not None:
            fill.wait_finished(_SETTLE)

    def _wait(self) -> None:
        fill = self._fill
        if fill is not None:
            fill.wait(self._pos)
            return
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
        fill, self._fill = self._fill, None
        if fill is not None:
            fill.detach()

    def close(self) -> None:
        if not self.closed:
            fill = self._fill
            if fill is not None and fill.size - fill.written <= FINISH_TAIL:
                fill.wait_finished(_SETTLE)  # publish before the caller may exit
            self._close_fd()
            if self._delegate is not None:
                self._delegate.close()
        super().close()
