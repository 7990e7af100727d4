"""``gs://`` and ``gcs://`` through gcsfs, on the shared base of :mod:`wds_cloud.stores.base`.

**Reads** are one streaming JSON-API media download per shard with gcsfs's URL, auth headers and
``userProject``, resumed at the byte where a connection dropped and pinned to the generation
seen at open by ``generation=``. The GET is sent and its body received by the thread that
reads the stream (:mod:`~wds_cloud.stores.direct`, as ``curl`` would); gcsfs's aiohttp
session sends it instead where the session was given options of its own (``session_kwargs``)
or a client certificate, and when the answer is a redirect.

**Writes**: one media upload up to 32 MiB, else a resumable upload in 16 MiB chunks, cancelled
when it fails. They are requests of our own on the same session (gcsfs's ``simple_upload``,
``initiate_upload`` and ``upload_chunk`` go through its ``_request``, which retries six times
behind our back), each retried by :meth:`~wds_cloud.stores.retry.Retrier.call_async`; answers
are judged by :func:`~wds_cloud.stores.retry.status_error`, failed connections by the ``"gcs"``
row of :data:`~wds_cloud.stores.retry.TRANSIENT_BY_STORE`.

**Listings and lookups** (``glob``, ``info``, ``ls``) are gcsfs's, made with one attempt each:
its ``_request`` is decorated by ``retry_request``, six attempts up to 32 s apart (fixed when the
class was made; ``GCSFileSystem.retries`` does not change it) that end with the traceback logged
at ERROR, so the filesystem's ``_request`` is the undecorated one, with ``WDS_TIMEOUT`` for the
connection and each read (``requests_timeout``), and
:meth:`~wds_cloud.stores.base.CloudOpener.listed` retries by ``WDS_RETRIES``.

``storage_options`` are the keyword arguments of ``GCSFileSystem``.
"""

from __future__ import annotations

import logging
import re
import types
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

from ..errors import OpenError, WdsCloudError
from ..urls import redact
from . import direct
from .aio import AsyncBody
from .base import (
    CloudOpener,
    Fetched,
    LoopSource,
    answer_error,
    header_meta,
    library_error,
    releaser,
    sequential_parts,
)
from .retry import (
    Retrier,
    RetryableError,
    RetryPolicy,
    is_transient,
    reason,
    status_error,
    transient_errors,
)
from .streams import Body, ObjectMeta

__all__ = ["GcsOpener"]

log = logging.getLogger(__name__)

_CONTENT_TYPE = "application/octet-stream"
#: what a resumable upload's answer says the server has: ``Range: bytes=0-N``
_KEPT = re.compile(r"bytes=0-(\d+)")


def _sendable(fs: Any) -> bool:
    """Whether GETs of ``fs`` may be sent by :mod:`~wds_cloud.stores.direct`: not when its
    aiohttp session was given options (a connector, proxies...) or a client certificate."""
    return not fs.session_kwargs and not getattr(fs, "_use_client_cert", False)


def _one_attempt(fs: Any) -> None:
    """Make gcsfs's requests on ``fs`` (its listings and lookups) one attempt each: its
    ``_request`` without the ``retry_request`` decorator (see the module doc)."""
    undecorated = getattr(type(fs)._request, "__wrapped__", None)
    if undecorated is not None and "_request" not in vars(fs):
        fs._request = types.MethodType(undecorated, fs)


