"""``http://`` and ``https://`` through fsspec's HTTP filesystem (aiohttp), and AIStore's REST API.

A read is one streaming GET; a dropped connection is resumed with ``Range: bytes=N-`` and
``If-Match`` on the ETag seen at open (see :mod:`wds_cloud.stores.streams`). Redirects are
followed, as AIStore's gateway asks (301/307 to a storage node). The GET is sent and its body
received by the thread that reads the stream (:mod:`~wds_cloud.stores.direct`, as ``curl``
would: less than half the CPU per GB of receiving on aiohttp's loop), unless the options ask for
what only aiohttp does (``_sendable``: a session or request option other than ``headers``, or a
client factory of one's own), or the URL holds credentials (``user:password@``, which aiohttp
sends as basic auth); then aiohttp sends it. A write is spooled and sent as
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
from collections.abc import AsyncIterator, Sequence
from typing import Any, BinaryIO, ClassVar, cast
from urllib.parse import urljoin, urlsplit

from ..errors import OpenError
from ..settings import Settings
from ..urls import redact
from . import direct
from .aio import AsyncBody, guard_forks, run
from .base import answer_error, releaser
from .retry import (
    Retrier,
    RetryableError,
    RetryPolicy,
    reason,
    status_error,
    transient_errors,
)
from .streams import AtomicUpload, Body, ObjectMeta, ResumableStream, opener_options

__all__ = ["HttpOpener"]

log = logging.getLogger(__name__)

#: aiohttp buffers this much per connection, so a read takes few hops to fill
_READ_BUFSIZE = 4 * 2**20
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_MAX_REDIRECTS = 10  # aiohttp's own limit
_SESSION_OPTIONS = frozenset(("read_bufsize", "headers"))  # what the direct path honours too
#: requests in flight at once when looking sizes up (:meth:`HttpOpener.sizes`)
LOOKUPS = 32


def _meta(headers: Any, offset: int, status: int) -> ObjectMeta:
    size: int | None = None
    match = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
    if match and match.group(3) != "*":
        size = int(match.group(3))
    elif status == 200 and headers.get("Content-Length") is not None:
        size = int(headers["Content-Length"])
    version = headers.get("ETag") or headers.get("Ais-Version") or headers.get("Last-Modified")
    return ObjectMeta(size=size, version=version)


def _sendable(fs: Any) -> bool:
    """Whether GETs of ``fs`` may be sent by :mod:`~wds_cloud.stores.direct`: only headers
    asked for (of the session or the request), and fsspec's own client factory."""
    from fsspec.implementations.http import get_client

    return (fs.get_client is get_client and set(fs.client_kwargs) <= _SESSION_OPTIONS
            and set(fs.kwargs) <= {"headers"})


def _merged(*layers: Any) -> dict[str, str]:
    """Headers from ``layers``, a later one's value replacing an earlier one's whatever the
    case of its name (as aiohttp merges them)."""
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        for name, value in layer.items():
            merged[name.lower()] = (name, value)
    return dict(merged.values())


def _range_headers(offset: int, version: str | None) -> dict[str, str]:
    if not offset:
        return {}
    headers = {"Range": f"bytes={offset}-"}
    if version and not version.startswith("W/") and version.startswith('"'):
        headers["If-Match"] = version
    return headers


class _HttpSource:
    """One URL as a :class:`~wds_cloud.stores.streams.RangeSource` on an fsspec HTTP
    filesystem: GETs sent by the reading thread (``_send``) where the options allow it, else
    by aiohttp on the filesystem's loop (``_get``)."""

    def __init__(self, fs: Any, url: str, policy: RetryPolicy) -> None:
        import aiohttp

        self._fs = fs
        self._url = url
        self._policy = policy
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=policy.timeout, sock_read=policy.timeout)
        self._direct = _sendable(fs) and not urlsplit(url).username  # aiohttp: user:pw@ auth

    def fetch(self, offset: int, version: str | None, *,
              resumed: bool = False) -> tuple[Body, ObjectMeta]:
        if self._direct:
            return self._send(offset, version, careful=resumed)
        return cast(tuple[Body, ObjectMeta], run(self._fs.loop, self._get, offset, version))

    def _send(self, offset: int, version: str | None, *,
              careful: bool) -> tuple[Body, ObjectMeta]:
        """The GET sent and received by this thread, redirects followed (``Authorization``
        and ``Cookie`` are not sent on to another host, as aiohttp does)."""
        from aiohttp.http import SERVER_SOFTWARE  # the User-Agent aiohttp sends

        # the bytes as stored (offsets of resumes count them), whatever the options ask
        headers = _merged({"User-Agent": SERVER_SOFTWARE},
                          self._fs.client_kwargs.get("headers") or {},
                          self._fs.kwargs.get("headers") or {},
                          {"Accept-Encoding": "identity"}, _range_headers(offset, version))
        url = str(self._fs.encode_url(self._url))
        for _ in range(_MAX_REDIRECTS + 1):
            body = direct.send("GET", url, headers, timeout=self._policy.timeout,
                               careful=careful)
            location = body.headers.get("Location")
            if body.status not in _REDIRECTS or not location:
                meta = self._judge(body.status, body.headers, offset, body.close)
                return _skipped(body, offset if body.status == 200 else 0, self._url), meta
            body.close()
            target = str(self._fs.encode_url(urljoin(url, location)))
            if urlsplit(target).netloc != urlsplit(url).netloc:
                headers = {k: v for k, v in headers.items()
                           if k.lower() not in ("authorization", "cookie")}
            url = target
        raise OpenError(f"{redact(self._url)}: more than {_MAX_REDIRECTS} redirects",
                        url=self._url)

    def _judge(self, status: int, headers: Any, offset: int, close: Any) -> ObjectMeta:
        """What an answer says of the object, or (``close`` called) the error it is. A whole
        object (200) answered to a ranged GET is read from its start and skipped to the
        offset (:func:`_skipped`)."""
        try:
            error = answer_error(self._url, status, 0 if status == 200 else offset)
            if error is not None:
                raise error
            return _meta(headers, offset, status)
        except BaseException:
            close()
            raise

    async def _get(self, offset: int, version: str | None) -> tuple[AsyncBody, ObjectMeta]:
        session = await self._fs.set_session()
        kw = dict(self._fs.kwargs)
        headers = {**(kw.pop("headers", None) or {}), **_range_headers(offset, version)}
        try:
            resp = await session.get(self._fs.encode_url(self._url), headers=headers,
                                     timeout=self._timeout, **kw)
        except transient_errors("http") as exc:
            raise RetryableError(f"cannot connect for {redact(self._url)}: {reason(exc)}") from exc
        meta = self._judge(resp.status, resp.headers, offset, resp.close)
        body = AsyncBody(self._fs.loop, resp.content.read, releaser(resp))
        return _skipped(body, offset if resp.status == 200 else 0, self._url), meta


