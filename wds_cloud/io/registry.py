"""Openers: one small object per URL scheme that turns a URL into a byte stream.

An opener is anything with ``open(url, mode, **options) -> BinaryIO``. Openers are found by
scheme in a registry that holds either the opener itself or a lazy ``"module:attribute"`` path,
so nothing is imported before a URL of that scheme is opened. Third parties plug in with
:func:`register_opener` or an entry point in the ``wds_cloud.openers`` group (name = scheme,
value = ``module:attribute`` of an opener or of a class to instantiate). Registering a scheme that
is taken is refused unless ``replace=True``.

Built in: local paths and ``file:``, ``-`` (stdin/stdout) (:mod:`wds_cloud.io.local`),
``pipe:CMD`` (:mod:`wds_cloud.io.pipes`), ``http``/``https`` (:mod:`wds_cloud.stores.http`),
``s3`` (:mod:`wds_cloud.stores.s3`), ``gs``/``gcs`` (:mod:`wds_cloud.stores.gcs`),
``az``/``abfs``/``abfss`` (:mod:`wds_cloud.stores.azure`).
``ais://`` URLs are mapped to AIStore's REST API by the router (``gopen``, ``WebDataset``) and
read over ``http``: ``ais`` has no opener of its own, so :func:`registered_schemes` does not
return it, but an unknown scheme's :class:`UnsupportedSchemeError` names it among the schemes
that work.

An opener may also have ``glob(pattern, *, storage_options) -> list[str]`` (used to expand shard
patterns) and ``takes_settings = True`` (the router then passes ``settings=``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol, cast, runtime_checkable

from ..errors import (
    ConfigError,
    MissingDependencyError,
    UnsupportedSchemeError,
)
from ..urls import split_scheme
from .forks import ForkSafeLock

__all__ = [
    "Opener",
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


_BUILTINS: dict[str, Opener | str] = {
    "": "wds_cloud.io.local:LocalOpener",
    "file": "wds_cloud.io.local:LocalOpener",
    "pipe": "wds_cloud.io.pipes:PipeOpener",
    "-": "wds_cloud.io.local:StdioOpener",
    "http": "wds_cloud.stores.http:HttpOpener",
    "https": "wds_cloud.stores.http:HttpOpener",
    "s3": "wds_cloud.stores.s3:S3Opener",
    "gs": "wds_cloud.stores.gcs:GcsOpener",
    "gcs": "wds_cloud.stores.gcs:GcsOpener",
    "az": "wds_cloud.stores.azure:AzureOpener",
    "abfs": "wds_cloud.stores.azure:AzureOpener",
    "abfss": "wds_cloud.stores.azure:AzureOpener",
}
#: what to install for schemes whose opener needs an optional package: (module, pip extra)
_INSTALL_HINTS: dict[str, tuple[str, str]] = {
    "http": ("aiohttp", "http"), "https": ("aiohttp", "http"),
    "s3": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
}

#: schemes the router maps to another before any opener is asked: named where schemes are listed
_ROUTED = {"ais": "AIStore's REST API at AIS_ENDPOINT"}

_registry: dict[str, Opener | str] = dict(_BUILTINS)
_entry_points_loaded = False
_lock = ForkSafeLock()  # (a forked child gets its own)


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
        if entry is None and scheme in _ROUTED:
            raise ConfigError(f"{scheme}:// URLs such as {url!r} are opened by gopen() and "
                              f"WebDataset, which map them to {_ROUTED[scheme]}; no opener "
                              "takes them directly")
        if entry is None:
            known = {s or "(local path)" for s in _registry} | set(_ROUTED)
            raise UnsupportedSchemeError(url, scheme, known)
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
