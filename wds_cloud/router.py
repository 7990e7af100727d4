"""The router: a URL goes through rewrite -> AIStore -> cache -> opener, each step logged.

The cache (:mod:`wds_cloud.cache`) is used for reads when the settings name a directory
(``WDS_CACHE``, or ``cache_dir=``); it is keyed by the URL actually opened.

``storage_options`` are given per scheme, ``{"s3": {...}, "gs": {...}}``, so one dataset can
mix stores; for a single URL a flat dict of the URL's scheme's options works too (as with
``fsspec.open``). Options are handed to the opener of the URL actually opened (after rewriting
and proxying), looked up by its scheme or an alias of it (``gs``/``gcs``, ``az``/``abfs``/
``abfss``, ``http``/``https``).

:func:`gopen` keeps webdataset's signature, and its ``GOPEN_VERBOSE`` lines (:data:`info` is
webdataset's ``gopen.info``; see :mod:`wds_cloud.io.verbose`); :data:`gopen_schemes` is a live,
dict-like view of the opener registry, so ``gopen_schemes["foo"] = handler`` (webdataset's way
to add a scheme) keeps working with ``handler(url, mode, bufsize, **kw)`` functions.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from . import utils
from .errors import ConfigError, OpenError, ShardNotFoundError, UnsafeURLError
from .io import registry as openers
from .io import verbose
from .io.forks import once
from .io.pace import Pace
from .settings import Settings, expand_path, parse_size
from .urls import (
    AIS_PROVIDERS,
    RewriteRule,
    ais_url,
    apply_rewrite_rules,
    parse_rewrite_rules,
    redact,
    split_scheme,
)

if TYPE_CHECKING:
    from .cache import ShardCache

__all__ = ["Router", "expand_glob", "gopen", "gopen_schemes", "info", "reader", "resolve_url",
           "rewrite_url", "scheme_options", "with_cache"]

log = logging.getLogger(__name__)

StorageOptions = Mapping[str, Any]

#: webdataset's ``gopen.info``: shown at the end of each ``GOPEN_VERBOSE`` line
info = verbose.info

_ALIASES = ({"gs", "gcs"}, {"az", "abfs", "abfss"}, {"http", "https"}, {"", "file"})
_GLOB_CHARS = frozenset("*?[")


def _same_scheme(scheme: str) -> set[str]:
    return next((group for group in _ALIASES if scheme in group), {scheme})


def scheme_options(storage_options: StorageOptions | None, scheme: str) -> dict[str, Any]:
    """The options for ``scheme`` from per-scheme ``storage_options`` (or a flat dict of one
    scheme's options, recognised by having no key that is a registered scheme)."""
    if not storage_options:
        return {}
    schemes = set(openers.registered_schemes())
    if not any(key in schemes for key in storage_options):
        return dict(storage_options)
    unknown = [key for key in storage_options if key not in schemes]
    if unknown:
        raise ConfigError(
            f"storage_options: {unknown} are not schemes with an opener; give options per "
            f"scheme, e.g. storage_options={{'s3': {{'endpoint_url': ...}}}}")
    for name in sorted(_same_scheme(scheme)):
        if name in storage_options:
            return dict(storage_options[name])
    return {}


@dataclass(frozen=True)
class Router:
    """Resolves and opens URLs according to one :class:`Settings`.

    Built once per dataset and process (see :class:`wds_cloud.reading.ShardOpener`): the
    rewrite rules are parsed and the shard cache is made on first use, then kept.
    """

    settings: Settings
    storage_options: StorageOptions = field(default_factory=dict)
    url_to_name: Callable[[str], str] | None = None

    @once
    def rules(self) -> tuple[RewriteRule, ...]:
        """The parsed ``WDS_REWRITE`` rules."""
        return parse_rewrite_rules(self.settings.rewrite, source=self.settings.rewrite_var)

    @once
    def _cache(self) -> ShardCache | None:
        if not self.settings.cache_dir:
            return None
        from .cache import ShardCache

        return ShardCache.from_settings(self.settings, url_to_name=self.url_to_name)

    @once
    def _paces(self) -> list[Pace]:
        return []  # the pace handed out last

    def pace(self) -> Pace:
        """A judge of whether pre-reading pays (:mod:`wds_cloud.io.pace`) for a new
        read-ahead, an epoch's, starting at the verdict of the last one handed out: links
        keep their pace from one epoch to the next, and an epoch of few shards over a link
        slow per connection would otherwise spend its first shards finding it again."""
        last = self._paces
        pace = Pace(pays=bool(last) and last[0].verdict)
        last[:] = [pace]
        return pace

    def resolve(self, url: str) -> str:
        """The URL actually opened for ``url``: after rewriting and AIStore proxying.

        Rewriting is refused (:class:`UnsafeURLError`, a ``ValueError``) when
        ``wds_cloud.utils.enforce_security`` is True and a rule would rewrite ``url``."""
        resolved = _rewrite(url, self.rules, self.settings.rewrite_var)
        if resolved != url:
            log.debug("rewrite %s -> %s", redact(url), redact(resolved))
        scheme = split_scheme(resolved)[0]
        if scheme == "ais" or scheme in self.settings.use_ais_for:
            if not self.settings.ais_endpoint:
                why = ("ais:// URLs need" if scheme == "ais"
                       else f"USE_AIS_FOR includes {scheme!r}: it needs")
                raise ConfigError(
                    f"{why} AIS_ENDPOINT, which is not set; set it to the AIStore gateway, "
                    f"e.g. AIS_ENDPOINT=http://aistore:51080 (reading {redact(url)!r})"
                )
            proxied = ais_url(resolved, self.settings.ais_endpoint)
            log.debug("aistore %s -> %s", redact(resolved), redact(proxied))
            resolved = proxied
        return resolved

    def open(self, url: str, mode: str = "rb", **options: Any) -> BinaryIO:
        """Open ``url`` for reading (``rb``, through the cache if there is one) or writing.

        Secure mode (see :mod:`wds_cloud.utils`) refuses, with :class:`UnsafeURLError` (a
        ``ValueError``): ``pipe:`` URLs when ``WDS_SECURE`` (``settings.secure``) or the module
        flag ``enforce_security`` says so; local paths and ``file:`` URLs only when the flag
        is True. The URL checked is the one opened, after rewriting. With
        ``settings.gopen_verbose`` it is said on stderr (:mod:`wds_cloud.io.verbose`)."""
        if self.settings.gopen_verbose:  # GOPEN_VERBOSE: webdataset's lines on stderr
            return verbose.watched(
                url, lambda: self._route(url, mode, options), bufsize=options.get("bufsize", 8192),
                rewrite=lambda: url if url == "-" else _rewrite(url, self.rules,
                                                                self.settings.rewrite_var))
        return self._route(url, mode, options)

    def _route(self, url: str, mode: str, options: dict[str, Any]) -> BinaryIO:
        if mode not in ("rb", "wb"):
            raise ConfigError(f"gopen mode must be 'rb' or 'wb', got {mode!r} for {redact(url)!r}")
        offset = int(options.pop("offset", 0) or 0)
        if offset and mode != "rb":
            raise ConfigError(f"gopen: offset={offset} is for reading ({redact(url)!r})")
        resolved = url if url == "-" else self.resolve(url)
        _refuse_unsafe(url, resolved, self.settings.secure)
        cache = None if mode != "rb" else self.cache()
        if cache is not None and cache.wants(resolved):
            log.debug("cache %s in %s", redact(resolved), cache.root)
            asked: list[bool] = []

            def fetch() -> BinaryIO:
                asked.append(True)
                return self._open(url, resolved, mode, options)

            stream = cache.open(resolved, fetch)
            if not asked:  # served from the cache (or along another process's download)
                from .stores.iostats import count_io, current_source

                count_io(current_source(), cache_hits=1)
            return _skip(stream, offset) if offset else stream
        if offset and getattr(openers.get_opener(resolved), "ranged", False):
            options["offset"] = offset  # the opener starts there (a ranged GET, a seek)
            return self._open(url, resolved, mode, options)
        stream = self._open(url, resolved, mode, options)
        return _skip(stream, offset) if offset else stream

    def cache(self) -> ShardCache | None:
        """The shard cache the settings ask for, if any (made once)."""
        return self._cache

    def costs_round_trip(self, url: str) -> bool:
        """Whether the first byte of ``url`` is a round trip away (a store, a ``pipe:``
        command, a cache entry not on disk yet), so that opening it ahead pays. False for a
        local file, standard input or a published cache entry: the page cache serves those,
        and reading them ahead would only hold memory. True when in doubt (a URL that cannot
        be resolved: opening it reports why)."""
        if url == "-":
            return False
        try:
            resolved = self.resolve(url)
        except ValueError:
            return True
        if split_scheme(resolved)[0] in ("", "file"):
            return False
        cache = self.cache()
        return cache is None or not cache.wants(resolved) or not cache.on_disk(resolved)

    def _open(self, url: str, resolved: str, mode: str, options: dict[str, Any]) -> BinaryIO:
        opener = openers.get_opener(resolved)
        log.debug("open %s (%s) with %r", redact(resolved), mode, opener)
        scheme = "-" if resolved == "-" else split_scheme(resolved)[0]
        options = dict(options)
        extra = scheme_options(self.storage_options, scheme)
        if extra:
            options["storage_options"] = extra
        if getattr(opener, "takes_settings", False):
            options["settings"] = self.settings
        try:
            return opener.open(resolved, mode, **options)
        except OpenError as exc:
            if resolved != url and exc.url == resolved:
                exc.url, exc.resolved_url = redact(url), redact(resolved)
            raise

    def glob(self, pattern: str) -> list[str]:
        """The URLs matching ``pattern`` (``*``, ``?``, ``[...]``), sorted, as the user wrote
        them (so each then takes the route any URL takes: rewrite, AIStore, cache, opener).

        They are listed once, where the shards will be read from: after the rewrite rules, and
        through AIStore's bucket listing when the URL is proxied (``ais://``, ``USE_AIS_FOR``).
        A rewritten pattern is mapped back by putting the original prefix in place of the
        rewritten one, so the rule must substitute a prefix free of wildcards (a
        :class:`ConfigError` says so otherwise). No match is a :class:`ShardNotFoundError`.
        """
        target, original = self._rewritten_pattern(pattern)
        try:
            listed = self._list(target)
        except OpenError as exc:
            if target != pattern and exc.url == redact(target):  # resolved_url is kept
                exc.url = redact(pattern)
            raise
        found = sorted(original(url) for url in listed)
        where = "" if target == pattern else f" (listed as {redact(target)!r})"
        log.debug("glob %s%s: %d matches", redact(pattern), where, len(found))
        if not found:
            raise ShardNotFoundError(f"no shard matches {redact(pattern)!r}{where}",
                                     url=redact(pattern), resolved_url=redact(target))
        return found

    def _list(self, target: str) -> list[str]:
        """The URLs matching ``target`` (a pattern after rewriting), in its own form."""
        endpoint = self._ais_lister(target)
        if endpoint is not None:
            from .stores.ais import glob as ais_glob

            return ais_glob(target, endpoint=endpoint, settings=self.settings,
                            storage_options=scheme_options(self.storage_options,
                                                           split_scheme(endpoint)[0]))
        opener = openers.get_opener(target)
        lister = getattr(opener, "glob", None)
        if lister is None:
            raise ConfigError(f"cannot list {redact(target)!r}: the opener of its scheme "
                              f"({opener!r}) has no glob(); list the shards explicitly")
        listing: dict[str, Any] = {
            "storage_options": scheme_options(self.storage_options, split_scheme(target)[0])}
        if getattr(opener, "takes_settings", False):
            listing["settings"] = self.settings  # WDS_TIMEOUT and retries for the listing
        return list(lister(target, **listing))

    def _ais_lister(self, target: str) -> str | None:
        """The AIStore endpoint that lists ``target`` (a pattern after rewriting), or None
        when it is not read through AIStore."""
        scheme = split_scheme(target)[0]
        if scheme != "ais" and (scheme not in self.settings.use_ais_for
                                or scheme not in AIS_PROVIDERS):
            return None
        if not self.settings.ais_endpoint:
            why = ("ais:// URLs need" if scheme == "ais"
                   else f"USE_AIS_FOR includes {scheme!r}: it needs")
            raise ConfigError(f"{why} AIS_ENDPOINT, which is not set; set it to the AIStore "
                              f"gateway, e.g. AIS_ENDPOINT=http://aistore:51080 (listing "
                              f"{redact(target)!r})")
        return self.settings.ais_endpoint

    def _rewritten_pattern(self, pattern: str) -> tuple[str, Callable[[str], str]]:
        """``pattern`` rewritten by the rules (refused as :meth:`resolve` refuses), and the
        function that maps a URL listed there back to the form the user wrote (raising
        :class:`ConfigError` when the rule is not a prefix substitution)."""
        target = _rewrite(pattern, self.rules, self.settings.rewrite_var)
        rule, match = _first_match(self.rules, pattern)
        if target == pattern or rule is None or match is None:
            return pattern, str
        head, new_head = pattern[:match.end()], match.expand(rule.replacement)
        if _GLOB_CHARS & set(head):
            raise self._not_a_prefix(pattern, target, rule)

        def original(url: str) -> str:
            back = head + url[len(new_head):]
            if not url.startswith(new_head) or apply_rewrite_rules(back, self.rules) != url:
                raise self._not_a_prefix(pattern, target, rule, listed=url)
            return back

        return target, original

    def _not_a_prefix(self, pattern: str, target: str, rule: RewriteRule,
                      listed: str | None = None) -> ConfigError:
        seen = f"; {redact(listed)!r} was listed there" if listed is not None else ""
        return ConfigError(
            f"cannot list {redact(pattern)!r}: the {self.settings.rewrite_var} rule "
            f"{rule.pattern.pattern!r} rewrites it to {redact(target)!r}{seen}, and the "
            f"matches cannot be mapped back to URLs as written, since the rule does not "
            f"substitute a prefix free of wildcards; write it as a prefix substitution "
            f"(e.g. 'gs://bucket/=/data/bucket/') or list the shards explicitly")


def _first_match(rules: tuple[RewriteRule, ...], url: str
                 ) -> tuple[RewriteRule | None, re.Match[str] | None]:
    """The first rewrite rule matching ``url`` and its match (the one the router applies)."""
    for rule in rules:
        match = rule.pattern.match(url)
        if match is not None:
            return rule, match
    return None, None


def expand_glob(
    urls: list[str], *, settings: Settings | None = None,
    storage_options: StorageOptions | None = None, router: Router | None = None,
) -> list[str]:
    """``urls`` with each pattern containing ``*``, ``?`` or ``[`` replaced by its matches.

    Only URLs whose opener can list are patterns: an ``https://...?signature=...`` URL, a
    ``pipe:`` command or an existing local file with such characters in its name is taken as
    it is."""
    if not any(_GLOB_CHARS & set(url) for url in urls):
        return list(urls)
    if router is None:
        router = Router(settings or Settings.from_env(), storage_options or {})
    return [found for url in urls
            for found in (router.glob(url) if _is_pattern(url, router) else [url])]


def _is_pattern(url: str, router: Router) -> bool:
    """Whether ``url`` is a pattern to list: it has wildcards, and where it is read from (after
    rewriting) can be listed and is not an existing local file."""
    if not _GLOB_CHARS & set(url) or url == "-":
        return False
    target = apply_rewrite_rules(url, router.rules)
    if not split_scheme(target)[0] and os.path.exists(target):
        return False
    if router._ais_lister(target) is not None:
        return True
    return callable(getattr(openers.get_opener(target), "glob", None))


def resolve_url(url: str, *, settings: Settings | None = None) -> str:
    """What ``gopen(url)`` would open, after rewriting and proxying (refused as
    :meth:`Router.resolve` refuses)."""
    return Router(settings or Settings.from_env()).resolve(url)


def rewrite_url(url: str, rules: Iterable[RewriteRule] | None = None, *,
                settings: Settings | None = None) -> str:
    """``url`` after the first matching rewrite rule: webdataset's ``gopen.rewrite_url(url)``.

    With one argument the rules are the environment's (``WDS_REWRITE``, or webdataset's
    ``GOPEN_REWRITE``), read now; ``settings=`` gives them instead, and ``rules`` (parsed by
    :func:`~wds_cloud.urls.parse_rewrite_rules`) explicitly. No AIStore proxying: see
    :func:`resolve_url` for the URL ``gopen`` opens. When ``wds_cloud.utils.enforce_security``
    is True, a rule that would rewrite ``url`` raises :class:`UnsafeURLError` (a
    ``ValueError``), as webdataset refuses rewriting then.
    """
    if rules is not None:
        return _rewrite(url, tuple(rules), "rewrite_url(rules=...)")
    router = Router(settings or Settings.from_env())
    return _rewrite(url, router.rules, router.settings.rewrite_var)


def _rewrite(url: str, rules: tuple[RewriteRule, ...], source: str) -> str:
    resolved = apply_rewrite_rules(url, rules)
    if resolved != url and utils.refuses_sources():
        raise UnsafeURLError(
            f"refusing to rewrite {redact(url)!r} to {redact(resolved)!r} with the {source} "
            f"rules: {utils.why_refused()} (webdataset: rewrite_url: unsafe_gopen is False, "
            "cannot rewrite URLs using environment variables)")
    return resolved


def _refuse_unsafe(url: str, resolved: str, secure: bool) -> None:
    """Raise :class:`UnsafeURLError` if secure mode refuses to open ``resolved``."""
    if resolved == "-":
        return
    scheme = split_scheme(resolved)[0]
    # webdataset's words for each refusal, kept in ours for code that matches on them
    if scheme == "pipe" and utils.refuses_code(secure):
        what = "a pipe: URL, which runs a shell command"
        theirs = "gopen_pipe: unsafe_gopen is False, cannot open pipe URLs"
    elif scheme in ("", "file") and utils.refuses_sources():
        what = "a local path" if not scheme else "a file: URL"
        theirs = "gopen: unsafe_gopen is False, cannot open local files"
    else:
        return
    shown = repr(redact(resolved))
    if resolved != url:
        shown += f" (rewritten from {redact(url)!r})"
    raise UnsafeURLError(f"refusing to open {shown}, {what}: "
                         f"{utils.why_refused(source='WDS_SECURE=1', undo='unset WDS_SECURE')}"
                         f" (webdataset: {theirs})")


def gopen(
    url: str, mode: str = "rb", bufsize: int = 8192, *, settings: Settings | None = None,
    storage_options: StorageOptions | None = None, cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str | None = None, url_to_name: Callable[[str], str] | None = None,
    **options: Any,
) -> BinaryIO:
    """Open ``url`` (local path, ``file:``, ``pipe:``, ``-`` or any registered scheme).

    ``settings`` defaults to ``Settings.from_env()``; ``storage_options`` (per scheme, or flat
    for this URL's scheme) go to the fsspec filesystem; ``cache_dir``/``cache_size`` (bytes, or
    ``"50GB"``) read through a shard cache, overriding ``WDS_CACHE``/``WDS_CACHE_SIZE``;
    ``url_to_name`` gives the readable part of cache file names. Other keyword options go to
    the opener.
    """
    settings = with_cache(settings or Settings.from_env(), cache_dir, cache_size)
    router = Router(settings, storage_options or {}, url_to_name)
    return router.open(url, mode, bufsize=bufsize, **options)


def with_cache(settings: Settings, cache_dir: str | os.PathLike[str] | None,
               cache_size: int | str | None) -> Settings:
    """``settings`` with explicit cache arguments in place of the environment's values."""
    changes: dict[str, Any] = {}
    if cache_dir is not None:
        changes["cache_dir"] = expand_path(cache_dir)
    if cache_size is not None:
        changes["cache_size"] = parse_size(cache_size, name="cache_size")
    return replace(settings, **changes) if changes else settings


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


def _skip(stream: BinaryIO, offset: int) -> BinaryIO:
    """``stream`` moved ``offset`` bytes on: a seek when it can, else reading them (a pipe,
    stdin, a shard the cache is still filling)."""
    try:
        if stream.seekable():
            stream.seek(offset)
            return stream
    except (OSError, ValueError):
        pass
    left = offset
    while left:
        data = stream.read(min(left, 1 << 20))
        if not data:
            break
        left -= len(data)
    return stream
