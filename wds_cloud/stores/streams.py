"""Remote objects as byte streams that survive faults: resume at an offset, atomic writes.

A backend describes one object as a :class:`RangeSource`: ``fetch(offset, version)`` starts one
streaming GET from ``offset`` to the end of the object. :class:`ResumableStream` turns that into
a file: when the connection drops, times out or ends short, it waits and fetches again from the
byte where it stopped, pinned to the version (ETag, generation) seen at open, so a resume never
mixes two versions of an object. How long it keeps trying (failures in a row, backoff, the log
lines and counters) is the :class:`~wds_cloud.stores.retry.Retrier` of
:mod:`wds_cloud.stores.retry`.

:class:`AtomicUpload` is the write side: bytes are spooled locally and handed to the backend's
``commit`` only when the stream is closed without error, so a failed write leaves no object.

:func:`opener_options` is what a remote opener makes of the router's options: the
:class:`~wds_cloud.stores.retry.RetryPolicy` of its settings and the storage options.
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, TypeVar

from ..errors import ConfigError, OpenError
from ..io.streams import SequentialStream
from ..settings import Settings
from ..urls import redact
from .retry import TRANSIENT, Retrier, RetryPolicy, count_io

__all__ = [
    "AtomicUpload",
    "Body",
    "ObjectMeta",
    "RangeSource",
    "ResumableStream",
    "opener_options",
]

log = logging.getLogger(__name__)

_Got = TypeVar("_Got", bytes, int)
_READALL_PIECE = 16 * 2**20


@dataclass(frozen=True)
class ObjectMeta:
    """What a response said about the object: its whole ``size`` and ``version`` (ETag,
    generation, version id), each ``None`` when the store did not say."""

    size: int | None
    version: str | None


class Body(Protocol):
    """The body of one response, read sequentially. ``read(size)`` returns up to ``size``
    bytes and ``readinto`` fills up to the buffer's length; either may return less before the
    end (at least one byte), and nothing (``b""``, 0) at the end."""

    def read(self, size: int) -> bytes: ...

    def readinto(self, buffer: memoryview) -> int: ...

    def close(self) -> None: ...


class RangeSource(Protocol):
    """One remote object, readable from any offset.

    ``fetch`` starts one streaming GET from ``offset`` to the end, conditional on ``version``
    when given and the store can make it so (If-Match, ``generation=``); ``resumed`` says the
    GET goes on with a transfer that failed (connections fail here: a store may read such a
    body more carefully, see :class:`~wds_cloud.stores.direct.DirectBody`). It raises
    :class:`~wds_cloud.errors.ShardNotFoundError` or
    :class:`~wds_cloud.errors.AccessDeniedError` for answers that retrying cannot change,
    :class:`~wds_cloud.stores.retry.RetryableError` (or ``ConnectionError``/``TimeoutError``)
    for those it can.
    """

    def fetch(self, offset: int, version: str | None, *,
              resumed: bool = False) -> tuple[Body, ObjectMeta]: ...


class ResumableStream(SequentialStream):
    """A read-only stream over a :class:`RangeSource` that retries and resumes (see module doc).

    The first fetch happens here, so a missing object raises at open. ``url`` and
    ``resolved_url`` are used in messages (redacted).
    """

    def __init__(
        self, source: RangeSource, *, url: str, resolved_url: str = "",
        policy: RetryPolicy | None = None, offset: int = 0,
    ) -> None:
        super().__init__()
        self._source = source
        self._pos = offset  # a ranged GET from there (resuming a shard where a state says)
        self._retrier = Retrier(policy or RetryPolicy(), url=url, resolved_url=resolved_url)
        self._retrier.offset = offset
        self._version: str | None = None
        self._size: int | None = None
        self._body: Body | None = None
        self._closing = False
        self._body = self._fetch(first=True)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when ``size`` is negative or None), as the
        body hands them over (io's ``read`` would fill a new buffer, then copy it again into
        ``bytes``)."""
        if size is None or size < 0:
            return self.readall()
        return self._next(lambda body: body.read(size)) if size else b""

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        return self._next(lambda body: body.readinto(view)) if len(view) else 0

    def readall(self) -> bytes:
        parts = []
        while part := self.read(_READALL_PIECE):
            parts.append(part)
        return b"".join(parts)

    def _next(self, take: Callable[[Body], _Got]) -> _Got:
        """``take(body)``: the next bytes (or their count) from the current body, fetching it
        again from the current position after a failure, until bytes come or the body ends
        where the object does."""
        retrier = self._retrier
        while True:
            if self._body is None:
                self._check_open()
                self._body = self._fetch(first=False)
            try:
                got = take(self._body)
            except TRANSIENT as exc:
                self._drop_body()
                self._check_open()  # no retry when the failure was the stream being closed
                retrier.wait(exc)
                continue
            n = got if isinstance(got, int) else len(got)
            if n:
                self._pos = retrier.offset = self._pos + n
                retrier.succeeded()
                count_io(retrier.source, bytes_read=n)
                return got
            if self._size is None or self._pos >= self._size:
                return got
            self._drop_body()
            self._check_open()
            retrier.wait(ConnectionError(f"response ended at byte {self._pos} of {self._size}"))

    def _fetch(self, *, first: bool) -> Body:
        """One GET from the current position, retried until it answers or the budget is spent
        (an answer is not progress: only bytes read reset the failures in a row)."""
        retrier = self._retrier
        while True:
            self._check_open()
            retrier.attempt(resume=not first)
            try:
                body, meta = self._source.fetch(self._pos, self._version, resumed=not first)
            except TRANSIENT as exc:
                retrier.wait(exc)
                continue
            except OpenError as exc:
                exc.url = exc.url or retrier.url
                exc.resolved_url = exc.resolved_url or retrier.resolved_url
                raise
            if first:
                self._version, self._size = meta.version, meta.size
                count_io(shards=1)
            elif meta.version is not None and meta.version != self._version:
                body.close()
                raise retrier.give_up(
                    f"the object changed while it was read (version {self._version!r} at "
                    f"open, {meta.version!r} at byte {self._pos})")
            if not first:
                if self._closing:  # closed by another thread while this GET was under way
                    body.close()
                    self._check_open()
                log.info("resumed %s at byte %d", retrier.resolved_url, self._pos)
            return body

    def _check_open(self) -> None:
        if self.closed or self._closing:
            raise ValueError("I/O operation on closed stream")

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.close()
            except Exception:  # closing a broken connection may fail again; it is gone anyway
                log.debug("closing a failed response of %s", self._retrier.resolved_url,
                          exc_info=True)

    def close(self) -> None:
        """Close the stream; a read under way in another thread (read-ahead closes the
        streams it is filling) ends at once, and does not fetch again."""
        if not self.closed:
            self._closing = True  # before the body goes: the read it ends must not resume
            self._drop_body()
        super().close()


