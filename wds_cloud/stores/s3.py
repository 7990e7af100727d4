"""``s3://`` through s3fs (aiobotocore), on the shared base of :mod:`wds_cloud.stores.base`.

**Reads** are one streaming ``get_object`` per shard, resumed at the byte where a connection
dropped and pinned to the ETag seen at open by ``If-Match`` (and to the version id when the
bucket keeps versions). s3fs's client builds and signs each GET, with everything it knows
(endpoint, addressing, region, credentials, requester-pays and SSE-C headers); the thread that
reads the stream then sends it and receives the body itself (:mod:`~wds_cloud.stores.direct`),
straight into the reader's buffer, as ``curl`` does. Through aiobotocore every byte would
first cross fsspec's event loop thread, which costs about twice the CPU per GB and is one
thread for all the streams of a process. Where that path does not apply (a proxy, a client
certificate, botocore asked to check checksums) and for the answers botocore knows how to
follow (redirects, a 400 such as a wrong region), aiobotocore sends the GET as usual.

botocore's own retries are off so that ours count: it gets ``total_max_attempts=1`` unless
``config_kwargs`` sets ``retries``. botocore (1.36 and later) also checks the checksum an
object was written with as it is read, unless ``config_kwargs`` sets
``response_checksum_validation``; this opener sets ``"when_required"``: a resumed read, which
is ranged, cannot be checked against a whole object's checksum (servers that send it anyway,
as rclone does, would fail every resume), and the CRC costs as much CPU as the rest of the
read (zlib's CRC32: about 0.4 s per GB here). The transfer is still checked by TLS on
``https`` endpoints and by the body's length.

**Writes**: one ``put_object`` up to 32 MiB, else a multipart upload (16 MiB parts, 4 in
flight, each request retried by :mod:`wds_cloud.stores.retry`), aborted when it fails.

What botocore raises becomes our error in ``_s3_failure``: an answer by its status
(:func:`~wds_cloud.stores.retry.status_error`), no answer by the ``"s3"`` row of
:data:`~wds_cloud.stores.retry.TRANSIENT_BY_STORE`.

``storage_options`` are the keyword arguments of ``S3FileSystem`` and of aiobotocore's
``AioSession``, which s3fs hands them on to.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar
from typing import Any, BinaryIO, NamedTuple, cast

from ..errors import AccessDeniedError, ConfigError, OpenError
from ..urls import redact
from . import direct
from .aio import AsyncBody, run
from .base import (
    CloudOpener,
    Fetched,
    LoopSource,
    Request,
    header_meta,
    object_size,
    parameters,
    range_ignored,
    send_parts,
)
from .direct import DirectBody
from .retry import (
    Retrier,
    RetryableError,
    RetryPolicy,
    causes,
    is_transient,
    reason,
    status_error,
    transient_errors,
)
from .streams import Body, ObjectMeta

__all__ = ["S3Opener"]

log = logging.getLogger(__name__)

#: S3 error codes whose HTTP status alone would say less (or, from some servers, other)
_CODE_STATUS = {"NoSuchKey": 404, "NoSuchBucket": 404, "AccessDenied": 403,
                "InvalidAccessKeyId": 403, "SignatureDoesNotMatch": 403,
                "PreconditionFailed": 412, "SlowDown": 503}


_CHECKSUM_OPTION = "response_checksum_validation"
_ERROR_CODE = re.compile(r"<Code>([^<]*)</Code>")


def _botocore_options() -> Any:
    from botocore.config import Config

    return Config.OPTION_DEFAULTS


def _s3_failure(exc: BaseException, url: str, doing: str, offset: int) -> Exception:
    from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        status = _CODE_STATUS.get(code, status)
        detail = "" if code.isdigit() else code  # a HEAD answer has no body: its code is "503"
        return status_error(status, url, doing, detail=detail, offset=offset)
    if isinstance(exc, NoCredentialsError):
        return AccessDeniedError(f"no credentials for {redact(url)}: give key and secret in "
                                 "storage_options or configure the AWS SDK", url=redact(url))
    if isinstance(exc, ParamValidationError):
        return OpenError(f"{doing} {redact(url)}: {exc}", url=redact(url))
    if is_transient(exc, "s3"):  # EndpointConnectionError, ReadTimeoutError, aiohttp errors
        return RetryableError(f"{doing} {redact(url)} failed: {type(exc).__name__}")
    return OpenError(f"{doing} {redact(url)} failed: {reason(exc)}", url=redact(url))


async def _client(fs: Any, url: str, doing: str, bucket: str | None, offset: int = 0) -> Any:
    """s3fs's client for ``bucket``, its session made first; failures as our errors."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        await fs.set_session()
    except (TypeError, ValueError) as exc:  # botocore's Config and AioSession check late
        raise ConfigError(f"storage_options for s3:// were refused: {exc}") from exc
    try:
        return await fs.get_s3(bucket)
    except (ClientError, BotoCoreError, *transient_errors("s3")) as exc:
        raise _s3_failure(exc, url, doing, offset) from exc