class _GcsSource(LoopSource):
    """One GCS object as a :class:`~wds_cloud.stores.streams.RangeSource` (JSON API media
    download): sent by the reading thread (``_send``) where gcsfs's session adds nothing,
    else on it (``_get``).

    The generation pins every fetch, so ``version`` adds nothing."""

    def __init__(self, fs: Any, url: str, policy: RetryPolicy) -> None:
        import aiohttp

        super().__init__(fs, url)
        self._path = fs._strip_protocol(url)
        self._generation: str | None = fs.split_path(url)[2]
        self._policy = policy
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                              sock_read=policy.timeout)
        self._direct = _sendable(fs)

    def fetch(self, offset: int, version: str | None, *,
              resumed: bool = False) -> tuple[Body, ObjectMeta]:
        if self._direct:
            got = self._send(offset, careful=resumed)
            if got is not None:
                return got
        return super().fetch(offset, version)

    def _send(self, offset: int, *, careful: bool) -> tuple[Body, ObjectMeta] | None:
        """The GET with gcsfs's URL, headers (its credentials refreshed as it would) and
        ``userProject``, sent and received by this thread; None for a redirect."""
        fs = self._fs
        url = fs.url(self._path, generation=self._generation)
        params = fs._get_params({})
        if params:
            url += "&" + urlencode(params)
        headers = fs._get_headers({"Range": f"bytes={offset}-"} if offset else {})
        body = direct.send("GET", url, headers, timeout=self._policy.timeout, careful=careful)
        if 300 <= body.status < 400:  # aiohttp follows it
            body.close()
            return None
        return body, self._judge(body.status, body.headers, offset, body.close)

    def _judge(self, status: int, headers: Any, offset: int, close: Any) -> ObjectMeta:
        """What an answer says of the object, or (``close`` called) the error it is."""
        # a 404 to a resume: the pinned generation is gone (replaced or deleted)
        error = answer_error(self._url, 412 if status == 404 and offset else status, offset)
        if error is not None:
            close()
            raise error
        generation = headers.get("x-goog-generation")
        self._generation = self._generation or generation
        return header_meta(headers, offset, generation or headers.get("ETag"))

    async def _get(self, offset: int, version: str | None) -> Fetched:
        fs = self._fs
        try:  # gcsfs's own URL, auth headers and userProject; its _call would read it all
            session = await fs._set_session()
            resp = await session.get(fs.url(self._path, generation=self._generation),
                                     headers=fs._get_headers({"Range": f"bytes={offset}-"}
                                                             if offset else {}),
                                     params=fs._get_params({}), timeout=self._timeout)
        except transient_errors("gcs") as exc:
            raise RetryableError(f"cannot connect for {redact(self._url)}: {reason(exc)}") from exc
        meta = self._judge(resp.status, resp.headers, offset, resp.close)
        return AsyncBody(fs.loop, resp.content.read, releaser(resp),
                         errors=transient_errors("gcs")), meta


