"""Openers: one small object per URL scheme that turns a URL into a byte stream.

An opener is anything with ``open(url, mode, **options) -> BinaryIO``. Openers are found by
scheme in a registry that holds either the opener itself or a lazy ``"module:attribute"`` path,
so nothing is imported before a URL of that scheme is opened. Third parties plug in with
:func:`register_opener` or an entry point in the ``wds_cloud.openers`` group (name = scheme,
value = ``module:attribute`` of an opener or of a class to instantiate). Registering a scheme that
is taken is refused unless ``replace=True``.

Built in: local paths and ``file:``, ``-`` (stdin/stdout), ``pipe:CMD`` (:mod:`wds_cloud.pipes`),
``http``/``https`` (:mod:`wds_cloud.httpstore`), ``s3`` (:mod:`wds_cloud.s3store`),
``gs``/``gcs`` (:mod:`wds_cloud.gcsstore`), ``az``/``abfs``/``abfss`` (:mod:`wds_cloud.azurestore`).
``ais://`` URLs are mapped to AIStore's REST API by the router.

An opener may also have ``glob(pattern, *, storage_options) -> list[str]`` (used to expand shard
patterns) and ``takes_settings = True`` (the router then passes ``settings=``).
"""

from __future__ import annotations

import contextlib
import glob as globmod
import importlib
import io
import logging
import os
import secrets
import sys
import threading
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol, cast, runtime_checkable
from urllib.request import url2pathname

from .errors import (
    AccessDeniedError,
    ConfigError,
    MissingDependencyError,
    OpenError,
    ShardNotFoundError,
    UnsupportedSchemeError,
)
from .urls import split_scheme

__all__ = [
    "LocalOpener",
    "Opener",
    "StdioOpener",
    "function_opener",
    "get_opener",
    "register_opener",
    "registered_schemes",
    "unregister_opener",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "wds_cloud.openers"


@runtime_checkable
class Opener(Protocol):
    """Opens a URL of one scheme as a binary stream (``mode`` is ``"rb"`` or ``"wb"``)."""

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO: ...


class LocalOpener:
    """Local paths and ``file:`` URLs; read streams carry ``local_path``.

    A regular file is written under a temporary name in its directory and renamed into place
    when closed, so a reader never sees half a shard; ``abort()`` on the stream removes it.
    """

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        scheme, rest = split_scheme(url)
        path = url2pathname(rest[2:] if rest.startswith("//") else rest) if scheme else url
        bufsize = options.pop("bufsize", -1)
        if options:
            raise ConfigError(f"options {sorted(options)} are not used when opening local {url!r}")
        writing = "w" in mode
        try:
            if writing and (not os.path.exists(path) or os.path.isfile(path)):
                return cast(BinaryIO, _AtomicFile(path, bufsize))
            stream = open(path, mode, buffering=bufsize)  # noqa: SIM115 (the caller closes it)
        except FileNotFoundError as exc:
            if writing:
                raise OpenError(f"cannot create {path!r}: its directory does not exist",
                                url=url) from exc
            raise ShardNotFoundError(f"no such file: {path!r}", url=url) from exc
        except PermissionError as exc:
            doing = "writing" if writing else "reading"
            raise AccessDeniedError(f"permission denied {doing} {path!r}", url=url) from exc
        except IsADirectoryError as exc:
            raise OpenError(f"{path!r} is a directory, not a shard", url=url) from exc
        if not writing:
            stream.local_path = os.path.abspath(path)  # type: ignore[attr-defined]
        return cast(BinaryIO, stream)

    def glob(self, pattern: str, *, storage_options: Any = None) -> list[str]:
        """Local paths (or ``file:`` URLs, as given) matching ``pattern``."""
        scheme, rest = split_scheme(pattern)
        if not scheme:
            return sorted(globmod.glob(pattern))
        prefix = "file://" if rest.startswith("//") else "file:"
        path = url2pathname(rest[2:] if rest.startswith("//") else rest)
        return sorted(prefix + found for found in globmod.glob(path))


class _AtomicFile(io.BufferedWriter):
    """A file written as ``.NAME.tmp-…`` beside ``path`` and renamed to ``path`` on close."""

    def __init__(self, path: str, bufsize: int) -> None:
        directory, name = os.path.split(os.path.abspath(path))
        self._tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        self._path = path
        # O_EXCL: a name of our own; mode 0o666 lets the umask apply as for any new file
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        super().__init__(io.FileIO(fd, "wb"), bufsize if bufsize > 0 else io.DEFAULT_BUFFER_SIZE)

    @property
    def name(self) -> str:
        return self._path

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
            os.replace(self._tmp, self._path)
        except BaseException:
            self._remove()
            raise

    def abort(self) -> None:
        """Close and delete the temporary file; ``path`` is left as it was."""
        if not self.closed:
            try:
                super().close()
            finally:
                self._remove()

    def _remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)

    def __del__(self) -> None:
        # dropped without close(): never publish (and __init__ may have failed half-way)
        with contextlib.suppress(ValueError, AttributeError):
            if not self.closed:
                self.abort()


