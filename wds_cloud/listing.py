"""Sizes of shards without reading them: which of a list of URLs exist, and how big they are.

:func:`shard_sizes` looks each URL up where the :class:`~wds_cloud.router.Router` would open it
(after the rewrite rules and AIStore proxying):

- local paths and ``file:`` URLs: ``os.stat``;
- stores whose opener has an fsspec ``filesystem`` (``s3://``, ``gs://``, ``az://``): one
  listing per directory holding more than :data:`FEW` of the URLs, else one metadata request
  (HEAD) per URL, with the settings' timeout (``WDS_TIMEOUT``), retried by the store's library
  or, where it does not retry them (S3), as reads are (``WDS_RETRIES``);
- openers with a ``sizes`` method (``http(s)://``, and so AIStore's REST API): the opener
  looks them up, a few at a time (for HTTP: a request for the first byte each, whose answer
  names the whole size), retried as reads are (``WDS_RETRIES``);
- anything else (``pipe:``, ``-``, third-party openers): not looked up; such URLs are reported
  with size ``None``, as if they existed.

This is what ``wds-cloud spec check`` uses to count and weigh a source's shards. It never opens
a shard and never touches the shard cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from .io import registry as openers
from .router import Router, scheme_options
from .settings import Settings
from .urls import file_url_path, redact, split_scheme

__all__ = ["FEW", "Listings", "shard_sizes"]

log = logging.getLogger(__name__)

#: up to this many URLs of one directory are looked up one by one rather than by a listing
FEW = 3


#: directory listings kept between calls: ``{(directory, options): {path: entry} or error}``
Listings = dict[tuple[str, str], "dict[str, dict[str, Any]] | Exception"]


def shard_sizes(urls: Sequence[str], *, router: Router,
                listings: Listings | None = None) -> dict[str, int | None]:
    """``{url: size in bytes}`` for each of ``urls`` that exists; ``None`` where the store
    cannot tell without reading it (see the module docstring). URLs that do not exist are left
    out. A store that cannot be reached or refuses the request raises
    :class:`~wds_cloud.errors.OpenError` (a listing of a missing bucket or directory is not an
    error: its URLs are missing); bad ``storage_options`` a :class:`~wds_cloud.errors.ConfigError`.

    ``listings``: a dict to keep directory listings (and their failures) in, so that several
    calls (e.g. the sources of one spec, often in one directory) list each directory once.
    """
    sizes: dict[str, int | None] = {}
    remote: dict[tuple[str, str], list[tuple[str, str]]] = {}
    asked: dict[str, list[tuple[str, str]]] = {}  # by scheme: URLs whose opener has sizes()
    for url in urls:
        resolved = router.resolve(url)
        scheme, rest = split_scheme(resolved)
        if scheme in ("", "file") and resolved != "-":
            size = _local_size(resolved, scheme, rest)
            if size is not None:
                sizes[url] = size
            continue
        opener = openers.get_opener(resolved)
        if not callable(getattr(opener, "filesystem", None)):
            if callable(getattr(opener, "sizes", None)):
                asked.setdefault(scheme, []).append((url, resolved))
            else:
                sizes[url] = None
            continue
        directory = resolved.rsplit("/", 1)[0]
        remote.setdefault((scheme, directory), []).append((url, resolved))
    for (scheme, directory), group in remote.items():
        sizes.update(_remote_sizes(router, scheme, directory, group,
                                   {} if listings is None else listings))
    for scheme, group in asked.items():
        sizer: Any = openers.get_opener(group[0][1])
        found = sizer.sizes(sorted({resolved for _, resolved in group}),
                            scheme_options(router.storage_options, scheme),
                            settings=router.settings)
        sizes.update((url, found[resolved]) for url, resolved in group if resolved in found)
    return {url: sizes[url] for url in urls if url in sizes}


def _local_size(resolved: str, scheme: str, rest: str) -> int | None:
    path = file_url_path(rest) if scheme else resolved
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size if os.path.isfile(path) else None


def _remote_sizes(router: Router, scheme: str, directory: str, group: list[tuple[str, str]],
                  listings: Listings) -> dict[str, int | None]:
    """Sizes of ``group`` (``(url, resolved)`` pairs, all in ``directory``)."""
    options = scheme_options(router.storage_options, scheme)
    opener: Any = openers.get_opener(directory)
    fs = opener.filesystem(directory, options, timeout=router.settings.timeout)
    out: dict[str, int | None] = {}
    known = listings.get((directory, repr(sorted(options.items()))))
    if known is None and len(group) <= FEW:
        for url, resolved in group:
            path = fs._strip_protocol(resolved)
            fs.invalidate_cache(path)
            try:
                info = opener.listed(resolved, "look up", fs.info, path,
                                     settings=router.settings)
            except FileNotFoundError:
                continue
            if info.get("type", "file") == "file":
                out[url] = _size(info)
        return out
    if known is None:
        known = listings[(directory, repr(sorted(options.items())))] = _listing(
            opener, fs, directory, router.settings)
    if isinstance(known, Exception):
        raise known
    for url, resolved in group:
        entry = known.get(fs._strip_protocol(resolved))
        if entry is not None:
            out[url] = _size(entry)
    return out


def _listing(opener: Any, fs: Any, directory: str,
             settings: Settings) -> dict[str, dict[str, Any]] | Exception:
    """``{path: entry}`` of the files in ``directory``, or the error to raise."""
    path = fs._strip_protocol(directory)
    fs.invalidate_cache(path)  # list afresh
    try:
        listed = opener.listed(directory, "list", fs.ls, path, True, settings=settings)
    except FileNotFoundError:
        log.debug("listing %s: no such directory or bucket", redact(directory))
        return {}
    except Exception as exc:  # our error for what the library raised
        return exc
    files = {entry["name"].rstrip("/"): entry for entry in listed
             if entry.get("type", "file") == "file"}
    log.debug("listing %s: %d objects", redact(directory), len(files))
    return files


def _size(info: dict[str, Any]) -> int | None:
    size = info.get("size", info.get("Size"))
    return int(size) if size is not None else None
