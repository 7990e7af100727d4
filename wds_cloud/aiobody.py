"""A response body read on fsspec's event loop, seen from a synchronous reader.

fsspec's async filesystems (s3fs, gcsfs, adlfs, HTTP) run their I/O on one event loop in a
background thread. :class:`AsyncBody` reads a streaming response there and fills the caller's
buffer in a single hop to that loop per ``readinto`` (a hop costs tens of microseconds, so it is
filled completely rather than a network chunk at a time). Failures that a retry can mend
(dropped connection, short body, timeout) come out as
:class:`~wds_cloud.remote.RetryableError`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import TransferError
from .remote import RetryableError, RetryPolicy
from .urls import redact

__all__ = ["AsyncBody", "retried", "run"]

log = logging.getLogger(__name__)

ReadChunk = Callable[[int], Awaitable[bytes]]
Request = Callable[..., Awaitable[Any]]


def run(loop: asyncio.AbstractEventLoop, func: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``func(*args)`` on ``loop`` (fsspec's I/O thread) and return its result."""
    from fsspec.asyn import sync

    return sync(loop, func, *args)


def retried(policy: RetryPolicy, url: str, request: Request) -> Request:
    """``request(method, *args, **kw)`` as ``call(what, method, *args, **kw)``: awaited again
    while it raises :class:`RetryableError`, within ``policy``; ``what`` names it in logs."""
    async def call(what: str, method: str, *args: Any, **kw: Any) -> Any:
        rng = random.Random()
        failures = 0
        while True:
            try:
                return await request(method, *args, **kw)
            except RetryableError as exc:
                failures += 1
                if failures > policy.retries:
                    raise TransferError(f"cannot write {redact(url)}: {what} failed {failures} "
                                        f"times, the last: {exc}", url=redact(url),
                                        attempts=failures) from exc
                delay = policy.delay(failures, rng)
                log.info("retry %d/%d of %s for %s in %.2f s after %s", failures,
                         policy.retries, what, redact(url), delay, exc)
                await asyncio.sleep(delay)
    return call


def transient_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of aiohttp and asyncio that a new request may get past."""
    import aiohttp

    return (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError,
            ConnectionError)


class AsyncBody:
    """Adapts ``read_chunk(n) -> bytes`` (an aiohttp ``content.read``, an aiobotocore
    ``StreamingBody.read``) running on ``loop`` to :class:`~wds_cloud.remote.Body`.

    ``on_close(finished)`` runs on the loop when the body is closed: ``finished`` says whether
    the body was read to its end, so the connection can be reused (or must be dropped).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, read_chunk: ReadChunk,
        on_close: Callable[[bool], Any], *, errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._loop = loop
        self._read_chunk = read_chunk
        self._on_close = on_close
        self._errors = errors or transient_errors()
        self._finished = False
        self._closed = False

    async def _fill(self, view: memoryview) -> int:
        filled, size = 0, len(view)
        try:
            while filled < size:
                chunk = await self._read_chunk(size - filled)
                if not chunk:
                    self._finished = True
                    break
                view[filled:filled + len(chunk)] = chunk
                filled += len(chunk)
        except self._errors as exc:
            if filled:  # deliver what arrived; the next call meets the failure again
                return filled
            raise RetryableError(f"connection failed while reading: {exc!r}") from exc
        return filled

    def readinto(self, buffer: memoryview) -> int:
        if self._finished:
            return 0
        return int(run(self._loop, self._fill, buffer))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def close() -> None:
            result = self._on_close(self._finished)
            if asyncio.iscoroutine(result):
                await result

        if not self._loop.is_closed():
            run(self._loop, close)