async def _s3_call(fs: Any, url: str, doing: str, method: str, *, offset: int = 0,
                   **kwargs: Any) -> Any:
    """One S3 request with s3fs's client and request options, but not its retry loop
    (``_call_s3`` retries behind our back); failures come out as our errors."""
    from botocore.exceptions import BotoCoreError, ClientError

    call = getattr(await _client(fs, url, doing, kwargs.get("Bucket"), offset), method)
    try:
        return await call(**fs._get_s3_method_kwargs(call, **kwargs))
    except (ClientError, BotoCoreError, *transient_errors("s3")) as exc:
        raise _s3_failure(exc, url, doing, offset) from exc


def _writer(fs: Any, url: str, policy: RetryPolicy) -> Request:
    """``call(what, method, **kw)``: one S3 request on the object ``url``, retried."""
    bucket, key, _ = fs.split_path(url)

    async def call(what: str, method: str, **kw: Any) -> Any:
        return await Retrier(policy, url=url, doing="write").call_async(
            what, _s3_call, fs, url, "writing", method, Bucket=bucket, Key=key, **kw)
    return call


class _Built(Exception):  # not an error: how a built request leaves the client
    """Carries a GET that botocore built and signed out of the client, unsent."""

    def __init__(self, request: Any) -> None:
        super().__init__("request built, not sent")
        self.request = request


class _Signed(NamedTuple):
    """A GET built and signed by the client, for the reading thread to send."""

    method: str
    url: str
    headers: dict[str, Any]
    verify: bool | str  # how to verify TLS, as botocore would (see ``_verify``)


#: set while a GET is built for the reading thread to send (see ``_take_request``)
_BUILDING: ContextVar[bool] = ContextVar("wds_cloud_s3_building", default=False)


def _take_request(request: Any, **_: Any) -> None:
    """botocore's ``before-send`` hook: a request built under ``_BUILDING`` leaves the client
    here, signed and unsent. Other requests of the same (shared) client go on as usual."""
    if _BUILDING.get():
        raise _Built(request)


def _sendable(client: Any) -> bool:
    """Whether a GET of ``client`` may be sent by :mod:`~wds_cloud.stores.direct`: not
    when it would go through a proxy or offer a client certificate, nor when botocore was
    asked to check the checksums of what it reads (``response_checksum_validation``)."""
    from botocore.utils import get_environ_proxies

    config = client.meta.config
    checking = getattr(config, _CHECKSUM_OPTION, "when_required") != "when_required"
    return not (checking or config.proxies or getattr(config, "client_cert", None)
                or get_environ_proxies(client.meta.endpoint_url))


def _verify(fs: Any) -> bool | str:
    """What botocore verifies TLS with: ``client_kwargs["verify"]``, else the session's
    ``ca_bundle`` (``AWS_CA_BUNDLE``, the config file), else its default bundle."""
    verify = fs.client_kwargs.get("verify")
    if verify is None:
        verify = fs.session.get_config_variable("ca_bundle")
    return True if verify is None else cast("bool | str", verify)


