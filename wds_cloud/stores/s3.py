"""``s3://`` through s3fs (aiobotocore), on the shared base of :mod:`wds_cloud.stores.base`.

**Reads** are one streaming ``get_object`` per shard, resumed at the byte where a connection
dropped and pinned to the ETag seen at open by ``If-Match`` (and to the version id when the
bucket keeps versions). botocore's own retries are off so that ours count: it gets
``total_max_attempts=1`` unless ``config_kwargs`` sets ``retries``.

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
from typing import Any, BinaryIO

from ..errors import AccessDeniedError, ConfigError, OpenError
from ..urls import redact
from .aio import AsyncBody
from .base import (
    CloudOpener,
    Fetched,
    LoopSource,
    Request,
    object_size,
    parameters,
    range_ignored,
    send_parts,
)
from .retry import (
    Retrier,
    RetryableError,
    RetryPolicy,
    is_transient,
    status_error,
    transient_errors,
)
from .streams import ObjectMeta

__all__ = ["S3Opener"]

log = logging.getLogger(__name__)

#: S3 error codes whose HTTP status alone would say less (or, from some servers, other)
_CODE_STATUS = {"NoSuchKey": 404, "NoSuchBucket": 404, "AccessDenied": 403,
                "InvalidAccessKeyId": 403, "SignatureDoesNotMatch": 403,
                "PreconditionFailed": 412, "SlowDown": 503}


def _s3_failure(exc: BaseException, url: str, doing: str, offset: int) -> Exception:
    from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        status = _CODE_STATUS.get(code, status)
        return status_error(status, url, doing, detail=code, offset=offset)
    if isinstance(exc, NoCredentialsError):
        return AccessDeniedError(f"no credentials for {redact(url)}: give key and secret in "
                                 "storage_options or configure the AWS SDK", url=redact(url))
    if isinstance(exc, ParamValidationError):
        return OpenError(f"{doing} {redact(url)}: {exc}", url=redact(url))
    if is_transient(exc, "s3"):  # EndpointConnectionError, ReadTimeoutError, aiohttp errors
        return RetryableError(f"{doing} {redact(url)} failed: {type(exc).__name__}")
    return OpenError(f"{doing} {redact(url)} failed: {type(exc).__name__}", url=redact(url))


async def _s3_call(fs: Any, url: str, doing: str, method: str, *, offset: int = 0,
                   **kwargs: Any) -> Any:
    """One S3 request with s3fs's client and request options, but not its retry loop
    (``_call_s3`` retries behind our back); failures come out as our errors."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        await fs.set_session()
    except (TypeError, ValueError) as exc:  # botocore's Config and AioSession check late
        raise ConfigError(f"storage_options for s3:// were refused: {exc}") from exc
    try:
        client = await fs.get_s3(kwargs.get("Bucket"))
        call = getattr(client, method)
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


class _S3Source(LoopSource):
    """One S3 object as a :class:`~wds_cloud.stores.streams.RangeSource`."""

    def __init__(self, fs: Any, url: str) -> None:
        super().__init__(fs, url)
        self._bucket, self._key, self._version_id = fs.split_path(url)

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

    def _passes(self, name: str) -> bool:
        from aiobotocore.session import AioSession

        return name in parameters(AioSession.__init__)  # s3fs hands the rest to AioSession

    def _defaults(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        # botocore's default pool of 10 would queue the shards opened ahead (WDS_READAHEAD)
        config.setdefault("max_pool_connections", 64)
        return {**options, "config_kwargs": config}

    def _source(self, fs: Any, url: str, policy: RetryPolicy) -> _S3Source:
        return _S3Source(fs, url)

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