class _Upload:
    """The requests of one upload of ``url`` on gcsfs's session (its endpoint, auth headers and
    ``userProject``), each retried by a :class:`~wds_cloud.stores.retry.Retrier` of its own:
    those of gcsfs's ``initiate_upload`` and ``upload_chunk``, and a media upload where its
    ``simple_upload`` sends a multipart one (we set no metadata)."""

    def __init__(self, fs: Any, url: str, policy: RetryPolicy) -> None:
        import aiohttp

        self._fs = fs
        self._url = url
        self._policy = policy
        bucket, self._key, _ = fs.split_path(url)
        self._objects = f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                              sock_read=policy.timeout)

    async def put(self, data: bytes) -> None:
        """The whole object in one media upload."""
        await self._call("the upload", "POST", self._objects, data=data,
                         params={"uploadType": "media", "name": self._key},
                         headers={"Content-Type": _CONTENT_TYPE})

    async def start(self) -> str:
        """Start a resumable upload: the session URL its chunks go to."""
        headers = await self._call(
            "starting a resumable upload", "POST", self._objects, json={"name": self._key},
            params={"uploadType": "resumable", "name": self._key},
            headers={"X-Upload-Content-Type": _CONTENT_TYPE})
        location = headers.get("Location")
        if not location:
            raise OpenError(f"writing {redact(self._url)}: the resumable upload was not given "
                            "a session URL", url=redact(self._url))
        return str(location)

    async def send(self, location: str, offset: int, data: bytes, size: int) -> None:
        """Send ``data`` as bytes ``offset...`` of ``size``; when the answer's ``Range`` shows
        that the server kept less of it, the rest again (as gcsfs's ``upload_chunk`` does)."""
        view = memoryview(data)
        while view:
            end = offset + len(view) - 1
            headers = await self._call(
                f"the chunk at byte {offset}", "POST", location, data=view,
                headers={"Content-Range": f"bytes {offset}-{end}/{size}",
                         "Content-Type": _CONTENT_TYPE})
            kept = _KEPT.match(headers.get("Range", ""))
            if kept is None or int(kept.group(1)) >= end:
                return
            if int(kept.group(1)) + 1 < offset:
                raise OpenError(f"writing {redact(self._url)}: the server lost bytes it had "
                                f"taken (it has {int(kept.group(1)) + 1}, not {offset})",
                                url=redact(self._url))
            view = view[int(kept.group(1)) + 1 - offset:]
            offset = int(kept.group(1)) + 1

    async def cancel(self, location: str) -> None:
        """Cancel the resumable upload (GCS answers 499); its chunks are dropped."""
        try:
            await self._call("cancelling the upload", "DELETE", location, done=(499,))
        except Exception as exc:  # an abandoned resumable upload expires after a week
            log.warning("could not cancel the upload of %s: %s", redact(self._url),
                        type(exc).__name__)

    async def _call(self, what: str, method: str, target: str, **kw: Any) -> Any:
        return await Retrier(self._policy, url=self._url, doing="write").call_async(
            what, self._request, method, target, **kw)

    async def _request(self, method: str, target: str, *, params: dict[str, str] | None = None,
                       headers: dict[str, str] | None = None, done: tuple[int, ...] = (),
                       **kw: Any) -> Any:
        """One request; the answer's headers. An error answer (not in ``done``) comes out as
        :func:`~wds_cloud.stores.retry.status_error`, a failed connection as
        :class:`~wds_cloud.stores.retry.RetryableError`."""
        fs = self._fs
        session = await fs._set_session()
        try:
            async with session.request(method, target, params=fs._get_params(params or {}),
                                       headers=fs._get_headers(headers or {}),
                                       timeout=self._timeout, allow_redirects=False,
                                       **kw) as resp:
                await resp.read()
        except transient_errors("gcs") as exc:
            raise RetryableError(f"connection failed writing {redact(self._url)}: "
                                 f"{type(exc).__name__}") from exc
        if resp.status >= 400 and resp.status not in done:
            raise status_error(resp.status, self._url, "writing")
        return resp.headers


class GcsOpener(CloudOpener):
    """``gs://bucket/key`` (and ``gcs://``) through gcsfs."""

    protocol = "gs"

    def filesystem(self, url: str, storage_options: dict[str, Any], *, timeout: float) -> Any:
        fs = super().filesystem(url, storage_options, timeout=timeout)
        _one_attempt(fs)
        return fs

    def _defaults(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        import aiohttp

        # gcsfs's default is aiohttp's: 5 minutes for the whole request
        return {"requests_timeout": aiohttp.ClientTimeout(total=None, sock_connect=timeout,
                                                          sock_read=timeout), **options}

    def _failure(self, exc: BaseException, url: str, doing: str) -> Exception:
        if is_transient(exc, "gcs"):  # no answer, or one cut short
            return RetryableError(f"{doing} {redact(url)} failed: {type(exc).__name__}")
        return library_error(exc, url, doing)

    def _source(self, fs: Any, url: str, policy: RetryPolicy) -> _GcsSource:
        return _GcsSource(fs, url, policy)

    async def _commit(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO) -> None:
        try:
            await super()._commit(fs, url, policy, fileobj)
        except WdsCloudError:
            raise
        except Exception as exc:  # gcsfs's session and credentials raise builtins, their own
            raise library_error(exc, url, "writing") from exc

    async def _put(self, fs: Any, url: str, policy: RetryPolicy, data: bytes) -> None:
        await _Upload(fs, url, policy).put(data)

    async def _put_parts(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO,
                         size: int) -> None:
        upload = _Upload(fs, url, policy)
        location = await upload.start()
        try:
            for offset, data in sequential_parts(fileobj):
                await upload.send(location, offset, data, size)
        except Exception:
            await upload.cancel(location)
            raise