class _S3Source(LoopSource):
    """One S3 object as a :class:`~wds_cloud.stores.streams.RangeSource`.

    Each GET is built and signed by s3fs's client on its loop, then sent and read by the
    thread that reads the stream (:mod:`~wds_cloud.stores.direct`), as ``curl`` would; where
    that path does not apply (``_sendable``), and for answers the client knows better what to
    do with (a redirect, a 400 such as a wrong region), the client sends the GET itself."""

    def __init__(self, fs: Any, url: str, policy: RetryPolicy) -> None:
        super().__init__(fs, url)
        self._bucket, self._key, self._version_id = fs.split_path(url)
        self._timeout = policy.timeout

    def fetch(self, offset: int, version: str | None, *,
              resumed: bool = False) -> tuple[Body, ObjectMeta]:
        got = run(self._fs.loop, self._build, offset, version)
        if isinstance(got, _Signed):
            tls = direct.botocore_tls(got.verify) if got.url.startswith("https:") else None
            body = direct.send(got.method, got.url, got.headers, timeout=self._timeout, tls=tls,
                               careful=resumed)
            answer = self._answer(body, offset)
            if answer is not None:
                return answer
            got = run(self._fs.loop, self._get, offset, version)
        return cast(Fetched, got)

    async def _build(self, offset: int, version: str | None) -> Fetched | _Signed:
        """The signed GET for the reading thread to send, or (where it may not) the answer."""
        client = await _client(self._fs, self._url, "reading", self._bucket, offset)
        if not _sendable(client):
            return await self._get(offset, version)
        client.meta.events.register("before-send.s3.GetObject", _take_request,
                                    unique_id="wds_cloud.s3.take_request")
        token = _BUILDING.set(True)
        try:
            return await self._get(offset, version)  # only if another hook answered instead
        except _Built as built:  # returned, not raised: fsspec's sync raises what it is given
            request = built.request
            return _Signed(request.method, request.url, dict(request.headers),
                           _verify(self._fs))
        finally:
            _BUILDING.reset(token)

    def _answer(self, body: DirectBody, offset: int) -> tuple[DirectBody, ObjectMeta] | None:
        """``body`` and what it says about the object; None, with ``body`` closed, when the
        client is to handle that answer; or the error it is."""
        status, headers = body.status, body.headers
        if status in (200, 206):
            if offset and not headers.get("Content-Range"):
                body.close()
                raise range_ignored(self._url, status)
            self._version_id = self._version_id or headers.get("x-amz-version-id")
            return body, header_meta(headers, offset, headers.get("ETag"))
        if status < 401:  # a redirect, or a 400 such as a wrong region: botocore follows them
            body.close()
            return None
        codes = _ERROR_CODE.findall(body.error_text())
        body.close()
        code = codes[0] if codes else ""
        raise status_error(_CODE_STATUS.get(code, status), self._url, "reading", detail=code,
                           offset=offset)

    async def _get(self, offset: int, version: str | None) -> Fetched:
        kw: dict[str, Any] = {"Bucket": self._bucket, "Key": self._key}
        if offset:
            kw["Range"] = f"bytes={offset}-"
        if version:
            kw["IfMatch"] = version
        if self._version_id:
            kw["VersionId"] = self._version_id
        resp = await _s3_call(self._fs, self._url, "reading", "get_object", offset=offset, **kw)
        self._version_id = self._version_id or resp.get("VersionId")
        body = resp["Body"]
        if offset and not resp.get("ContentRange"):  # rclone says 200, but with the range
            body.close()
            raise range_ignored(self._url, resp["ResponseMetadata"]["HTTPStatusCode"])
        meta = ObjectMeta(object_size(resp.get("ContentRange"), resp.get("ContentLength"),
                                      offset), resp.get("ETag"))
        # a cut mid-body comes out of aiobotocore as aiohttp's ClientPayloadError (or as
        # ResponseStreamingError, a BotoCoreError, for other connection errors), a stall as
        # AioReadTimeoutError, a body shorter than it said as IncompleteReadError
        return AsyncBody(self._fs.loop, body.read, lambda _: body.close(),
                         errors=transient_errors("s3")), meta


class S3Opener(CloudOpener):
    """``s3://bucket/key`` through s3fs."""

    protocol = "s3"
    def filesystem(self, url: str, storage_options: dict[str, Any], *, timeout: float) -> Any:
        fs = super().filesystem(url, storage_options, timeout=timeout)
        # s3fs's loop around each listing page and lookup (``_call_s3``) retries SlowDown and
        # dropped connections but not a 500, on its own backoff and uncounted: one attempt,
        # and ours retry (``WDS_RETRIES``)
        fs.retries = 1
        return fs

    def _failure(self, exc: BaseException, url: str, doing: str) -> Exception:
        from botocore.exceptions import ClientError

        # s3fs raises an OSError from botocore's error
        answer = next((e for e in causes(exc) if isinstance(e, ClientError)), exc)
        return _s3_failure(answer, url, doing, 0)

    def _passes(self, name: str) -> bool:
        from aiobotocore.session import AioSession

        return name in parameters(AioSession.__init__)  # s3fs hands the rest to AioSession

    def _defaults(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        if _CHECKSUM_OPTION in _botocore_options():  # see the module doc
            config.setdefault(_CHECKSUM_OPTION, "when_required")
        # botocore's default pool of 10 would queue the shards opened ahead (WDS_READAHEAD)
        config.setdefault("max_pool_connections", 64)
        return {**options, "config_kwargs": config}

    def _source(self, fs: Any, url: str, policy: RetryPolicy) -> _S3Source:
        return _S3Source(fs, url, policy)

    async def _put(self, fs: Any, url: str, policy: RetryPolicy, data: bytes) -> None:
        await _writer(fs, url, policy)("PUT", "put_object", Body=data)

    async def _put_parts(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO,
                         size: int) -> None:
        call = _writer(fs, url, policy)

        async def part(number: int, data: bytes) -> dict[str, Any]:
            out = await call(f"part {number}", "upload_part", UploadId=upload,
                             PartNumber=number, Body=data)
            return {"PartNumber": number, "ETag": out["ETag"]}

        upload = (await call("starting a multipart upload", "create_multipart_upload"))["UploadId"]
        try:
            parts = await send_parts(fileobj, size, 10_000, part)
            await call("completing the multipart upload", "complete_multipart_upload",
                       UploadId=upload, MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                await call("aborting the multipart upload", "abort_multipart_upload",
                           UploadId=upload)
            except OpenError as exc:  # a bucket lifecycle rule drops abandoned uploads
                log.warning("could not abort the multipart upload of %s: %s", redact(url), exc)
            raise