_IGNORING: set[str] = set()  # hosts that answered a ranged GET with the whole object (logged)
_SKIP_CHUNK = 1 << 20


def _skipped(body: Any, offset: int, url: str) -> Any:
    """``body`` with its first ``offset`` bytes read and dropped: a server that ignores
    ``Range`` (Python's ``http.server``, some mirrors) sends the whole object, so a resume or
    a retry at a byte reads up to it instead of failing (logged once per host)."""
    if offset <= 0:
        return body
    host = urlsplit(url).netloc
    if host not in _IGNORING:
        _IGNORING.add(host)
        log.warning("%s ignores Range requests: resuming at a byte reads the object from its "
                    "start and skips to it (%d bytes here)", host, offset)
    left = offset
    while left > 0:
        got = body.read(min(left, _SKIP_CHUNK))
        if not got:
            body.close()
            raise OpenError(f"{redact(url)}: the whole object (the server ignored Range) "
                            f"ended {left} bytes before the offset {offset}", url=redact(url))
        left -= len(got)
    return body


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

    def sizes(self, urls: Sequence[str], storage_options: dict[str, Any], *,
              settings: Settings) -> dict[str, int | None]:
        """``{url: size}`` of those of ``urls`` that exist (``None`` where the server does not
        say), each asked for its first byte (``Range: bytes=0-0``, whose answer names the
        whole size; servers answer HEAD less alike), :data:`LOOKUPS` at a time, redirects
        followed, retried by ``settings``' retry policy. A 404 or 410 leaves the URL out;
        another error status raises :class:`~wds_cloud.errors.OpenError` naming the URL, and
        so do retries that ran out (:class:`~wds_cloud.errors.TransferError`)."""
        fs = _filesystem(dict(storage_options))
        policy = RetryPolicy.from_settings(settings)
        return cast(dict[str, "int | None"], run(fs.loop, _sizes, fs, list(urls), policy))


async def _sizes(fs: Any, urls: list[str], policy: RetryPolicy) -> dict[str, int | None]:
    import aiohttp

    session = await fs.set_session()
    wait = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                 sock_read=policy.timeout)
    found: dict[str, int | None] = {}
    pending = iter(urls)

    async def look_up() -> None:  # one of LOOKUPS, each taking the next URL when done
        for url in pending:
            retrier = Retrier(policy, url=url, doing="look up")
            exists, size = await retrier.call_async("lookup", _size_of, fs, session, url, wait)
            if exists:
                found[url] = size

    tasks = [asyncio.ensure_future(look_up()) for _ in range(min(LOOKUPS, len(urls)))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:  # after a failure, the URLs not looked up yet are not
            task.cancel()
    return found


async def _size_of(fs: Any, session: Any, url: str, wait: Any) -> tuple[bool, int | None]:
    """Whether ``url`` exists, and its size (``None``: the server does not say); raises
    :class:`~wds_cloud.stores.retry.RetryableError` where another request may fare better."""
    import aiohttp

    kw = dict(fs.kwargs)
    headers = {**(kw.pop("headers", None) or {}), "Range": "bytes=0-0",
               "Accept-Encoding": "identity"}
    try:
        async with session.get(fs.encode_url(url), headers=headers, timeout=wait,
                               allow_redirects=True, **kw) as resp:
            if resp.status == 206:
                await resp.read()  # the one byte: the connection is kept for the next lookup
            else:
                resp.close()  # a whole body may follow: not read
            status, answer = resp.status, resp.headers
    except transient_errors("http") as exc:
        raise RetryableError(f"cannot connect for {redact(url)}: {reason(exc)}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise OpenError(f"looking up {redact(url)} failed: {reason(exc)}",
                        url=redact(url)) from exc
    if status in (404, 410):
        return False, None
    if status == 416:  # an empty object has no byte 0: Content-Range: bytes */0
        total = answer.get("Content-Range", "").rpartition("/")[2]
        return True, int(total) if total.isdigit() else None
    if status >= 400:
        raise status_error(status, url, "looking up")  # 408, 429, 5xx: retryable
    if status == 200 and answer.get("Content-Encoding", "identity") not in ("identity", ""):
        return True, None  # the length of a compressed body is not the object's size
    return True, _meta(answer, 0, status).size  # as a read judges it: Content-Range, else length


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
