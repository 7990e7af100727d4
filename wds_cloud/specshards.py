"""The shards of a spec's sources, found where they will be read from, with their sample counts
when the dataset says them: part of the composition root (it lists and reads through the
:class:`~wds_cloud.router.Router`).

- A brace list stays as it is; a glob is listed once (:func:`~wds_cloud.router.expand_glob`).
- A directory or prefix that holds ``.nv-meta/`` (an Energon-prepared dataset, local or in a
  bucket) gives the shards of the source's split from ``.nv-meta/split.yaml`` (or the source's
  ``split_config``; ``split.json`` too), less its ``exclude`` (whole shards; a
  ``shard/key`` entry drops one sample), and the samples per shard from ``.nv-meta/.info.json``
  (or the older ``.info.yaml``): exact epochs and ``spec check`` need no listing and no read
  of a shard. The keys of ``.nv-meta/dataset.yaml`` (Energon's sample loading) are noted as
  not used here.
- Any other directory or prefix gives every ``*.tar``/``*.tgz``/``*.tar.gz`` under it, sorted,
  from one listing. Mosaic's MDS data there (``index.json``, ``*.mds``) is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import braceexpand

from .errors import ConfigError, OpenError, ShardNotFoundError, SpecError
from .router import Router, expand_glob
from .spec import DatasetSpec, SourceSpec
from .stores.iostats import reading_metadata
from .urls import redact

__all__ = ["Listed", "list_source"]

log = logging.getLogger(__name__)

_SHARDS = (".tar", ".tgz", ".tar.gz")
_META = ".nv-meta"
_SPLIT_FILES = ("split.yaml", "split.json")


@dataclass(frozen=True)
class Listed:
    """A source's shards: ``urls``; ``counts[i]`` samples in ``urls[i]`` when the dataset says
    (``.nv-meta``), else None; ``excluded``: ``(url, key)`` of samples to leave out;
    ``prepared``: the ``.nv-meta`` directory read, if any; ``notes``: ``(key, why)`` of what was
    read there but is not used here."""

    urls: list[str]
    counts: list[int] | None = None
    excluded: frozenset[tuple[str, str]] = frozenset()
    prepared: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)


def list_source(spec: DatasetSpec, source: SourceSpec, router: Router) -> Listed:
    """The shards of ``source`` (see the module docstring); errors name the spec file, the
    source's key and what was looked for."""
    where = f"{spec.origin}: {source.key} ({source.name!r})"
    if router.cache() is not None:  # .nv-meta is read where it is, never from the shard cache
        router = Router(dataclasses.replace(router.settings, cache_dir=None),
                        router.storage_options, router.url_to_name)
    if not source.is_directory:
        try:
            return Listed(expand_glob(list(source.urls), router=router))
        except ShardNotFoundError as exc:
            raise ShardNotFoundError(f"{where}: {exc}", url=exc.url,
                                     resolved_url=exc.resolved_url) from exc
    top = source.urls[0].rstrip("/")
    info = _read(router, f"{top}/{_META}/.info.json", json.loads)
    if info is None:
        info = _read(router, f"{top}/{_META}/.info.yaml", _yaml)
    if info is not None:
        return _prepared(router, top, source, info, where)
    return _listed(router, top, where)


