"""Retries, all in one place: the policy, what is transient for each store, and the attempt loop.

**To change how wds_cloud retries, change this file**; the stores only translate what their
library raised with :func:`status_error` and :func:`is_transient`, and hand every request to a
:class:`Retrier`.

- :class:`RetryPolicy` — how hard to try: ``retries`` failures in a row (``WDS_RETRIES``),
  backoff from ``backoff`` doubling up to ``backoff_max`` seconds with full jitter
  (``WDS_RETRY_BACKOFF``, ``WDS_RETRY_BACKOFF_MAX``), ``timeout`` seconds for a connection or
  the next bytes (``WDS_TIMEOUT``).
- What is transient. :class:`RetryableError` is what a store raises for a failure worth
  another request; :data:`TRANSIENT` is what the loop retries (it and the builtins
  ``ConnectionError``/``TimeoutError``). :func:`status_error` decides it for an HTTP answer
  (408, 429 and 5xx are transient; 404, 403, 412 and the rest are not).
  :data:`TRANSIENT_BY_STORE` is the table of what each store's library raises that a new
  request may get past (a dropped connection, a timeout), with the exceptions to it;
  :func:`transient_errors` and :func:`is_transient` read it, importing the library only then.
- :class:`Retrier` — the one attempt loop. It counts one transfer's failures in a row against
  the policy (any progress resets them), logs each retry at INFO, waits the backoff (``wait``,
  ``wait_async``) and raises :class:`~wds_cloud.errors.TransferError` when the budget is spent.
  :class:`~wds_cloud.stores.streams.ResumableStream` reads and resumes with it;
  :meth:`Retrier.call_async` runs every upload request of every store.
- :func:`io_stats` — the counters of this process's transfers (requests, retries, resumes,
  bytes read, failures, uploads), kept here because the loop is what counts most of them.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

from ..errors import AccessDeniedError, OpenError, ShardNotFoundError, TransferError
from ..settings import Settings
from ..urls import redact

__all__ = [
    "TRANSIENT",
    "TRANSIENT_BY_STORE",
    "IOStats",
    "Retrier",
    "RetryPolicy",
    "RetryableError",
    "count_io",
    "describe",
    "io_stats",
    "is_transient",
    "reset_io_stats",
    "status_error",
    "transient_errors",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"()<>]+")


# -- the policy -------------------------------------------------------------------------------

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


# -- what is transient ------------------------------------------------------------------------

class RetryableError(OSError):
    """Raised by a backend for a failure worth retrying: a 429 or 5xx answer, a dropped or
    refused connection, a timeout. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


#: what any request may raise that a new one may get past, whatever the store
_BUILTIN: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, asyncio.TimeoutError)

#: what the attempt loop retries; stores turn their libraries' transient errors into these
TRANSIENT: tuple[type[BaseException], ...] = (RetryableError, *_BUILTIN)

#: every store talks HTTP through aiohttp (s3fs via aiobotocore, adlfs via azure-core)
_AIOHTTP = ("aiohttp:ClientPayloadError", "aiohttp:ClientConnectionError")

#: per store: (the library errors a new request may get past, those among them it cannot)
TRANSIENT_BY_STORE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "http": (_AIOHTTP, ()),
    "gcs": (_AIOHTTP, ()),
    # connection, read-timeout and streaming errors are BotoCoreErrors; missing credentials and
    # a bad parameter are too, but no retry mends them
    "s3": ((*_AIOHTTP, "botocore.exceptions:BotoCoreError"),
           ("botocore.exceptions:NoCredentialsError",
            "botocore.exceptions:ParamValidationError")),
    # no answer at all, or one cut short; any other answer is judged by its status
    "azure": ((*_AIOHTTP, "azure.core.exceptions:ServiceRequestError",
               "azure.core.exceptions:ServiceResponseError",
               "azure.core.exceptions:IncompleteReadError"), ()),
}


