"""Pure string functions on shard URLs: expansion, schemes, rewriting, AIStore mapping, redaction.

Nothing here does I/O or reads the environment; values from the environment arrive as arguments
(see :mod:`wds_cloud.settings`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import braceexpand

from .errors import ConfigError

__all__ = [
    "AIS_PROVIDERS",
    "RewriteRule",
    "ais_url",
    "apply_rewrite_rules",
    "expand_urls",
    "file_url_path",
    "merge_scheme_options",
    "parse_rewrite_rules",
    "redact",
    "redact_text",
    "split_scheme",
    "substitute_vars",
]

_VAR_RE = re.compile(r"\$\{(\w+)\}")


def merge_scheme_options(*layers: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-scheme storage options (``{"s3": {...}, "gs": {...}}``) merged layer by layer, a
    later layer winning per scheme and key."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for scheme, options in layer.items():
            if not isinstance(options, Mapping):
                raise TypeError(f"storage_options[{scheme!r}] must be a mapping, got "
                                f"{type(options).__name__}")
            out.setdefault(scheme, {}).update(options)
    return out
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")

#: URL scheme -> AIStore ``provider=`` value
AIS_PROVIDERS: dict[str, str] = {
    "gs": "gcp", "gcs": "gcp", "gcp": "gcp",
    "s3": "aws", "aws": "aws",
    "az": "azure", "azure": "azure", "abfs": "azure", "abfss": "azure",
    "oci": "oci",
    "ais": "ais",
}


def split_scheme(url: str) -> tuple[str, str]:
    """Split ``url`` into ``(scheme, rest)``; local paths and ``C:\\`` drives have scheme ``""``."""
    m = _SCHEME_RE.match(url)
    if m is None:
        return "", url
    return m.group(1).lower(), url[m.end():]


def file_url_path(rest: str) -> str:
    """The local path named by a ``file:`` URL, given what follows ``file:`` (``///a/b`` or
    ``/a/b``), as :func:`urllib.request.url2pathname` reads it."""
    # imported here: urllib.request brings http.client, ssl and email (~20 ms) along
    from urllib.request import url2pathname

    return url2pathname(rest[2:] if rest.startswith("//") else rest)


def substitute_vars(url: str, url_vars: Mapping[str, str]) -> str:
    """Replace ``${NAME}`` by ``url_vars[NAME]`` (the value of ``WDS_NAME``)."""

    def lookup(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in url_vars:
            raise ConfigError(
                f"shard URL {url!r} uses ${{{name}}}, but the environment variable "
                f"WDS_{name} is not set"
            )
        return url_vars[name]

    return _VAR_RE.sub(lookup, url)


def expand_urls(
    spec: str | Iterable[str], *, url_vars: Mapping[str, str] | None = None
) -> list[str]:
    """Expand a shard spec into a list of URLs.

    ``spec`` is a string or an iterable of strings. Each string may join several lists with
    ``::``, use ``${NAME}`` for the environment variable ``WDS_NAME`` and brace patterns such as
    ``shard-{000000..000099}.tar``. The variables are ``url_vars`` (``NAME`` -> value); without
    it, as webdataset's ``expand_urls(url)``, the environment's ``WDS_*`` variables, read
    (through :class:`~wds_cloud.settings.Settings`) only when a ``${NAME}`` needs one.
    """
    parts = spec.split("::") if isinstance(spec, str) else list(spec)
    result: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ConfigError(f"shard URLs must be strings, got {part!r} in {spec!r}")
        if "${" in part:
            if url_vars is None:  # called as webdataset's expand_urls(url): a composition root
                from .settings import Settings

                url_vars = Settings.from_env().url_vars
            part = substitute_vars(part, url_vars)
        if "{" in part:
            try:
                result.extend(braceexpand.braceexpand(part))
            except Exception as exc:  # braceexpand raises its own UnbalancedBracesError
                raise ConfigError(f"cannot expand braces in shard URL {part!r}: {exc}") from exc
        elif part:
            result.append(part)
    return result


@dataclass(frozen=True)
class RewriteRule:
    """One ``regex=replacement`` rule, anchored at the start of the URL."""

    pattern: re.Pattern[str]
    replacement: str

    def apply(self, url: str) -> str | None:
        """The rewritten URL, or ``None`` if the rule does not match."""
        m = self.pattern.match(url)
        if m is None:
            return None
        return m.expand(self.replacement) + url[m.end():]


def parse_rewrite_rules(
    text: str | None, *, source: str = "WDS_REWRITE"
) -> tuple[RewriteRule, ...]:
    """Parse ``regex=replacement;regex=replacement``; ``source`` names the setting in errors."""
    if not text:
        return ()
    rules = []
    for raw in text.split(";"):
        if not raw.strip():
            continue
        if "=" not in raw:
            raise ConfigError(
                f"{source}: rule {raw!r} has no '='; write rules as "
                f"'regex=replacement;regex=replacement', e.g. 'gs://=/shared/data/'"
            )
        pattern, replacement = raw.split("=", 1)
        try:
            compiled = re.compile(pattern)
            compiled.sub(replacement, "")  # checks the replacement's group references
        except re.error as exc:
            raise ConfigError(f"{source}: bad rule {raw!r}: {exc}") from exc
        rules.append(RewriteRule(compiled, replacement))
    return tuple(rules)


def apply_rewrite_rules(url: str, rules: Iterable[RewriteRule]) -> str:
    """Apply the first matching rule to ``url``; unchanged if none matches.

    The pure step; webdataset's one-argument ``rewrite_url(url)``, which takes the rules from
    the environment, is :func:`wds_cloud.router.rewrite_url` (``wds.rewrite_url``).
    """
    for rule in rules:
        new = rule.apply(url)
        if new is not None:
            return new
    return url


def ais_url(url: str, endpoint: str) -> str:
    """Map ``gs://b/key`` to ``{endpoint}/v1/objects/b/key?provider=gcp`` (also s3, az, ais)."""
    scheme, rest = split_scheme(url)
    provider = AIS_PROVIDERS.get(scheme)
    if provider is None:
        raise ConfigError(
            f"cannot fetch {redact(url)!r} through AIStore: scheme {scheme!r} is not one of "
            f"{', '.join(sorted(AIS_PROVIDERS))}"
        )
    bucket, _, key = rest.lstrip("/").partition("/")
    if not bucket or not key:
        raise ConfigError(f"cannot fetch {redact(url)!r} through AIStore: no bucket/object in it")
    return f"{endpoint.rstrip('/')}/v1/objects/{bucket}/{quote(key)}?provider={provider}"


#: query parameters that never carry a secret (AIStore's provider, GCS's generation, ...)
_PLAIN_QUERY_KEYS = frozenset({"provider", "generation", "versionid", "alt"})


def redact(url: str) -> str:
    """``url`` with credentials and query values hidden, safe for messages and logs."""
    scheme, _ = split_scheme(url)
    if scheme in ("", "pipe", "file"):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{scheme}://<unparsable>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{item.split('=', 1)[0]}=***"
        if "=" in item and item.split("=", 1)[0].lower() not in _PLAIN_QUERY_KEYS else item
        for item in parts.query.split("&") if item
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


#: a URL inside free text (a message, a shell command): up to a space, quote or bracket
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"()<>]+")


def redact_text(text: str) -> str:
    """``text`` (a message, a ``pipe:`` command) with each URL in it :func:`redact`-ed."""
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)