def opener_options(url: str, options: dict[str, Any]) -> tuple[RetryPolicy, dict[str, Any]]:
    """What the router hands a remote opener: the retry policy of its ``settings`` and the
    ``storage_options`` of the URL's scheme; any other option is refused, naming the URL."""
    options.pop("bufsize", None)
    settings: Settings = options.pop("settings", None) or Settings()
    storage_options = dict(options.pop("storage_options", None) or {})
    if options:
        raise ConfigError(f"options {sorted(options)} are not used when opening "
                          f"{redact(url)!r}; pass fsspec options as storage_options")
    return RetryPolicy.from_settings(settings), storage_options


class AtomicUpload(io.RawIOBase):
    """A write stream whose bytes become an object only if it is closed without error.

    Bytes are spooled to a temporary file (in memory up to ``spool_bytes``); ``close()`` hands
    the file, rewound, to ``commit(fileobj)``. ``abort()`` (called by the writers when the code
    writing a shard raises) discards everything, and so does garbage collection of an unclosed
    stream: nothing partial ever reaches the store.
    """

    def __init__(
        self, commit: Callable[[BinaryIO], None], *, url: str, spool_bytes: int = 64 * 2**20,
    ) -> None:
        super().__init__()
        self._commit = commit
        self._url = redact(url)
        # closed by close() or abort()
        self._spool: Any = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=spool_bytes, prefix="wds-up-")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to closed upload stream of {self._url}")
        return int(self._spool.write(data))

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        # ``with gopen(url, "wb") as f:`` left by an exception: nothing may be published
        self.abort() if exc_type is not None else self.close()

    def abort(self) -> None:
        """Drop what was written; no object is created."""
        if not self.closed:
            self._spool.close()
            log.debug("aborted upload of %s", self._url)
        super().close()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._spool.seek(0)
            self._commit(self._spool)
            count_io(uploads=1)
        finally:
            self._spool.close()
            super().close()

    def __del__(self) -> None:
        # an upload stream dropped without close() was abandoned: never commit from a finalizer
        if not self.closed:
            self.abort()
