"""The router: a URL goes through rewrite -> AIStore -> (cache) -> opener, each step logged.

:func:`gopen` keeps webdataset's signature; :data:`gopen_schemes` is a live, dict-like view of
the opener registry, so ``gopen_schemes["foo"] = handler`` (webdataset's way to add a scheme)
keeps working with ``handler(url, mode, bufsize, **kw)`` functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from . import openers
from .errors import ConfigError, OpenError
from .settings import Settings
from .urls import ais_url, parse_rewrite_rules, redact, rewrite_url, split_scheme

__all__ = ["Router", "gopen", "gopen_schemes", "reader", "resolve_url"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Router:
    """Resolves and opens URLs according to one :class:`Settings`."""

    settings: Settings

    def resolve(self, url: str) -> str:
        """The URL actually opened for ``url``: after rewriting and AIStore proxying."""
        rules = parse_rewrite_rules(self.settings.rewrite, source=self.settings.rewrite_var)
        resolved = rewrite_url(url, rules)
        if resolved != url:
            log.debug("rewrite %s -> %s", redact(url), redact(resolved))
        scheme = split_scheme(resolved)[0]
        if scheme in self.settings.use_ais_for:
            if not self.settings.ais_endpoint:
                raise ConfigError(
                    f"USE_AIS_FOR includes {scheme!r} but AIS_ENDPOINT is not set; set it to "
                    f"the AIStore gateway, e.g. AIS_ENDPOINT=http://aistore:51080"
                )
            proxied = ais_url(resolved, self.settings.ais_endpoint)
            log.debug("aistore %s -> %s", redact(resolved), redact(proxied))
            resolved = proxied
        return resolved

    def open(self, url: str, mode: str = "rb", **options: Any) -> BinaryIO:
        """Open ``url`` for reading (``rb``) or writing (``wb``)."""
        if mode not in ("rb", "wb"):
            raise ConfigError(f"gopen mode must be 'rb' or 'wb', got {mode!r} for {redact(url)!r}")
        resolved = url if url == "-" else self.resolve(url)
        opener = openers.get_opener(resolved)
        log.debug("open %s (%s) with %r", redact(resolved), mode, opener)
        try:
            return opener.open(resolved, mode, **options)
        except OpenError as exc:
            if resolved != url and exc.url == resolved:
                exc.url, exc.resolved_url = redact(url), redact(resolved)
            raise


def resolve_url(url: str, *, settings: Settings | None = None) -> str:
    """What ``gopen(url)`` would open, after rewriting and proxying."""
    return Router(settings or Settings.from_env()).resolve(url)


def gopen(
    url: str, mode: str = "rb", bufsize: int = 8192, *, settings: Settings | None = None,
    **options: Any,
) -> BinaryIO:
    """Open ``url`` (local path, ``file:``, ``pipe:``, ``-`` or any registered scheme).

    ``settings`` defaults to ``Settings.from_env()``; other keyword options go to the opener.
    """
    router = Router(settings or Settings.from_env())
    return router.open(url, mode, bufsize=bufsize, **options)


def reader(url: str, **options: Any) -> BinaryIO:
    """``gopen(url, "rb", ...)``, as in webdataset."""
    return gopen(url, "rb", **options)


class _SchemeTable(MutableMapping[str, Any]):
    """webdataset's ``gopen_schemes`` dict, backed by the opener registry."""

    def __getitem__(self, scheme: str) -> Any:
        if scheme not in openers.registered_schemes():
            raise KeyError(scheme)
        return openers.get_opener(f"{scheme}:" if scheme not in ("", "-") else scheme or "x")

    def __setitem__(self, scheme: str, handler: Callable[..., BinaryIO] | openers.Opener) -> None:
        opener = handler if hasattr(handler, "open") else openers.function_opener(handler)
        openers.register_opener(scheme, opener, replace=True)

    def __delitem__(self, scheme: str) -> None:
        if scheme not in openers.registered_schemes():
            raise KeyError(scheme)
        openers.unregister_opener(scheme)

    def __iter__(self) -> Iterator[str]:
        return iter(openers.registered_schemes())

    def __len__(self) -> int:
        return len(openers.registered_schemes())


gopen_schemes: MutableMapping[str, Any] = _SchemeTable()