class StdioOpener:
    """``-``: standard input for reading, standard output for writing."""

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        options.pop("bufsize", None)
        if options:
            raise ConfigError(f"options {sorted(options)} are not used when opening '-'")
        stream = sys.stdout.buffer if "w" in mode else sys.stdin.buffer
        return cast(BinaryIO, _Unclosable(stream))


class _Unclosable(io.RawIOBase):
    """Wraps stdin/stdout so closing a shard does not close the process's own streams."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return cast(bytes, self._stream.read(size))

    def readinto(self, buffer: Any) -> int:
        return cast(int, self._stream.readinto(buffer))

    def write(self, data: Any) -> int:
        return cast(int, self._stream.write(data))

    def close(self) -> None:
        if not self.closed:
            self._stream.flush() if self._stream.writable() else None
        super().close()


_BUILTINS: dict[str, Opener | str] = {
    "": "wds_cloud.openers:LocalOpener",
    "file": "wds_cloud.openers:LocalOpener",
    "pipe": "wds_cloud.pipes:PipeOpener",
    "-": "wds_cloud.openers:StdioOpener",
    "http": "wds_cloud.httpstore:HttpOpener",
    "https": "wds_cloud.httpstore:HttpOpener",
    "s3": "wds_cloud.s3store:S3Opener",
    "gs": "wds_cloud.gcsstore:GcsOpener",
    "gcs": "wds_cloud.gcsstore:GcsOpener",
    "az": "wds_cloud.azurestore:AzureOpener",
    "abfs": "wds_cloud.azurestore:AzureOpener",
    "abfss": "wds_cloud.azurestore:AzureOpener",
}
#: what to install for schemes whose opener needs an optional package: (module, pip extra)
_INSTALL_HINTS: dict[str, tuple[str, str]] = {
    "http": ("aiohttp", "http"), "https": ("aiohttp", "http"),
    "s3": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
}

_registry: dict[str, Opener | str] = dict(_BUILTINS)
_entry_points_loaded = False
_lock = threading.Lock()


def register_opener(scheme: str, opener: Opener | str, *, replace: bool = False) -> None:
    """Register ``opener`` (an object with ``open``, or a lazy ``"module:attr"``) for ``scheme``."""
    scheme = scheme.lower()
    if not isinstance(opener, str) and not callable(getattr(opener, "open", None)):
        raise ConfigError(f"opener for {scheme!r} has no open(url, mode) method: {opener!r}")
    with _lock:
        _load_entry_points()
        if scheme in _registry and not replace:
            raise ConfigError(
                f"scheme {scheme!r} already has an opener ({_registry[scheme]!r}); "
                f"pass replace=True to replace it"
            )
        _registry[scheme] = opener


def unregister_opener(scheme: str) -> None:
    """Remove the opener of ``scheme``; URLs of that scheme then raise UnsupportedSchemeError."""
    with _lock:
        _registry.pop(scheme.lower(), None)


def registered_schemes() -> list[str]:
    """The schemes that have an opener, sorted (``""`` is local paths)."""
    with _lock:
        _load_entry_points()
        return sorted(_registry)


def get_opener(url: str) -> Opener:
    """The opener for ``url``'s scheme; raises :class:`UnsupportedSchemeError` if there is none."""
    scheme = "-" if url == "-" else split_scheme(url)[0]
    with _lock:
        _load_entry_points()
        entry = _registry.get(scheme)
        if entry is None:
            raise UnsupportedSchemeError(url, scheme, [s or "(local path)" for s in _registry])
        if isinstance(entry, str):
            entry = _registry[scheme] = _resolve(scheme, entry)
    return entry


def _resolve(scheme: str, dotted: str) -> Opener:
    module_name, _, attr = dotted.partition(":")
    hint = _INSTALL_HINTS.get(scheme)
    try:
        if hint is not None:  # the opener's own module imports its library lazily
            importlib.import_module(hint[0])
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if hint is not None:
            raise MissingDependencyError(f"opening {scheme}:// URLs", *hint) from exc
        raise
    obj: Any = getattr(module, attr)
    return cast(Opener, obj() if isinstance(obj, type) else obj)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() in _registry:
            log.warning("entry point %s=%s ignored: scheme already registered", ep.name, ep.value)
            continue
        _registry[ep.name.lower()] = ep.value


def function_opener(func: Callable[..., BinaryIO]) -> Opener:
    """Adapt a webdataset-style ``handler(url, mode, bufsize, **kw)`` into an :class:`Opener`."""
    return _FunctionOpener(func)


class _FunctionOpener:
    def __init__(self, func: Callable[..., BinaryIO]) -> None:
        self.func = func

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        bufsize = options.pop("bufsize", 8192)
        return self.func(url, mode, bufsize, **options)

    def __repr__(self) -> str:
        return f"function_opener({self.func!r})"
