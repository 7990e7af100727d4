"""Retries, all in one place: the policy, what is transient for each store, and the attempt loop.

**To change how wds_cloud retries, change this file**; the stores only translate what their
library raised with :func:`status_error` and :func:`is_transient`, and hand every request to a
:class:`Retrier`.

- :class:`RetryPolicy` — how hard to try: ``retries`` retries after a failure before giving
  up (``WDS_RETRIES``): a transfer ends after ``retries + 1`` attempts in a row that failed,
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
  the policy (any progress resets them), logs its first retry at WARNING and the others at
  INFO, waits the backoff (``wait``, ``wait_async``) and raises
  :class:`~wds_cloud.errors.TransferError` when the budget is spent, in one line: the URL, what
  failed in a few words (:func:`reason`: "connection refused (host:port)", "timed out",
  "HTTP 503") and the attempts; the library's exception stays its ``__cause__``.
  :class:`~wds_cloud.stores.streams.ResumableStream` reads and resumes with it;
  :meth:`Retrier.call_async` runs every upload request of every store.
- :func:`io_stats` — the counters of this process's transfers (requests, retries, resumes,
  bytes read, failures, uploads), counted mostly by the loop; they live in
  :mod:`wds_cloud.stores.iostats` (per process, and how a DataLoader worker reports its own)
  and are re-exported here.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from ..errors import AccessDeniedError, OpenError, ShardNotFoundError, TransferError
from ..settings import Settings
from ..urls import redact, redact_text
from .iostats import (
    IO_FIELDS,
    IOStats,
    count_io,
    current_source,
    io_stats,
    report_io_to,
    reset_io_stats,
)

__all__ = [
    "IO_FIELDS",
    "TRANSIENT",
    "TRANSIENT_BY_STORE",
    "IOStats",
    "Retrier",
    "RetryPolicy",
    "RetryableError",
    "causes",
    "count_io",
    "describe",
    "io_stats",
    "is_transient",
    "reason",
    "report_io_to",
    "reset_io_stats",
    "status_error",
    "transient_errors",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


# -- the policy -------------------------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``retries`` retries after a failure (so ``retries + 1`` attempts in a
    row may fail before the transfer gives up), backoff from ``backoff`` doubling up to
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
    refused connection, a timeout. ``status`` is the HTTP status when there was one, ``reason``
    what failed in a few words when the backend knows better than :func:`reason`."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


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
    # connection, read-timeout and streaming errors are BotoCoreErrors; missing credentials, a
    # bad parameter and a configuration botocore cannot use (an endpoint URL that is none, an
    # unknown region or profile) are too, but no retry mends them
    "s3": ((*_AIOHTTP, "botocore.exceptions:BotoCoreError"),
           ("botocore.exceptions:NoCredentialsError",
            "botocore.exceptions:PartialCredentialsError",
            "botocore.exceptions:ParamValidationError",
            "botocore.exceptions:EndpointProviderError",
            "botocore.exceptions:BaseEndpointResolverError",
            "botocore.exceptions:UnknownRegionError",
            "botocore.exceptions:ProfileNotFound",
            "botocore.exceptions:ConfigParseError",
            "botocore.exceptions:InvalidConfigError")),
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
                                 "credentials (storage_options, or the SDK's environment and "
                                 "config files)", url=shown)
    if status in (408, 429) or status >= 500:
        return RetryableError(f"{said} {doing} {shown}", status=status, reason=said)
    return OpenError(f"{said} {doing} {shown}", url=shown)


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` with each URL in it redacted, and the exception it was
    raised from."""
    text = redact_text(str(exc))
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if exc.__cause__ is not None:
        said += f" (from {describe(exc.__cause__)})"
    return said


#: what failed, in a few words, for the builtin errors at the root of a failed request
_OS_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (ConnectionResetError, "connection reset"),
    (ConnectionAbortedError, "connection aborted"),
    (BrokenPipeError, "connection broken"),
    (socket.gaierror, "host name not found"),
    (TimeoutError, "timed out"),
    (asyncio.TimeoutError, "timed out"),  # not yet the builtin on Python 3.10
)
#: the same for the libraries' errors, by a word of their class name (nothing is imported)
_NAMED_REASONS = (("Timeout", "timed out"), ("Disconnected", "server disconnected"),
                  ("Payload", "response cut short"), ("IncompleteRead", "response cut short"),
                  ("Connect", "cannot connect"))


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (or during), outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        inner = current.__cause__ or (None if current.__suppress_context__
                                      else current.__context__)
        current = inner or getattr(current, "os_error", None)  # aiohttp's connector errors


