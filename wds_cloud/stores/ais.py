"""Listing a bucket through AIStore: the shards a glob matches, seen where AIStore reads them.

:func:`glob` expands ``gs://bucket/train-*.tar`` (or ``ais://``, ``s3://``, ``az://``, ...)
with AIStore's bucket listing, the API its Python SDK uses::

    GET {AIS_ENDPOINT}/v1/buckets/<bucket>?provider=<gcp|aws|azure|oci|ais>
    {"action": "list", "value": {"prefix": "...", "props": "name,size",
                                 "continuation_token": ""}}

answered with ``{"entries": [{"name": ..., "size": ...}, ...], "continuation_token": "..."}``;
pages are asked for until the token comes back empty. The prefix is the key up to the first
wildcard; the names are then matched with fsspec's glob rules (``*`` and ``?`` stop at ``/``,
``**`` does not), as the other stores' listings are.

Requests go through fsspec's HTTP filesystem (aiohttp), with the ``http`` storage options (for
``headers``, ``client_kwargs``), and are retried by :class:`~wds_cloud.stores.retry.Retrier`:
408, 429 and 5xx answers and dropped connections are tried again; 403 is
:class:`~wds_cloud.errors.AccessDeniedError`, 404 (no such bucket) an
:class:`~wds_cloud.errors.OpenError`, both naming the pattern and the listing URL.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import quote

from ..errors import ConfigError, OpenError
from ..settings import Settings
from ..urls import AIS_PROVIDERS, redact, split_scheme
from .aio import run
from .retry import (
    Retrier,
    RetryableError,
    RetryPolicy,
    reason,
    status_error,
    transient_errors,
)

__all__ = ["glob", "list_url"]

log = logging.getLogger(__name__)

_WILDCARD = re.compile(r"[*?\[]")
_MAX_PAGES = 1_000_000  # a server whose token never runs out must not hold us forever


def list_url(bucket: str, provider: str, endpoint: str) -> str:
    """The URL of AIStore's listing of ``bucket`` of ``provider`` behind ``endpoint``."""
    return f"{endpoint.rstrip('/')}/v1/buckets/{quote(bucket, safe='')}?provider={provider}"


def glob(pattern: str, *, endpoint: str, settings: Settings | None = None,
         storage_options: dict[str, Any] | None = None) -> list[str]:
    """The URLs (in ``pattern``'s own scheme, ``{scheme}://{bucket}/{name}``) of the objects
    of ``pattern``'s bucket that match it, listed by the AIStore gateway at ``endpoint``;
    sorted. Raises :class:`~wds_cloud.errors.ConfigError` for a scheme AIStore does not proxy
    or a pattern without a bucket."""
    scheme, rest = split_scheme(pattern)
    provider = AIS_PROVIDERS.get(scheme)
    bucket, _, key = rest.lstrip("/").partition("/")
    if provider is None or not bucket or _WILDCARD.search(bucket):
        raise ConfigError(
            f"cannot list {redact(pattern)!r} through AIStore: it needs a bucket, without "
            f"wildcards, of one of the schemes {', '.join(sorted(AIS_PROVIDERS))}")
    from fsspec.utils import glob_translate

    wanted = re.compile(glob_translate(f"{bucket}/{key}"))
    prefix = _WILDCARD.split(key, 1)[0]
    url = list_url(bucket, provider, endpoint)
    names = _list(pattern, url, prefix, RetryPolicy.from_settings(settings or Settings()),
                  dict(storage_options or {}))
    found = sorted(f"{scheme}://{bucket}/{name}" for name in names
                   if wanted.match(f"{bucket}/{name}"))
    log.debug("aistore listed %s: %d names under %r, %d match", redact(url), len(names), prefix,
              len(found))
    return found


def _list(pattern: str, url: str, prefix: str, policy: RetryPolicy,
          storage_options: dict[str, Any]) -> list[str]:
    """Every object name under ``prefix`` in the listing at ``url``, page after page."""
    from .http import _filesystem

    fs = _filesystem(storage_options)
    doing = f"listing {redact(pattern)} through"
    names: list[str] = []
    token = ""
    for _ in range(_MAX_PAGES):
        body = {"action": "list", "value": {"prefix": prefix, "props": "name,size",
                                            "continuation_token": token}}
        retrier = Retrier(policy, url=pattern, resolved_url=url, doing="list")
        try:
            page = run(fs.loop, retrier.call_async, "bucket listing", _page, fs, url, body,
                       doing, policy)
        except OpenError as exc:  # made where only the listing URL was known
            exc.url, exc.resolved_url = redact(pattern), redact(url)
            raise
        names.extend(_names(page, url, pattern))
        token = page.get("continuation_token") or ""
        if not token:
            return names
    raise OpenError(f"{doing} {redact(url)}: more than {_MAX_PAGES} pages, the continuation "
                    f"token never ran out", url=redact(pattern), resolved_url=redact(url))


def _names(page: Any, url: str, pattern: str) -> list[str]:
    entries = page.get("entries") if isinstance(page, dict) else None
    if entries is None and isinstance(page, dict) and "entries" in page:
        entries = []  # AIStore sends null for an empty page
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
        raise OpenError(f"listing {redact(pattern)} through {redact(url)}: the answer is not "
                        f"an AIStore listing ({str(page)[:200]!r}); is AIS_ENDPOINT an AIStore "
                        "gateway?", url=redact(pattern), resolved_url=redact(url))
    return [e["name"] for e in entries if not e["name"].endswith("/")]


async def _page(fs: Any, url: str, body: dict[str, Any], doing: str,
                policy: RetryPolicy) -> Any:
    """One page of the listing (the decoded JSON answer)."""
    import aiohttp

    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = {**(kw.pop("headers", None) or {}), "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                    sock_read=policy.timeout)
    try:
        async with session.request("GET", url, data=json.dumps(body), headers=headers,
                                   timeout=timeout, **kw) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise status_error(resp.status, url, doing, detail=_message(text))
    except transient_errors("http") as exc:
        raise RetryableError(f"connection failed {doing} {redact(url)}: {reason(exc)}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise OpenError(f"{doing} {redact(url)}: the answer is not JSON ({text[:200]!r})",
                        resolved_url=redact(url)) from exc


def _message(text: str) -> str:
    """AIStore's error ``message`` from a JSON error body, or the start of the body."""
    try:
        said = json.loads(text)
    except ValueError:
        return text[:200]
    return str(said.get("message", ""))[:200] if isinstance(said, dict) else text[:200]
