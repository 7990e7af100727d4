"""The strict reading of a spec into :class:`~wds_cloud.spec.schema.DatasetSpec`: the dialect is
the file's, and webdataset's own (``datasets:``) is read here.

Dialects (one module each, one schema after them):

- **webdataset** (here): ``prefix``, ``buckets``, ``datasets:`` of ``shards`` with webdataset's
  meanings: a spec whose sources give no ``weight``/``scale`` reads every shard once per epoch,
  or ``resample: k`` / ``choose: n`` shards of a source (mode ``"shards"``, as webdataset 1.0.2's
  ``MultiShardSample``); a ``weight`` (``scaleprob``, ``prob``) or ``scale`` on a source makes an
  endless mix of samples by weight (mode ``"mix"``, the keys of webdataset's docs).
- **energon** (:mod:`.energon`): Megatron-Energon metadatasets (``__module__: megatron.energon``,
  ``splits:``, ``blend:``, ``blend_epochized:``), and a bare ``blend:``/``blend_epochized:``.
- **mosaic** (:mod:`.mosaic`): Mosaic streaming's / llm-foundry's ``streams:`` (or a single
  ``remote``/``local``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..urls import merge_scheme_options
from .files import OpenStream
from .reader import Reader, finish
from .schema import (
    ALIASES,
    SOURCE_KEYS,
    TOP_KEYS,
    DatasetSpec,
    SourceSpec,
    expand_braces,
    join_pattern,
    refuse_pipe,
)

__all__ = ["dialect_of", "parse"]

_ENERGON_TOP = ("__module__", "__class__", "splits", "blend", "blend_epochized")
_MOSAIC_TOP = ("streams", "remote", "local")


def dialect_of(data: Any) -> str:
    """``"energon"``, ``"mosaic"`` or ``"webdataset"``: the format of a loaded spec."""
    if isinstance(data, Mapping):
        if any(k in data for k in _ENERGON_TOP):
            return "energon"
        if any(k in data for k in _MOSAIC_TOP):
            return "mosaic"
    return "webdataset"


def parse(data: Any, *, origin: str, environ: Mapping[str, str] | None, allow_pipe: bool,
          split: str | None = None, strict: bool = False,
          base: str | None = None, open_stream: OpenStream | None = None) -> DatasetSpec:
    """The :class:`DatasetSpec` of ``data`` (a dict as YAML or JSON loads it), read by its
    dialect; ``split`` (Energon's splits; default ``train``), ``base`` (relative paths),
    ``open_stream`` (reads the spec files it names at URLs)."""
    r = Reader(origin, environ, allow_pipe, base=base, strict=strict, open_stream=open_stream)
    if data is None:
        raise r.fail("", "the spec is empty; it needs a 'datasets' list (webdataset), "
                     "'splits' (Energon) or 'streams' (Mosaic)")
    dialect = dialect_of(data)
    if dialect == "energon":
        from .energon import parse_energon

        return parse_energon(r, data, split or "train")
    if split is not None and split != "train":
        raise r.fail("", f"split={split!r}: only Energon metadatasets have splits (this is a "
                     f"{dialect} spec); a Mosaic stream's 'split' is a key of the stream")
    if dialect == "mosaic":
        from .mosaic import parse_mosaic

        return parse_mosaic(r, data)
    return _parse_webdataset(r, data)


def _parse_webdataset(r: Reader, data: Any) -> DatasetSpec:
    top, spelled = r.mapping(data, "", TOP_KEYS, ALIASES["top"])
    entries = _entries(r, top.get("datasets"), spelled.get("datasets", "datasets"))
    prefix = r.text(top.get("prefix", ""), spelled.get("prefix", "prefix"))
    bucket = _bucket(r, top.get("buckets"), spelled.get("buckets", "buckets"))
    options = r.options(top.get("storage_options"), "storage_options")
    seed = r.seed(top.get("seed"), "seed")
    read = [_source(r, entry, path, prefix, bucket, options) for path, entry in entries]
    sources = [source for source, _ in read]
    mode = _mode(r, sources, {source.key: explicit for source, explicit in read})
    return finish(r, sources, seed=seed, storage_options=options, mode=mode,
                  dialect="webdataset")


def _entries(r: Reader, value: Any, spelled: str) -> list[tuple[str, Any]]:
    if value is None:
        raise r.fail("", "no 'datasets' key: list the sources under 'datasets:'")
    if isinstance(value, Mapping):  # name -> source
        out = []
        for name, entry in value.items():
            if not isinstance(entry, Mapping):
                raise r.fail(f"{spelled}.{name}", "expected a mapping of keys")
            out.append((f"{spelled}.{name}", {"name": str(name), **entry}))
        entries = out
    elif isinstance(value, list):
        entries = [(f"{spelled}[{i}]", entry) for i, entry in enumerate(value)]
    else:
        raise r.fail(spelled, f"expected a list of sources, got {type(value).__name__}")
    if not entries:
        raise r.fail(spelled, "no sources: list at least one")
    return entries


def _bucket(r: Reader, value: Any, path: str) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        if len(value) > 1:
            raise r.fail(path, f"one bucket per source, got {len(value)}; make one source "
                         "per bucket")
        value = value[0] if value else ""
    return r.text(value, path)


def _source(r: Reader, entry: Any, path: str, prefix: str, bucket: str,
            defaults: Mapping[str, Mapping[str, Any]]) -> tuple[SourceSpec, set[str]]:
    """A source, and which of weight/scale it gave explicitly."""
    d, spelled = r.mapping(entry, path, SOURCE_KEYS, ALIASES["source"])

    def at(key: str) -> str:
        return f"{path}.{spelled.get(key, key)}"

    if "shards" not in d:
        raise r.fail(path, "no 'shards' (or 'urls', 'path'): give a brace pattern, a list or "
                     "a bucket glob")
    raw = d["shards"]
    patterns = raw if isinstance(raw, list) else [raw]
    if not patterns or patterns == [""]:
        raise r.fail(at("shards"), "empty: give a brace pattern, a list or a bucket glob")
    bucket = _bucket(r, d["buckets"], at("buckets")) if "buckets" in d else bucket
    joined = [join_pattern(prefix, bucket, r.text(p, at("shards"))) for p in patterns]
    urls = [u for p in joined for u in expand_braces(p)]
    if not urls or any(not u for u in urls):
        raise r.fail(at("shards"), f"{raw!r} expands to an empty URL")
    refuse_pipe(urls, f"{r.origin}: {at('shards')}", r.allow_pipe)
    weight, schedule = r.weight(d.get("weight", 1.0), at("weight"))
    scale = _scale(r, d.get("scale", 1.0), at("scale"))
    extensions = _extensions(r, d.get("extensions"), at("extensions"))
    resample = r.count(d["resample"], at("resample")) if "resample" in d else None
    choose = r.count(d["choose"], at("choose")) if "choose" in d else None
    if resample is not None and choose is not None:
        raise r.fail(path, "give resample (shards with replacement per epoch) or choose "
                     "(without), not both")
    source = SourceSpec(
        name=r.text(d["name"], at("name")) if "name" in d else "",
        pattern=" ".join(joined), urls=tuple(urls), weight=weight, scale=scale,
        extensions=extensions, storage_options=merge_scheme_options(
            defaults, r.options(d.get("storage_options"), at("storage_options"))),
        resample=resample, choose=choose, key=path, spelled=spelled, schedule=schedule)
    if choose is not None and not source.has_glob and choose > len(urls):
        raise r.fail(at("choose"), f"{choose} shards asked for, but {source.pattern!r} has "
                     f"{len(urls)}")
    return source, {k for k in d if k in ("weight", "scale")}


def _scale(r: Reader, value: Any, path: str) -> tuple[float, float]:
    what = "a number >= 0 or [lo, hi] with 0 <= lo <= hi"
    if isinstance(value, list):
        if len(value) != 2:
            raise r.fail(path, f"expected {what}, got {value!r}")
        lo, hi = (r.number(v, path, what) for v in value)
        if lo > hi:
            raise r.fail(path, f"expected {what}, got {value!r} (lo > hi)")
        return lo, hi
    factor = r.number(value, path, what)
    return factor, factor


def _extensions(r: Reader, value: Any, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(
            isinstance(x, str) and x for x in items):
        raise r.fail(path, f"expected extensions as 'jpg txt' or [jpg, txt], got {value!r}")
    return tuple(x.lstrip(".") for x in items)


def _mode(r: Reader, sources: list[SourceSpec], explicit: Mapping[str, set[str]]) -> str:
    """webdataset's meaning: ``resample``/``choose``, or no weights at all, is a per-epoch shard
    list; a weight or scale is a mix (which cannot be combined with the counts)."""
    counted = [s for s in sources if s.resample is not None or s.choose is not None]
    weighted = [s for s in sources if explicit[s.key]]
    if counted and weighted:
        w = weighted[0]
        given = "/".join(sorted(w.spelling(k) for k in explicit[w.key]))
        raise r.fail(w.key, f"{given} cannot be combined with resample/choose (as in "
                     f"{counted[0].key}): a spec either mixes sources by relative weight, or "
                     "reads shards per epoch")
    return "mix" if weighted else "shards"
