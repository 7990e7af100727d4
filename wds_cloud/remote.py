"""Remote objects as byte streams that survive faults: retries, resume at an offset, atomic writes.

A backend describes one object as a :class:`RangeSource`: ``fetch(offset, version)`` starts one
streaming GET from ``offset`` to the end of the object. :class:`ResumableStream` turns that into
a file: when the connection drops, times out or ends short, it waits (exponential backoff with
full jitter) and fetches again from the byte where it stopped, pinned to the version (ETag,
generation) seen at open, so a resume never mixes two versions of an object. The retry budget
counts failures in a row: any progress resets it, so a long shard over a flaky link gets through
as long as each attempt moves forward.

:class:`AtomicUpload` is the write side: bytes are spooled locally and handed to the backend's
``commit`` only when the stream is closed without error, so a failed write leaves no object.

Counters for all transfers of this process are in :func:`io_stats`.
"""

from __future__ import annotations

import io
import logging
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO, Protocol

from .errors import (
    AccessDeniedError,
    ConfigError,
    OpenError,
    ShardNotFoundError,
    TransferError,
)
from .settings import Settings
from .urls import redact

__all__ = [
    "AtomicUpload",
    "Body",
    "IOStats",
    "ObjectMeta",
    "RangeSource",
    "ResumableStream",
    "RetryPolicy",
    "RetryableError",
    "SequentialStream",
    "io_stats",
    "opener_options",
    "reset_io_stats",
    "status_error",
]

log = logging.getLogger(__name__)


