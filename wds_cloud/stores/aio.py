"""A response body read on fsspec's event loop, seen from a synchronous reader.

fsspec's async filesystems (s3fs, gcsfs, adlfs, HTTP) run their I/O on one event loop in a
background thread. :class:`AsyncBody` reads a streaming response there and fills the caller's
buffer in a single hop to that loop per ``readinto`` (a hop costs tens of microseconds, so it is
filled completely rather than a network chunk at a time). Failures that a retry can mend
(dropped connection, short body, timeout: the store's row of
:data:`~wds_cloud.stores.retry.TRANSIENT_BY_STORE`) come out as
:class:`~wds_cloud.stores.retry.RetryableError`, for the
:class:`~wds_cloud.stores.retry.Retrier` of the stream that reads it. Closing a body never waits
on a loop that can no longer run: a stream left open until the interpreter exits (when fsspec's
daemon thread is frozen) is dropped, not closed, so it cannot keep the process from ending.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from .retry import RetryableError, reason, transient_errors

__all__ = ["AsyncBody", "guard_forks", "run"]

log = logging.getLogger(__name__)

ReadChunk = Callable[[int], Awaitable[bytes]]


def run(loop: asyncio.AbstractEventLoop, func: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``func(*args)`` on ``loop`` (fsspec's I/O thread) and return its result.

    Raises ``RuntimeError`` rather than wait forever when the interpreter is exiting: fsspec's
    thread is a daemon, frozen by then, and nothing would ever run on its loop."""
    from fsspec.asyn import sync

    if sys.is_finalizing():
        raise RuntimeError("fsspec's event loop has stopped: the interpreter is exiting")
    guard_forks()
    return sync(loop, func, *args)


# -- fork safety ------------------------------------------------------------------------------
# A forked child (a DataLoader worker) inherits fsspec's event loop object, whose epoll instance
# it shares with the parent. When the child closes connections it inherited (aiohttp connectors
# do that when garbage-collected, e.g. after fsspec drops the parent's filesystems in the child),
# the loop unregisters their sockets from that shared epoll: the parent then never hears from
# those connections again and its next request on one waits out the whole read timeout. And
# since the inherited loop still says it is running (its thread did not survive the fork), the
# filesystems' finalizers schedule their clean-up on the child's new loop, where it fails with
# "attached to a different loop" errors. So right after the fork, the child detaches the
# inherited loop from the parent's epoll and marks it as not running; what it reports about the
# parent's sessions left unclosed in the child (they are the parent's to close) goes to DEBUG.
# The hooks go in before the first client exists (every filesystem is made by
# ``guard_forks(); fsspec.filesystem(...)``), whichever request uses it first: a listing through
# fsspec's own sync wrapper never passes through ``run``.
_fork_guard = False
_fork_guard_lock = threading.Lock()
_loop_at_fork: list[Any] = [None]


def guard_forks() -> None:
    """Install, once per process, the fork hooks that keep a forked child's clean-up of the
    connections it inherited away from the parent's (see above). Call it before making a
    client on fsspec's loop; it costs nothing after the first call."""
    global _fork_guard
    if _fork_guard:
        return
    with _fork_guard_lock:
        if _fork_guard:
            return
        _fork_guard = True
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_note_loop, after_in_parent=_forget_loop,
                                after_in_child=_detach_loop)
            os.register_at_fork(after_in_child=_renew_fsspec_lock)


def _note_loop() -> None:
    from fsspec import asyn

    _loop_at_fork[0] = asyn.loop[0]


def _forget_loop() -> None:
    _loop_at_fork[0] = None


def _renew_fsspec_lock() -> None:
    """fsspec's lock around making its event loop, anew in a forked child. A thread of the
    parent making the first filesystem (a read-ahead thread's first ``s3://`` open) holds it
    in ``get_loop()``; fsspec's own fork hook means to drop it but sets a global named
    ``lock``, not ``_lock`` (fsspec 2026.9.0), so a child forked then (a DataLoader worker)
    waited forever for its first filesystem."""
    from fsspec import asyn

    asyn.reset_lock()


def _detach_loop() -> None:
    loop, _loop_at_fork[0] = _loop_at_fork[0], None
    shared = getattr(loop, "_selector", None)  # asyncio's selector loops keep it here
    if shared is None:
        return
    while True:
        try:
            _detach(loop, shared)
            return
        except KeyboardInterrupt:
            # Ctrl-C goes to the whole process group, so also to a child being forked (a
            # DataLoader worker starting): the detach is finished all the same (half of one
            # would leave the child closing the parent's connections), and the interrupt,
            # which Python would report as "Exception ignored in" with a traceback, is not
            # the child's to act on: its parent got it too, and stops it
            continue


def _detach(loop: Any, shared: selectors.BaseSelector) -> None:
    """Give ``loop`` a selector of its own, the inherited one closed; again is harmless."""
    if loop._selector is shared:
        loop._selector = selectors.DefaultSelector()  # empty: unregistering is then a no-op
    shared.close()  # the child's handle on the parent's epoll; the parent keeps its own
    loop._thread_id = None  # is_running() is now False: finalizers close synchronously
    loop.set_exception_handler(_inherited_loop_report)


def _inherited_loop_report(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.debug("in a forked child, about the parent's event loop: %s", context.get("message"))


class AsyncBody:
    """Adapts ``read_chunk(n) -> bytes`` (an aiohttp ``content.read``, an aiobotocore
    ``StreamingBody.read``) running on ``loop`` to :class:`~wds_cloud.stores.streams.Body`.

    ``on_close(finished)`` runs on the loop when the body is closed: ``finished`` says whether
    the body was read to its end, so the connection can be reused (or must be dropped).
    ``errors`` are those of ``read_chunk`` that a resume may get past (by default aiohttp's:
    ``transient_errors("http")``).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, read_chunk: ReadChunk,
        on_close: Callable[[bool], Any], *, errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._loop = loop
        self._read_chunk = read_chunk
        self._on_close = on_close
        self._errors = errors or transient_errors("http")
        self._finished = False
        self._closed = False

    async def _take(self, size: int) -> list[bytes]:
        """The next ``size`` bytes of the body as the chunks they came in (fewer at its end,
        or before a failure: the next call meets the failure again). The chunks are handed
        over as they are, so that copying them happens on the caller's thread, not here: this
        loop is the one thread every stream of the process shares."""
        parts: list[bytes] = []
        try:
            while size > 0:
                chunk = await self._read_chunk(size)
                if not chunk:
                    self._finished = True
                    break
                parts.append(chunk)
                size -= len(chunk)
        except self._errors as exc:
            if not parts:
                raise RetryableError(f"connection failed while reading: {reason(exc)}") from exc
        return parts

    def read(self, size: int) -> bytes:
        if self._finished:
            return b""
        parts = run(self._loop, self._take, size)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, buffer: memoryview) -> int:
        if self._finished:
            return 0
        filled = 0
        for part in run(self._loop, self._take, len(buffer)):
            buffer[filled:filled + len(part)] = part
            filled += len(part)
        return filled

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def close() -> None:
            result = self._on_close(self._finished)
            if asyncio.iscoroutine(result):
                await result

        if not _loop_alive(self._loop):
            # nothing runs there any more (the interpreter is exiting, or this is a forked child
            # holding its parent's loop): waiting would hang; the OS closes the socket
            return
        run(self._loop, close)


def _loop_alive(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether work handed to ``loop`` (which was running when a body was read on it) can
    still run: not closed, still running (see ``_detach_loop``), and not frozen by the
    interpreter's exit."""
    return not sys.is_finalizing() and not loop.is_closed() and loop.is_running()
