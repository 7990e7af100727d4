"""``gs://`` and ``gcs://`` through gcsfs, on the shared base of :mod:`wds_cloud.fsspecstore`.

**Reads** are one streaming JSON-API media download per shard on gcsfs's aiohttp session (its
URL, auth headers and ``userProject``), resumed at the byte where a connection dropped and
pinned to the generation seen at open by ``generation=``.

**Writes**: one simple upload up to 32 MiB, else a resumable upload in 16 MiB chunks (gcsfs
retries its own requests), cancelled when it fails.

``storage_options`` are the keyword arguments of ``GCSFileSystem``.
"""

from __future__ import annotations

import logging
from typing import Any, BinaryIO

from .aiobody import AsyncBody, transient_errors
from .fsspecstore import (
    CloudOpener,
    Fetched,
    LoopSource,
    header_meta,
    library_error,
    range_ignored,
    releaser,
    sequential_parts,
)
from .remote import RetryableError, RetryPolicy, status_error
from .urls import redact

__all__ = ["GcsOpener"]

log = logging.getLogger(__name__)


class _GcsSource(LoopSource):
    """One GCS object as a :class:`~wds_cloud.remote.RangeSource` (JSON API media download).

    The generation pins every fetch, so ``version`` adds nothing."""

    def __init__(self, fs: Any, url: str, policy: RetryPolicy) -> None:
        import aiohttp

        super().__init__(fs, url)
        self._path = fs._strip_protocol(url)
        self._generation: str | None = fs.split_path(url)[2]
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                              sock_read=policy.timeout)

    async def _get(self, offset: int, version: str | None) -> Fetched:
        fs = self._fs
        try:  # gcsfs's own URL, auth headers and userProject; its _call would read it all
            session = await fs._set_session()
            resp = await session.get(fs.url(self._path, generation=self._generation),
                                     headers=fs._get_headers({"Range": f"bytes={offset}-"}
                                                             if offset else {}),
                                     params=fs._get_params({}), timeout=self._timeout)
        except transient_errors() as exc:
            raise RetryableError(f"cannot connect for {redact(self._url)}: {exc!r}") from exc
        try:
            if resp.status >= 400:  # a pinned generation that is gone: replaced or deleted
                status = 412 if resp.status == 404 and offset else resp.status
                raise status_error(status, self._url, "reading", offset=offset)
            if offset and resp.status != 206:
                raise range_ignored(self._url, resp.status)
        except BaseException:
            resp.close()
            raise
        generation = resp.headers.get("x-goog-generation")
        self._generation = self._generation or generation
        meta = header_meta(resp.headers, offset, generation or resp.headers.get("ETag"))
        return AsyncBody(fs.loop, resp.content.read, releaser(resp)), meta


class GcsOpener(CloudOpener):
    """``gs://bucket/key`` (and ``gcs://``) through gcsfs."""

    protocol = "gs"

    def _source(self, fs: Any, url: str, policy: RetryPolicy) -> _GcsSource:
        return _GcsSource(fs, url, policy)

    async def _commit(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO) -> None:
        try:
            await super()._commit(fs, url, policy, fileobj)
        except Exception as exc:  # gcsfs raises builtins, its HttpError, aiohttp errors
            raise library_error(exc, url, "writing") from exc

    async def _put(self, fs: Any, url: str, policy: RetryPolicy, data: bytes) -> None:
        from gcsfs.core import simple_upload

        bucket, key, _ = fs.split_path(url)
        await simple_upload(fs, bucket, key, data)

    async def _put_parts(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO,
                         size: int) -> None:
        from gcsfs.core import initiate_upload, upload_chunk

        bucket, key, _ = fs.split_path(url)
        location = await initiate_upload(fs, bucket, key)
        try:
            for offset, data in sequential_parts(fileobj):
                await upload_chunk(fs, location, data, offset, size, "application/octet-stream")
        except Exception:
            await _gcs_cancel(fs, url, location)
            raise


async def _gcs_cancel(fs: Any, url: str, location: str) -> None:
    try:
        await fs._call("DELETE", location)
    except Exception as exc:  # an abandoned resumable upload expires after a week
        log.warning("could not cancel the upload of %s: %s", redact(url), type(exc).__name__)