class RetryableError(OSError):
    """Raised by a backend for a failure worth retrying: a 429 or 5xx answer, a dropped or
    refused connection, a timeout. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


_TRANSIENT: tuple[type[BaseException], ...] = (RetryableError, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``retries`` failures in a row, backoff from ``backoff`` doubling up to
    ``backoff_max`` seconds (full jitter), ``timeout`` seconds for a connection or next bytes."""

    retries: int = Settings.retries
    backoff: float = Settings.retry_backoff
    backoff_max: float = Settings.retry_backoff_max
    timeout: float = Settings.timeout

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(settings.retries, settings.retry_backoff, settings.retry_backoff_max,
                   settings.timeout)

    def delay(self, failures: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``failures`` (1-based)."""
        return rng.uniform(0, min(self.backoff_max, self.backoff * 2 ** (failures - 1)))


@dataclass
class IOStats:
    """Counters of this process's remote transfers (a snapshot from :func:`io_stats`)."""

    requests: int = 0
    retries: int = 0
    resumes: int = 0
    bytes_read: int = 0
    failures: int = 0
    uploads: int = 0


_stats = IOStats()
_stats_lock = threading.Lock()


def _count(**increments: int) -> None:
    with _stats_lock:
        for name, n in increments.items():
            setattr(_stats, name, getattr(_stats, name) + n)


def io_stats() -> dict[str, int]:
    """Requests, retries, resumes, bytes read, failures and uploads of this process so far."""
    with _stats_lock:
        return asdict(_stats)


def reset_io_stats() -> None:
    """Zero the counters of :func:`io_stats`."""
    global _stats
    with _stats_lock:
        _stats = IOStats()


@dataclass(frozen=True)
class ObjectMeta:
    """What a response said about the object: its whole ``size`` and ``version`` (ETag,
    generation, version id), each ``None`` when the store did not say."""

    size: int | None
    version: str | None


class Body(Protocol):
    """The body of one response, read sequentially; ``readinto`` returns 0 at its end."""

    def readinto(self, buffer: memoryview) -> int: ...

    def close(self) -> None: ...


class RangeSource(Protocol):
    """One remote object, readable from any offset.

    ``fetch`` starts one streaming GET from ``offset`` to the end, conditional on ``version``
    when given and the store can make it so (If-Match, ``generation=``). It raises
    :class:`~wds_cloud.errors.ShardNotFoundError` or
    :class:`~wds_cloud.errors.AccessDeniedError` for answers that retrying cannot change,
    :class:`RetryableError` (or ``ConnectionError``/``TimeoutError``) for those it can.
    """

    def fetch(self, offset: int, version: str | None) -> tuple[Body, ObjectMeta]: ...


class SequentialStream(io.RawIOBase):
    """A readable, forward-only raw stream of one object whose ``read()`` to the end goes in
    large pieces (not io's 8 KiB ones); subclasses define ``readinto`` and keep ``_pos``,
    ``_size`` and ``_version``."""

    _pos: int = 0
    _size: int | None = None
    _version: str | None = None

    @property
    def size(self) -> int | None:
        """The object's size in bytes, if the store said."""
        return self._size

    @property
    def version(self) -> str | None:
        """The ETag/generation pinned at open, if the store gave one."""
        return self._version

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        chunk = bytearray(4 * 2**20)
        parts = []
        while n := self.readinto(chunk):
            parts.append(bytes(chunk[:n]))
        return b"".join(parts)


class ResumableStream(SequentialStream):
    """A read-only stream over a :class:`RangeSource` that retries and resumes (see module doc).

    The first fetch happens here, so a missing object raises at open. ``url`` and
    ``resolved_url`` are used in messages (redacted).
    """

    def __init__(
        self, source: RangeSource, *, url: str, resolved_url: str = "",
        policy: RetryPolicy | None = None,
    ) -> None:
        super().__init__()
        self._source = source
        self._url = redact(url)
        self._resolved = redact(resolved_url or url)
        self._policy = policy or RetryPolicy()
        self._rng = random.Random()
        self._pos = 0
        self._failures = 0
        self._attempts = 0
        self._version: str | None = None
        self._size: int | None = None
        self._body: Body | None = None
        self._body = self._fetch(first=True)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        while True:
            if self._body is None:
                if self.closed:
                    raise ValueError("I/O operation on closed stream")
                self._body = self._fetch(first=False)
            try:
                n = self._body.readinto(view)
            except _TRANSIENT as exc:
                self._drop_body()
                self._failed(exc)
                continue
            if n:
                self._pos += n
                self._failures = 0
                _count(bytes_read=n)
                return n
            if self._size is None or self._pos >= self._size:
                return 0
            self._drop_body()
            self._failed(ConnectionError(f"response ended at byte {self._pos} of {self._size}"))

    def _fetch(self, *, first: bool) -> Body:
        """One GET from the current position, retried until it answers or the budget is spent."""
        while True:
            self._attempts += 1
            _count(requests=1, resumes=0 if first else 1)
            try:
                body, meta = self._source.fetch(self._pos, self._version)
            except _TRANSIENT as exc:
                self._failed(exc)
                continue
            except OpenError as exc:
                exc.url = exc.url or self._url
                exc.resolved_url = exc.resolved_url or self._resolved
                raise
            if first:
                self._version, self._size = meta.version, meta.size
            elif meta.version is not None and meta.version != self._version:
                body.close()
                self._give_up(f"the object changed while it was read (version {self._version!r} "
                              f"at open, {meta.version!r} at byte {self._pos})")
            if not first:
                log.info("resumed %s at byte %d", self._resolved, self._pos)
            return body

    def _failed(self, exc: BaseException) -> None:
        """Count a failure; sleep before the next attempt, or raise when the budget is spent."""
        self._failures += 1
        if self._failures > self._policy.retries:
            self._give_up(f"{self._failures} failures in a row, the last: {_describe(exc)}",
                          cause=exc)
        delay = self._policy.delay(self._failures, self._rng)
        _count(retries=1)
        log.info("retry %d/%d of %s at byte %d in %.2f s after %s", self._failures,
                 self._policy.retries, self._resolved, self._pos, delay, _describe(exc))
        time.sleep(delay)

    def _give_up(self, why: str, cause: BaseException | None = None) -> None:
        _count(failures=1)
        shown = self._url if self._url == self._resolved else f"{self._url} ({self._resolved})"
        raise TransferError(
            f"cannot read {shown} at byte {self._pos}: {why}", url=self._url,
            resolved_url=self._resolved, offset=self._pos, attempts=self._attempts,
        ) from cause

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.close()
            except Exception:  # closing a broken connection may fail again; it is gone anyway
                log.debug("closing a failed response of %s", self._resolved, exc_info=True)

    def close(self) -> None:
        if not self.closed:
            self._drop_body()
        super().close()


def status_error(status: int, url: str, doing: str, *, detail: str = "",
                 offset: int = 0) -> Exception:
    """The error of our tree for an HTTP ``status`` answered while ``doing`` ``url``."""
    shown = redact(url)
    said = f"HTTP {status}" + (f" {detail}" if detail else "")
    if status == 412:
        return TransferError(f"{shown} changed while it was read ({said} on resuming at byte "
                             f"{offset})", url=shown, offset=offset)
    if status in (404, 410):
        if doing == "reading":
            return ShardNotFoundError(f"no such object: {shown} ({said})", url=shown)
        return OpenError(f"{doing} {shown}: no such bucket or container ({said})", url=shown)
    if status in (401, 403):
        return AccessDeniedError(f"access denied {doing} {shown} ({said}); check the "
                                 "credentials in storage_options", url=shown)
    if status in (408, 429) or status >= 500:
        return RetryableError(f"{said} {doing} {shown}", status=status)
    return OpenError(f"{said} {doing} {shown}", url=shown)


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


def _describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, redacted, with the exception it was raised from."""
    text = redact(str(exc)) if "://" in str(exc) else str(exc)
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if exc.__cause__ is not None:
        said += f" (from {_describe(exc.__cause__)})"
    return said


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
            _count(uploads=1)
        finally:
            self._spool.close()
            super().close()

    def __del__(self) -> None:
        # an upload stream dropped without close() was abandoned: never commit from a finalizer
        if not self.closed:
            self.abort()
