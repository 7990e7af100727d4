"""Reading a cache entry that another reader is downloading (see :mod:`wds_cloud.cache`).

A reader that finds an entry being filled, by this process or another, follows the file under
``partial/`` as it grows with a :class:`GrowingFile`, holding a shared ``flock`` on it so the
entry is not evicted under it once published. If the downloading process dies or gives up,
``reattach(pos, version)`` finds the bytes from ``pos`` on elsewhere (the published entry, a
new download, or the store).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from ..io.streams import SequentialStream

__all__ = ["FillGone", "GrowingFile"]

_POLL_FIRST, _POLL_MAX = 0.002, 0.05


class FillGone(Exception):
    """The process filling an entry stopped before finishing it."""


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