@functools.cache
def _classes(store: str) -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    if store not in TRANSIENT_BY_STORE:
        raise ValueError(f"no retry table for store {store!r}; known: {sorted(TRANSIENT_BY_STORE)}")

    def resolve(names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
        found = []
        for name in names:
            module, _, attr = name.partition(":")
            found.append(getattr(importlib.import_module(module), attr))
        return tuple(found)

    transient, permanent = TRANSIENT_BY_STORE[store]
    return (*_BUILTIN, *resolve(transient)), resolve(permanent)


def transient_errors(store: str) -> tuple[type[BaseException], ...]:
    """The exceptions of ``store``'s library (``"http"``, ``"s3"``, ``"gcs"``, ``"azure"``) and
    the builtins that a new request may get past: what to catch around a request, to raise
    :class:`RetryableError` instead. A few of them may still be permanent (botocore's
    ``NoCredentialsError``): where that matters, decide with :func:`is_transient`."""
    return _classes(store)[0]


def is_transient(exc: BaseException, store: str) -> bool:
    """Whether a new request may get past ``exc``, raised by ``store``'s library."""
    transient, permanent = _classes(store)
    return isinstance(exc, transient) and not isinstance(exc, permanent)


def status_error(status: int, url: str, doing: str, *, detail: str = "",
                 offset: int = 0) -> Exception:
    """The error of our tree for an HTTP ``status`` answered while ``doing`` ``url``: a
    :class:`RetryableError` for 408, 429 and 5xx, the answers a retry may change."""
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


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` with each URL in it redacted, and the exception it was
    raised from."""
    text = _URL.sub(lambda m: redact(m.group(0)), str(exc))
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if exc.__cause__ is not None:
        said += f" (from {describe(exc.__cause__)})"
    return said


# -- the attempt loop -------------------------------------------------------------------------

class Retrier:
    """The attempts of one transfer (``doing`` is ``"read"`` or ``"write"``) of ``url`` against
    ``policy``.

    Whoever makes a request calls :meth:`attempt` first; on a transient failure,
    :meth:`failed` (or :meth:`wait`, :meth:`wait_async`, which also sleep); on progress,
    :meth:`succeeded`. The budget is ``policy.retries`` failures *in a row*: a long transfer
    over a flaky link gets through as long as each attempt moves forward. ``offset`` is where
    the transfer stands, shown in logs and errors. :meth:`call_async` is the whole loop for
    one request. Requests in flight together each need a retrier of their own.
    """

    def __init__(self, policy: RetryPolicy, *, url: str, resolved_url: str = "",
                 doing: str = "read", rng: random.Random | None = None) -> None:
        self.policy = policy
        self.url = redact(url)
        self.resolved_url = redact(resolved_url or url)
        self.doing = doing
        self.offset = 0
        self.failures = 0  # in a row
        self.attempts = 0  # requests made
        self._rng = rng or random.Random()

    def attempt(self, *, resume: bool = False) -> None:
        """Count a request about to be made (``resume``: one that continues a transfer)."""
        self.attempts += 1
        count_io(requests=1, resumes=int(resume))

    def succeeded(self) -> None:
        """The transfer moved forward: the failures in a row start again from zero."""
        self.failures = 0

    def failed(self, exc: BaseException, what: str = "") -> float:
        """Count the failure ``exc`` (of ``what``, a part of the transfer, when given): the
        seconds to wait before the next attempt, or :class:`~wds_cloud.errors.TransferError`
        raised from ``exc`` when the budget is spent."""
        self.failures += 1
        if self.failures > self.policy.retries:
            of = f" of {what}" if what else ""
            raise self.give_up(f"{self.failures} failures in a row{of}, the last: "
                               f"{describe(exc)}") from exc
        delay = self.policy.delay(self.failures, self._rng)
        count_io(retries=1)
        where = f"{what} for {self.resolved_url}" if what else \
            f"{self.resolved_url} at byte {self.offset}"
        log.info("retry %d/%d of %s in %.2f s after %s", self.failures, self.policy.retries,
                 where, delay, describe(exc))
        return delay

    def wait(self, exc: BaseException, what: str = "") -> None:
        """:meth:`failed`, then sleep its delay (on a synchronous caller's thread)."""
        time.sleep(self.failed(exc, what))

    async def wait_async(self, exc: BaseException, what: str = "") -> None:
        """:meth:`failed`, then sleep its delay (on the event loop)."""
        await asyncio.sleep(self.failed(exc, what))

    def give_up(self, why: str) -> TransferError:
        """The error that ends the transfer (counted as a failure in :func:`io_stats`)."""
        count_io(failures=1)
        shown = self.url if self.url == self.resolved_url else \
            f"{self.url} ({self.resolved_url})"
        at = f" at byte {self.offset}" if self.doing == "read" else ""
        return TransferError(f"cannot {self.doing} {shown}{at}: {why}", url=self.url,
                             resolved_url=self.resolved_url, offset=self.offset,
                             attempts=self.attempts)

    async def call_async(self, what: str, fn: Callable[..., Awaitable[T]], *args: object,
                         **kwargs: object) -> T:
        """``await fn(*args, **kwargs)`` until it returns, retried while it raises one of
        :data:`TRANSIENT`; ``what`` names the request in logs and errors."""
        while True:
            self.attempt()
            try:
                result = await fn(*args, **kwargs)
            except TRANSIENT as exc:
                await self.wait_async(exc, what)
                continue
            self.succeeded()
            return result


# -- counters ---------------------------------------------------------------------------------

@dataclass
class IOStats:
    """Counters of this process's remote transfers (a snapshot from :func:`io_stats`):
    ``requests`` made (reads and uploads), ``retries`` after a transient failure, ``resumes``
    of a read where it stopped, ``bytes_read``, ``failures`` (transfers given up) and
    ``uploads`` committed."""

    requests: int = 0
    retries: int = 0
    resumes: int = 0
    bytes_read: int = 0
    failures: int = 0
    uploads: int = 0


_stats = IOStats()
_stats_lock = threading.Lock()


def count_io(**increments: int) -> None:
    """Add ``increments`` to the counters of :func:`io_stats` (``bytes_read=n``, ...)."""
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