def _yaml(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def _read(router: Router, url: str, parse: Any) -> Any | None:
    """The parsed content of the small file ``url``, or None when there is none (counted in
    ``io_stats`` as requests, not as shards)."""
    try:
        with reading_metadata(), router.open(url) as stream:
            text = stream.read().decode("utf-8")
    except (ShardNotFoundError, FileNotFoundError, NotADirectoryError):
        return None  # (NotADirectoryError: ``top`` is a local file, not a directory)
    except OpenError as exc:
        if "is a directory" in str(exc):
            return None
        raise
    import yaml

    try:
        return parse(text)
    except (ValueError, yaml.YAMLError) as exc:  # JSONDecodeError is a ValueError
        raise SpecError(f"{redact(url)}: cannot read it: {exc}") from exc


def _prepared(router: Router, top: str, source: SourceSpec, info: Any,
              where: str) -> Listed:
    meta = f"{top}/{_META}"
    counts = info.get("shard_counts") if isinstance(info, Mapping) else None
    if not isinstance(counts, Mapping):
        raise SpecError(f"{where}: {redact(meta)}/.info.json has no 'shard_counts' (samples "
                        "per shard, as energon prepare writes it)")
    names = (source.split_config,) if source.split_config else _SPLIT_FILES
    splits = None
    for name in names:
        splits = _read(router, f"{meta}/{name}", _yaml)
        if splits is not None:
            break
    if not isinstance(splits, Mapping) or not isinstance(splits.get("split_parts"), Mapping):
        raise SpecError(f"{where}: {redact(meta)}/{' or '.join(names)} is missing or has no "
                        "'split_parts' (run energon prepare, or name the split file with "
                        "split_config)")
    part = source.split_part or "train"
    parts = splits["split_parts"]
    if part not in parts:
        raise SpecError(f"{where}: {redact(meta)}/{names[0]} has no split {part!r} (its splits:"
                        f" {', '.join(map(str, parts))}); pick one with split_part (or "
                        "split=)")
    exclude = {e for x in splits.get("exclude") or [] for e in braceexpand.braceexpand(str(x))}
    shards = [n for x in parts[part] or [] for n in braceexpand.braceexpand(str(x))
              if n not in exclude]
    missing = [n for n in shards if n not in counts]
    if missing:
        raise SpecError(f"{where}: {redact(meta)}/.info.json has no sample count for "
                        f"{missing[0]!r} (of split {part!r}); run energon prepare again")
    if not shards:
        raise SpecError(f"{where}: split {part!r} of {redact(meta)} has no shards left "
                        "(all excluded?)")
    known = set(shards)
    excluded = frozenset((f"{top}/{shard}", key) for shard, key in
                         (e.rsplit("/", 1) for e in exclude if "/" in e)
                         if shard in known)
    dataset = _read(router, f"{meta}/dataset.yaml", _yaml)
    keys = [str(k) for k in (dataset if isinstance(dataset, Mapping) else {})]
    notes = [(f"{redact(meta)}/dataset.yaml: {', '.join(keys)}", "configures Energon's sample "
              "loading; samples here are dicts of tar members (use .decode(), .to_tuple(), "
              ".map())")] if keys else []
    log.info("%s: %s: split %r, %d shards, %d samples", where, redact(meta), part, len(shards),
             sum(int(counts[n]) for n in shards))
    return Listed([f"{top}/{n}" for n in shards], [int(counts[n]) for n in shards], excluded,
                  meta, notes)


def _listed(router: Router, top: str, where: str) -> Listed:
    try:
        found = router.glob(f"{top}/**")
    except ShardNotFoundError:
        found = []
    except ConfigError as exc:
        raise SpecError(f"{where}: {redact(top)!r} names no shard files and cannot be listed "
                        f"as a directory: {exc}") from exc
    shards = sorted(u for u in found if u.endswith(_SHARDS) and f"/{_META}/" not in u)
    if shards:
        return Listed(shards)
    names = {u.rsplit("/", 1)[-1] for u in found}
    if "index.json" in names or any(n.endswith((".mds", ".mds.zstd", ".mds.gz")) for n in names):
        raise SpecError(f"{where}: {redact(top)!r} holds Mosaic MDS data (index.json, *.mds): "
                        "wds_cloud reads WebDataset tar shards (*.tar, *.tgz); convert the "
                        "dataset to tar shards, or point remote at a directory of them")
    what = f"{len(found)} other files" if found else "nothing"
    raise ShardNotFoundError(
        f"{where}: {redact(top)!r} has no {_META}/ (an Energon-prepared dataset) and no "
        f"*.tar/*.tgz under it ({what} found there)", url=redact(top))
