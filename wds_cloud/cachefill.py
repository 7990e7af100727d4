"""Filling a cache entry while it is read (see :mod:`wds_cloud.cache`).

A :class:`Fill` copies one remote stream into the entry's file under ``partial/`` in a daemon
thread named ``wds-cache-fill``, computing its CRC-32, and hands it to ``publish`` once all
``size`` bytes are there; on any error, or when every reader of this process has closed before
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
import io
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from .errors import CacheError, TransferError, WdsCloudError

__all__ = ["Fill", "FillGone", "GrowingFile"]

CHUNK = 1 << 20
_POLL_FIRST, _POLL_MAX = 0.002, 0.05
_WAIT = 1.0  # seconds between checks on a fill of this process that makes no progress


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
        self._cond = threading.Condition()

    def start(self) -> None:
        threading.Thread(target=self._run, name="wds-cache-fill", daemon=True).start()

    def attach(self) -> None:
        with self._cond:
            self._readers += 1

    def detach(self) -> None:
        """A reader closed; with none left before the end, the download stops."""
        with self._cond:
            self._readers -= 1
            if self._readers <= 0 and self.written < self.size:
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

    def _run(self) -> None:
        try:
            self._copy()
            self._publish(self)
        except BaseException as exc:  # handed to the readers, never lost
            self.error = _as_cache_error(exc, self.label)
            self._abandon(self, exc)
        finally:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                self.remote.close()
            os.close(self.fd)
            self._release()
            with self._cond:
                self.finished = True
                self._cond.notify_all()

    def _copy(self) -> None:
        view = memoryview(bytearray(CHUNK))
        while self.written < self.size:
            if self._cancelled:
                raise _Cancelled
            n = self._readinto(view[: min(CHUNK, self.size - self.written)])
            if not n:
                raise TransferError(
                    f"{self.label} ended at byte {self.written} of {self.size}; nothing was "
                    "cached", url=self.label, offset=self.written)
            done = 0
            while done < n:
                done += os.write(self.fd, view[done:n])
            self.crc32 = zlib.crc32(view[:n], self.crc32)
            with self._cond:
                self.written += n
                self._cond.notify_all()


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


class GrowingFile(io.RawIOBase):
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

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def readall(self) -> bytes:
        chunk = bytearray(4 * CHUNK)
        parts = []
        while n := self.readinto(chunk):
            parts.append(bytes(chunk[:n]))
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while True:
            if self._delegate is not None:
                n = self._delegate.readinto(view)  # type: ignore[attr-defined]
                self._pos += n or 0
                return n or 0
            if self.closed:
                raise ValueError("I/O operation on closed cache stream")
            if not len(view) or self._pos >= self._size:
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
            self._close_fd()
            if self._delegate is not None:
                self._delegate.close()
        super().close()