def _address(exc: BaseException) -> str:
    """The host:port or endpoint a library's connection error names, or ``""``."""
    host, port = getattr(exc, "host", None), getattr(exc, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return f"{host}:{port}"
    kwargs = getattr(exc, "kwargs", None)  # botocore's EndpointConnectionError: the request's URL
    endpoint = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
    return urlsplit(endpoint).netloc.rpartition("@")[2] if isinstance(endpoint, str) else ""


def _said(exc: BaseException) -> str:
    for cls, said in _OS_REASONS:
        if isinstance(exc, cls):
            return said
    if (type(exc) in (ConnectionError, OSError) or isinstance(exc, RetryableError)) and str(exc):
        # our own words: a body ended short, an answer a store judged (URLs redacted)
        return redact_text(str(exc))
    name = type(exc).__name__
    return next((said for word, said in _NAMED_REASONS if word in name), "")


def reason(exc: BaseException) -> str:
    """What failed, in a few words and without the libraries' reprs: ``"HTTP 503 SlowDown"``,
    ``"connection refused (127.0.0.1:9)"``, ``"timed out"``, ``"response cut short"``...

    Looks through ``exc`` and what it was raised from: a :class:`RetryableError`'s own
    ``reason`` first, else the innermost error it knows, with the address a connection error
    names; else ``Type: message`` of ``exc`` (URLs redacted)."""
    chain = list(causes(exc))
    for error in chain:
        if isinstance(error, RetryableError) and error.reason:
            return error.reason
    address = next((a for a in map(_address, chain) if a), "")
    for error in reversed(chain):
        said = _said(error)
        if said:
            return f"{said} ({address})" if address and address not in said else said
    text = redact_text(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _count(n: int, word: str) -> str:
    """``1 retry``, ``2 retries``, ``9 attempts``."""
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


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
        self._rng = rng  # made at the first retry: seeding one costs ~50 µs, per shard
        self._warned = False
        #: the spec source whose shard this transfer reads (counted for it), if any
        self.source = current_source()

    def attempt(self, *, resume: bool = False) -> None:
        """Count a request about to be made (``resume``: one that continues a transfer)."""
        self.attempts += 1
        count_io(self.source, requests=1, resumes=int(resume),
                 gets=int(self.doing == "read"))

    def succeeded(self) -> None:
        """The transfer moved forward: the failures in a row start again from zero."""
        self.failures = 0

    def failed(self, exc: BaseException, what: str = "") -> float:
        """Count the failure ``exc`` (of ``what``, a part of the transfer, when given): the
        seconds to wait before the next attempt, or :class:`~wds_cloud.errors.TransferError`
        raised from ``exc`` when the budget is spent (``policy.retries`` retries were made and
        the attempt after the last failed too).

        The first retry of a transfer is logged at WARNING (a failing store is not silent for
        the backoff's tens of seconds), the others at INFO, the library's error at DEBUG."""
        self.failures += 1
        said = reason(exc)
        log.debug("%s of %s failed: %s", what or "a request", self.resolved_url, describe(exc))
        if self.failures > self.policy.retries:
            on = f" on {what}" if what else ""
            raise self.give_up(
                f"{said}{on}; gave up after {_count(self.policy.retries, 'retry')} "
                f"({_count(self.failures, 'attempt')} in a row failed)") from exc
        if self._rng is None:
            self._rng = random.Random()
        delay = self.policy.delay(self.failures, self._rng)
        count_io(self.source, retries=1)
        where = f"{what} for {self.resolved_url}" if what else \
            f"{self.resolved_url} at byte {self.offset}"
        level = logging.INFO if self._warned else logging.WARNING
        self._warned = True
        log.log(level, "retry %d/%d of %s in %.2f s after %s", self.failures,
                self.policy.retries, where, delay, said)
        return delay

    def wait(self, exc: BaseException, what: str = "") -> None:
        """:meth:`failed`, then sleep its delay (on a synchronous caller's thread)."""
        time.sleep(self.failed(exc, what))

    async def wait_async(self, exc: BaseException, what: str = "") -> None:
        """:meth:`failed`, then sleep its delay (on the event loop)."""
        await asyncio.sleep(self.failed(exc, what))

    def give_up(self, why: str) -> TransferError:
        """The error that ends the transfer (counted as a failure in :func:`io_stats`)."""
        count_io(self.source, failures=1)
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
