"""What the ``s3://``, ``gs://`` and ``az://`` openers share: an fsspec filesystem per scheme.

The filesystem is ``fsspec.filesystem(protocol, **storage_options)`` (s3fs, gcsfs, adlfs):
fsspec caches it per options and resets it after a fork, and its event loop runs the I/O. The
stores are :mod:`wds_cloud.stores.s3`, :mod:`wds_cloud.stores.gcs` and
:mod:`wds_cloud.stores.azure`.

**Reads** are one streaming GET per shard on that filesystem's own async client (not fsspec's
buffered files, which make a request per block), behind a :class:`LoopSource`; for ``s3://``
and ``gs://`` the store's client builds (and signs) the GET and the reading thread sends it
(:mod:`wds_cloud.stores.direct`). :class:`~wds_cloud.stores.streams.ResumableStream` retries and
resumes at the byte where a connection dropped, pinned to the version seen at open.

**Writes** are spooled by :class:`~wds_cloud.stores.streams.AtomicUpload` and sent when the
shard is complete: one PUT up to two parts of 16 MiB, else the store's multipart upload
(:meth:`CloudOpener._put_parts`), each request run by
:meth:`~wds_cloud.stores.retry.Retrier.call_async`. The object appears only when the upload is
committed; a failed one is aborted.

**Retries** are ours, from :mod:`wds_cloud.stores.retry`, for reads and writes alike: the
libraries' own are off (or bypassed), so that the policy is the one that counts and every retry
shows in :func:`~wds_cloud.stores.retry.io_stats`.

**Listing**: ``glob("s3://bucket/train/shard-*.tar")`` returns full URLs with the scheme given.
Listings and lookups (``glob``, and ``info``/``ls`` for the sizes of ``ls`` and ``spec check``)
go through :meth:`CloudOpener.listed`, retried by the policy of reads (``WDS_RETRIES``,
``WDS_TIMEOUT``): each store sets its library to make one attempt (s3fs's ``retries``,
gcsfs's ``_request`` without its retry decorator, azure-core's retry policy) with our timeout,
so that an unreachable or failing endpoint ends within the settings' budget, in one line.

``storage_options`` are the keyword arguments of the scheme's fsspec filesystem class; a name it
does not take is a :class:`~wds_cloud.errors.ConfigError`. Credentials come from there or from
the SDKs' usual sources; nothing here reads them.
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, BinaryIO, ClassVar, TypeVar, cast

from ..errors import ConfigError, OpenError
from ..settings import Settings
from ..urls import redact, split_scheme
from .aio import AsyncBody, guard_forks, run
from .retry import Retrier, RetryableError, RetryPolicy, reason, status_error
from .streams import AtomicUpload, Body, ObjectMeta, ResumableStream, opener_options

__all__ = ["CloudOpener", "Fetched", "LoopSource", "Request", "header_meta", "library_error",
           "object_size", "parameters", "range_ignored", "releaser", "send_parts",
           "sequential_parts"]

log = logging.getLogger(__name__)

#: accepted by every fsspec filesystem (instance cache, listings cache, event loop)
_FSSPEC_OPTIONS = frozenset({"asynchronous", "batch_size", "listings_expiry_time", "loop",
                             "max_paths", "skip_instance_cache", "use_listings_cache"})
#: part size of multipart, block and resumable uploads (a multiple of GCS's 256 KiB)
_PART = 16 * 2**20
_PARTS_IN_FLIGHT = 4
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_GLOB = re.compile(r"[*?\[]")

Fetched = tuple[AsyncBody, ObjectMeta]
#: ``request(method, *args, **kw)``: one call of a store's client, awaited
Request = Callable[..., Awaitable[Any]]
T = TypeVar("T")


def library_error(exc: BaseException, url: str, doing: str) -> Exception:
    """Our error for what a store library raised (a builtin, gcsfs's HttpError, ...)."""
    status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    if isinstance(status, int) and status >= 400:
        return status_error(status, url, doing, detail=type(exc).__name__)
    if isinstance(exc, FileNotFoundError):
        return status_error(404, url, doing)
    if isinstance(exc, PermissionError) or str(exc).startswith("Forbidden"):  # gcsfs's 403
        return status_error(403, url, doing)
    return OpenError(f"{doing} {redact(url)} failed: {reason(exc)}", url=redact(url))


def object_size(content_range: str | None, content_length: Any, offset: int) -> int | None:
    """The whole object's size from a response's Content-Range, or its Content-Length."""
    match = _CONTENT_RANGE.match(content_range or "")
    if match:
        return int(match.group(3))
    return int(content_length) if content_length is not None and not offset else None


def header_meta(headers: Any, offset: int, version: str | None) -> ObjectMeta:
    """The :class:`ObjectMeta` of a response with HTTP ``headers`` to a GET from ``offset``."""
    return ObjectMeta(object_size(headers.get("Content-Range"), headers.get("Content-Length"),
                                  offset), version)


def range_ignored(url: str, status: int) -> OpenError:
    return OpenError(f"{redact(url)}: the server ignored a Range request (HTTP {status}), so "
                     "a read cannot resume", url=redact(url))


def answer_error(url: str, status: int, offset: int) -> Exception | None:
    """The error an answer with ``status`` to a GET from ``offset`` is, or None (it carries
    the object's bytes): an error status, or a range the server ignored."""
    if status >= 400:
        return status_error(status, url, "reading", offset=offset)
    if offset and status != 206:
        return range_ignored(url, status)
    return None


def releaser(resp: Any) -> Callable[[bool], None]:
    """Closes an aiohttp response: back to the pool when read to the end, else dropped."""
    def on_close(finished: bool) -> None:
        resp.release() if finished else resp.close()
    return on_close


async def send_parts(fileobj: BinaryIO, size: int, max_parts: int,
                     send: Callable[[int, bytes], Awaitable[Any]]) -> list[Any]:
    """``send(number, bytes)`` each part of ``fileobj`` (numbered from 1), a few at a time so
    memory stays bounded; their results in order."""
    part_size = max(_PART, -(-size // max_parts))
    results: list[Any] = []
    while chunks := [c for c in (fileobj.read(part_size) for _ in range(_PARTS_IN_FLIGHT)) if c]:
        first = len(results) + 1
        batch = await asyncio.gather(*(send(first + i, c) for i, c in enumerate(chunks)),
                                     return_exceptions=True)
        for result in batch:  # all of the batch have ended: nothing still writes after abort
            if isinstance(result, BaseException):
                raise result
        results += batch
    return results


def sequential_parts(fileobj: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of each part of ``fileobj``, one after another."""
    offset = 0
    while data := fileobj.read(_PART):
        yield offset, data
        offset += len(data)


def parameters(init: Any) -> frozenset[str]:
    """The named parameters of an ``__init__`` (fsspec's metaclass hides a class's own)."""
    params = inspect.signature(init).parameters.values()
    return frozenset(p.name for p in params
                     if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def class_options(cls: type) -> frozenset[str]:
    """The keyword arguments ``cls(...)`` takes by name: those of its ``__init__`` and, while
    an ``__init__`` hands ``**kwargs`` on, of its bases' (gcsfs's ``ExtendedGcsFileSystem``,
    its ``gs`` class by default, names only its own and passes the rest to
    ``GCSFileSystem``)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        names |= parameters(init)
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return frozenset(names)


def _scrub(text: str, options: dict[str, Any]) -> str:
    """``text`` with the string values of ``options`` (keys, connection strings) hidden."""
    values = [v for v in options.values() if isinstance(v, str)]
    values += [v for d in options.values() if isinstance(d, dict) for v in d.values()
               if isinstance(v, str)]
    for value in values:
        text = text.replace(value, "***") if len(value) > 3 else text
    return text


class LoopSource:
    """One object as a :class:`~wds_cloud.stores.streams.RangeSource`: ``fetch`` runs the
    store's async ``_get`` on the filesystem's event loop."""

    def __init__(self, fs: Any, url: str) -> None:
        self._fs = fs
        self._url = url

    def fetch(self, offset: int, version: str | None, *,
              resumed: bool = False) -> tuple[Body, ObjectMeta]:
        return cast(Fetched, run(self._fs.loop, self._get, offset, version))

    async def _get(self, offset: int, version: str | None) -> Fetched:
        raise NotImplementedError


class CloudOpener:
    """What the three openers share: options, the filesystem, ``open``, ``glob`` and the
    choice between one PUT and a multipart upload. A store sets ``protocol`` and gives
    ``_source``, ``_put`` and ``_put_parts``."""

    takes_settings: ClassVar[bool] = True
    #: ``open(url, "rb", offset=n)`` starts at byte n (a ranged GET)
    ranged: ClassVar[bool] = True
    protocol: ClassVar[str]

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        """A :class:`ResumableStream` (``rb``, from byte ``offset``) or an
        :class:`AtomicUpload` (``wb``) of ``url``."""
        offset = int(options.pop("offset", 0) or 0)
        policy, storage_options = opener_options(url, options)
        fs = self.filesystem(url, storage_options, timeout=policy.timeout)
        if "w" in mode:
            return cast(BinaryIO, AtomicUpload(
                lambda fileobj: self._upload(fs, url, policy, fileobj), url=url))
        return cast(BinaryIO, ResumableStream(self._source(fs, url, policy), url=url,
                                              policy=policy, offset=offset))

    def glob(self, pattern: str, *, storage_options: dict[str, Any] | None = None,
             settings: Settings | None = None) -> list[str]:
        """The URLs of the objects matching ``pattern`` (``*``, ``?``, ``[...]``), listed
        with ``settings.timeout`` (``WDS_TIMEOUT``)."""
        timeout = (settings or Settings()).timeout
        fs = self.filesystem(pattern, dict(storage_options or {}), timeout=timeout)
        path = fs._strip_protocol(pattern)
        fs.invalidate_cache(_GLOB.split(path, 1)[0].rsplit("/", 1)[0])  # list afresh
        try:
            found = self.listed(pattern, "list", fs.glob, path, settings=settings)
        except FileNotFoundError as exc:
            raise library_error(exc, pattern, "listing") from exc
        return [self._url_of(pattern, p) for p in found]

    def listed(self, url: str, doing: str, fn: Callable[..., T], *args: Any,
               settings: Settings | None = None) -> T:
        """``fn(*args)``: the library listing or looking up ``url`` (``doing``: ``"list"`` or
        ``"look up"``). What it raises comes out as our error, but ``FileNotFoundError``, which
        callers read as "not there"; a failure a new request may get past is retried by the
        settings' policy (``WDS_RETRIES``, backoff; the library makes one attempt, see
        :meth:`filesystem`) and ends in a :class:`~wds_cloud.errors.TransferError`, not the
        internal ``RetryableError``."""
        gerund = {"list": "listing", "look up": "looking up"}[doing]
        noun = {"list": "listing", "look up": "lookup"}[doing]
        retrier = Retrier(RetryPolicy.from_settings(settings or Settings()), url=url,
                          doing=doing)
        while True:
            try:
                return fn(*args)
            except FileNotFoundError:
                raise
            except Exception as exc:  # the libraries raise builtins and their own errors
                error = self._failure(exc, url, gerund)
                if not isinstance(error, RetryableError):
                    raise error from exc
                error.__cause__ = exc
                retrier.wait(error, noun)

    def _failure(self, exc: BaseException, url: str, doing: str) -> Exception:
        """Our error for what the store's library raised while ``doing`` ``url``."""
        return library_error(exc, url, doing)

    def filesystem(self, url: str, storage_options: dict[str, Any], *, timeout: float) -> Any:
        """``fsspec.filesystem`` for this scheme, after checking ``storage_options``; a store
        sets its library's requests to ``timeout`` and one attempt (:meth:`_defaults`, and
        its own ``filesystem``), so that our retries are the ones that count."""
        import fsspec

        cls = fsspec.get_filesystem_class(self.protocol)
        known = _FSSPEC_OPTIONS | class_options(cls)
        for name in storage_options:
            if name not in known and not self._passes(name):
                close = difflib.get_close_matches(name, sorted(known), n=1)
                raise ConfigError(
                    f"storage_options for {split_scheme(url)[0]}:// (opening {redact(url)!r}): "
                    f"{cls.__name__} has no option {name!r}"
                    + (f"; did you mean {close[0]!r}?" if close else ""))
        options = self._defaults({**cls._get_kwargs_from_urls(url), **storage_options}, timeout)
        guard_forks()  # before any client exists, whatever uses it first (a listing, a read)
        try:
            return fsspec.filesystem(self.protocol, **options)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"storage_options for {split_scheme(url)[0]}:// were refused by "
                              f"{cls.__name__}: {_scrub(str(exc), storage_options)}") from exc

    def _upload(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO) -> None:
        run(fs.loop, self._commit, fs, url, policy, fileobj)
        fs.invalidate_cache(fs._strip_protocol(url))

    async def _commit(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO) -> None:
        """Send the spooled ``fileobj``: one PUT up to two parts, else in parts."""
        size = fileobj.seek(0, 2)
        fileobj.seek(0)
        if size <= 2 * _PART:
            await self._put(fs, url, policy, fileobj.read())
        else:
            await self._put_parts(fs, url, policy, fileobj, size)

    def _passes(self, name: str) -> bool:
        """Whether the filesystem hands option ``name`` on to a library that checks it."""
        return False

    def _defaults(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        return options

    def _url_of(self, pattern: str, path: str) -> str:
        return f"{split_scheme(pattern)[0]}://{path}"

    def _source(self, fs: Any, url: str, policy: RetryPolicy) -> LoopSource:
        raise NotImplementedError

    async def _put(self, fs: Any, url: str, policy: RetryPolicy, data: bytes) -> None:
        """Write ``data`` as the object ``url`` in one request."""
        raise NotImplementedError

    async def _put_parts(self, fs: Any, url: str, policy: RetryPolicy, fileobj: BinaryIO,
                         size: int) -> None:
        """Write the ``size`` bytes of ``fileobj`` as the object ``url`` in parts; the object
        appears only when all are sent, and nothing is left behind when one fails."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
