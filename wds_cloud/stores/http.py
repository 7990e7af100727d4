"""``http://`` and ``https://`` through fsspec's HTTP filesystem (aiohttp), and AIStore's REST API.

A read is one streaming GET; a dropped connection is resumed with ``Range: bytes=N-`` and
``If-Match`` on the ETag seen at open (see :mod:`wds_cloud.stores.streams`). Redirects are
followed, as AIStore's gateway asks (301/307 to a storage node). A write is spooled and sent as
one ``PUT`` when the shard is complete, following 307/308 redirects by hand so the body is sent
only to the final target. Both are retried by :mod:`wds_cloud.stores.retry` (its ``"http"``
row says which aiohttp errors are transient; :func:`~wds_cloud.stores.retry.status_error` which
answers).

``storage_options`` are those of ``fsspec.filesystem("http", ...)``: ``client_kwargs`` for
``aiohttp.ClientSession`` and request options such as ``headers`` or ``auth``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from typing import Any, BinaryIO, ClassVar, cast

from ..errors import OpenError
from ..urls import redact
from .aio import AsyncBody, guard_forks, run
from .retry import (
    Retrier,
    RetryableError,
    RetryPolicy,
    reason,
    status_error,
    transient_errors,
)
from .streams import AtomicUpload, ObjectMeta, ResumableStream, opener_options

__all__ = ["HttpOpener"]

log = logging.getLogger(__name__)

#: aiohttp buffers this much per connection, so a read takes few hops to fill
_READ_BUFSIZE = 4 * 2**20
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def _meta(headers: Any, offset: int, status: int) -> ObjectMeta:
    size: int | None = None
    match = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
    if match and match.group(3) != "*":
        size = int(match.group(3))
    elif status == 200 and headers.get("Content-Length") is not None:
        size = int(headers["Content-Length"])
    version = headers.get("ETag") or headers.get("Ais-Version") or headers.get("Last-Modified")
    return ObjectMeta(size=size, version=version)


class _HttpSource:
    """One URL as a :class:`~wds_cloud.stores.streams.RangeSource` on an fsspec HTTP
    filesystem."""

    def __init__(self, fs: Any, url: str, policy: RetryPolicy) -> None:
        import aiohttp

        self._fs = fs
        self._url = url
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=policy.timeout, sock_read=policy.timeout)

    def fetch(self, offset: int, version: str | None) -> tuple[AsyncBody, ObjectMeta]:
        return cast(tuple[AsyncBody, ObjectMeta], run(self._fs.loop, self._get, offset, version))

    async def _get(self, offset: int, version: str | None) -> tuple[AsyncBody, ObjectMeta]:
        session = await self._fs.set_session()
        kw = dict(self._fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        if offset:
            headers["Range"] = f"bytes={offset}-"
            if version and not version.startswith("W/") and version.startswith('"'):
                headers["If-Match"] = version
        try:
            resp = await session.get(self._fs.encode_url(self._url), headers=headers,
                                     timeout=self._timeout, **kw)
        except transient_errors("http") as exc:
            raise RetryableError(f"cannot connect for {redact(self._url)}: {reason(exc)}") from exc
        try:
            if resp.status >= 400:
                raise status_error(resp.status, self._url, "reading", offset=offset)
            if offset and resp.status != 206:
                raise OpenError(f"{redact(self._url)}: the server ignored a Range request "
                                f"(HTTP {resp.status}), so a read cannot resume", url=self._url)
            meta = _meta(resp.headers, offset, resp.status)
        except BaseException:
            resp.close()
            raise

        def on_close(finished: bool) -> None:
            resp.release() if finished else resp.close()

        return AsyncBody(self._fs.loop, resp.content.read, on_close), meta


class HttpOpener:
    """Opener for ``http``/``https`` (and AIStore's REST API, which the router maps to it)."""

    takes_settings: ClassVar[bool] = True
    ranged: ClassVar[bool] = True

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        offset = int(options.pop("offset", 0) or 0)
        policy, storage_options = opener_options(url, options)
        fs = _filesystem(storage_options)
        if "w" in mode:
            return cast(BinaryIO, AtomicUpload(lambda f: _put(fs, url, f, policy), url=url))
        return cast(BinaryIO, ResumableStream(_HttpSource(fs, url, policy), url=url,
                                              policy=policy, offset=offset))


def _filesystem(storage_options: dict[str, Any]) -> Any:
    import fsspec

    client_kwargs = dict(storage_options.pop("client_kwargs", None) or {})
    client_kwargs.setdefault("read_bufsize", _READ_BUFSIZE)
    guard_forks()
    return fsspec.filesystem("http", client_kwargs=client_kwargs, **storage_options)


def _put(fs: Any, url: str, fileobj: BinaryIO, policy: RetryPolicy) -> None:
    """PUT ``fileobj`` to ``url``, following redirects by hand and retrying transient failures."""
    retrier = Retrier(policy, url=url, doing="write")
    run(fs.loop, retrier.call_async, "PUT", _put_once, fs, url, fileobj, policy)


async def _put_once(fs: Any, url: str, fileobj: BinaryIO, policy: RetryPolicy) -> None:
    import aiohttp

    session = await fs.set_session()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                    sock_read=policy.timeout)
    size = fileobj.seek(0, 2)
    kw = dict(fs.kwargs)
    headers = {**(kw.pop("headers", None) or {}), "Content-Length": str(size)}
    target = url
    for _ in range(10):
        try:
            async with session.put(fs.encode_url(target), data=_chunks(fileobj), expect100=True,
                                   headers=headers, allow_redirects=False, timeout=timeout,
                                   **kw) as resp:
                if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                    target = str(resp.url.join(aiohttp.client.URL(resp.headers["Location"])))
                    continue
                if resp.status >= 400:
                    raise status_error(resp.status, url, "writing")
                return
        except transient_errors("http") as exc:
            raise RetryableError(f"connection failed writing {redact(url)}: {reason(exc)}") from exc
    raise OpenError(f"too many redirects writing {redact(url)}", url=url)


async def _chunks(fileobj: BinaryIO, size: int = 2**20) -> AsyncIterator[bytes]:
    """The spooled file from its start, read off the event loop (aiohttp would close a file
    object it is given, and a redirect needs the body again)."""
    loop = asyncio.get_running_loop()
    fileobj.seek(0)
    while chunk := await loop.run_in_executor(None, fileobj.read, size):
        yield chunk
