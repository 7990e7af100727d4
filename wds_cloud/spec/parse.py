"""The strict reading of a spec's keys into :class:`~wds_cloud.spec.schema.DatasetSpec`:
aliases, types, ranges and the rules across sources; each error names the file and key path."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import SpecError
from ..urls import merge_scheme_options
from .schema import (
    ALIASES,
    SOURCE_KEYS,
    TOP_KEYS,
    DatasetSpec,
    SourceSpec,
    close_key,
    expand_braces,
    expand_vars,
    join_pattern,
    refuse_pipe,
)

__all__ = ["parse"]

_NAME_CUT = re.compile(r"[{*?\[]")


class _Reader:
    """Reads one spec; ``fail(path, what)`` raises a SpecError naming the origin and path."""

    def __init__(self, origin: str, environ: Mapping[str, str] | None,
                 allow_pipe: bool) -> None:
        self.origin = origin
        self._environ = environ
        self.allow_pipe = allow_pipe

    def fail(self, path: str, what: str) -> SpecError:
        return SpecError(f"{self.origin}: {path}: {what}" if path else f"{self.origin}: {what}")

    def environ(self) -> Mapping[str, str]:
        if self._environ is None:
            from ..settings import Settings

            self._environ = Settings.from_env().environ
        return self._environ

    def text(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {type(value).__name__} {value!r}")
        return expand_vars(value, self.environ(), f"{self.origin}: {path}") \
            if "${" in value else value

    def canonical(self, data: Any, path: str, known: tuple[str, ...],
                  aliases: Mapping[str, str]) -> dict[str, Any]:
        """``data`` (a mapping) with aliases replaced; unknown keys and two spellings of one
        key are errors."""
        if not isinstance(data, Mapping):
            raise self.fail(path, f"expected a mapping of keys, got {type(data).__name__}")
        out: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for key, value in data.items():
            name = aliases.get(key, key)
            where = f"{path}.{key}" if path else str(key)
            if name not in known:
                raise self.fail(where, f"unknown key {key!r}{close_key(str(key), known, aliases)}"
                                f" (known: {', '.join(known)})")
            if name in out:
                raise self.fail(where, f"{key!r} and {spelled[name]!r} both give {name!r}")
            out[name], spelled[name] = value, key
        return out

    def number(self, value: Any, path: str, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"expected {what}, got {value!r}")
        if value < 0:
            raise self.fail(path, f"expected {what}, got {value!r} (negative)")
        return float(value)

    def count(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(path, f"expected a number of shards >= 1, got {value!r}")
        return value

    def options(self, value: Any, path: str) -> dict[str, dict[str, Any]]:
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(v, Mapping)
                                                      for v in value.values()):
            raise self.fail(path, "expected options per scheme, e.g. {s3: {endpoint_url: ...}}")
        return {str(scheme): {str(k): self._expand(v, f"{path}.{scheme}.{k}")
                              for k, v in opts.items()} for scheme, opts in value.items()}

    def _expand(self, value: Any, path: str) -> Any:
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, Mapping):
            return {k: self._expand(v, f"{path}.{k}") for k, v in value.items()}
        return value

    def bucket(self, value: Any, path: str) -> str:
        if value is None:
            return ""
        if isinstance(value, list):
            if len(value) > 1:
                raise self.fail(path, f"one bucket per source, got {len(value)}; make one "
                                "source per bucket")
            value = value[0] if value else ""
        return self.text(value, path)


def parse(data: Any, *, origin: str, environ: Mapping[str, str] | None,
          allow_pipe: bool) -> DatasetSpec:
    """The :class:`DatasetSpec` of ``data`` (a dict as YAML or JSON loads it)."""
    r = _Reader(origin, environ, allow_pipe)
    if data is None:
        raise r.fail("", "the spec is empty; it needs a 'datasets' list")
    top = r.canonical(data, "", TOP_KEYS, ALIASES["top"])
    spelled = next((k for k in data if ALIASES["top"].get(k, k) == "datasets"), "datasets")
    entries = _entries(r, top.get("datasets"), spelled)
    prefix = r.text(top.get("prefix", ""), "prefix")
    bucket = r.bucket(top.get("buckets"), "buckets")
    options = r.options(top.get("storage_options"), "storage_options")
    seed = top.get("seed")
    if isinstance(seed, str):
        seed = r.text(seed, "seed")
        seed = int(seed) if seed.strip().lstrip("-").isdigit() else seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise r.fail("seed", f"expected an integer, got {seed!r}")
    read = [_source(r, entry, path, prefix, bucket, options) for path, entry in entries]
    sources = _named(r, [source for source, _ in read])
    _check_across(r, sources, {source.key: explicit for source, explicit in read})
    return DatasetSpec(sources=tuple(sources), seed=seed, storage_options=options,
                       origin=origin)


def _entries(r: _Reader, value: Any, spelled: str) -> list[tuple[str, Any]]:
    if value is None:
        raise r.fail("", "no 'datasets' key: list the sources under 'datasets:'")
    if isinstance(value, Mapping):  # Mosaic's streams: name -> source
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


def _source(r: _Reader, entry: Any, path: str, prefix: str, bucket: str,
            defaults: Mapping[str, Mapping[str, Any]]) -> tuple[SourceSpec, set[str]]:
    """A source, and which of weight/scale it gave explicitly."""
    d = r.canonical(entry, path, SOURCE_KEYS, ALIASES["source"])
    if "shards" not in d:
        raise r.fail(path, "no 'shards' (or 'urls', 'path'): give a brace pattern, a list or "
                     "a bucket glob")
    raw = d["shards"]
    patterns = raw if isinstance(raw, list) else [raw]
    if not patterns or patterns == [""]:
        raise r.fail(f"{path}.shards", "empty: give a brace pattern, a list or a bucket glob")
    bucket = r.bucket(d["buckets"], f"{path}.buckets") if "buckets" in d else bucket
    joined = [join_pattern(prefix, bucket, r.text(p, f"{path}.shards")) for p in patterns]
    urls = [u for p in joined for u in expand_braces(p)]
    if not urls or any(not u for u in urls):
        raise r.fail(f"{path}.shards", f"{raw!r} expands to an empty URL")
    refuse_pipe(urls, f"{r.origin}: {path}.shards", r.allow_pipe)
    weight = r.number(d.get("weight", 1.0), f"{path}.weight", "a weight >= 0")
    scale = _scale(r, d.get("scale", 1.0), f"{path}.scale")
    extensions = _extensions(r, d.get("extensions"), f"{path}.extensions")
    resample = r.count(d["resample"], f"{path}.resample") if "resample" in d else None
    choose = r.count(d["choose"], f"{path}.choose") if "choose" in d else None
    if resample is not None and choose is not None:
        raise r.fail(path, "give resample (shards with replacement per epoch) or choose "
                     "(without), not both")
    source = SourceSpec(
        name=r.text(d["name"], f"{path}.name") if "name" in d else "",
        pattern=" ".join(joined), urls=tuple(urls), weight=weight, scale=scale,
        extensions=extensions, storage_options=merge_scheme_options(
            defaults, r.options(d.get("storage_options"), f"{path}.storage_options")),
        resample=resample, choose=choose, key=path)
    if choose is not None and not source.has_glob and choose > len(urls):
        raise r.fail(f"{path}.choose", f"{choose} shards asked for, but {source.pattern!r} has "
                     f"{len(urls)}")
    return source, {k for k in d if k in ("weight", "scale")}



def _scale(r: _Reader, value: Any, path: str) -> tuple[float, float]:
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


def _extensions(r: _Reader, value: Any, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(
            isinstance(x, str) and x for x in items):
        raise r.fail(path, f"expected extensions as 'jpg txt' or [jpg, txt], got {value!r}")
    return tuple(x.lstrip(".") for x in items)


def _default_name(source: SourceSpec, index: int) -> str:
    base = os.path.basename(source.urls[0] if len(source.urls) == 1 else
                            source.pattern.split(" ")[0])
    base = _NAME_CUT.split(base, 1)[0]
    for ext in (".tar.gz", ".tgz", ".tar"):
        base = base.removesuffix(ext)
    return base.rstrip("-_.") or f"source{index}"


def _named(r: _Reader, sources: list[SourceSpec]) -> list[SourceSpec]:
    seen: dict[str, str] = {}
    for s in sources:
        if s.name:
            if s.name in seen:
                raise r.fail(f"{s.key}.name", f"{s.name!r} is also the name of {seen[s.name]}; "
                             "names must be unique")
            seen[s.name] = s.key
    out = []
    for i, s in enumerate(sources):
        if not s.name:
            name = base = _default_name(s, i)
            n = 2
            while name in seen:
                name, n = f"{base}-{n}", n + 1
            seen[name] = s.key
            s = replace(s, name=name)
        out.append(s)
    return out


def _check_across(r: _Reader, sources: list[SourceSpec],
                  explicit: Mapping[str, set[str]]) -> None:
    first: dict[tuple[tuple[str, ...], tuple[str, ...] | None], str] = {}
    for s in sources:
        same = first.setdefault((s.urls, s.extensions), s.key)
        if same != s.key:
            raise r.fail(s.key, f"the same shards as {same} ({s.pattern!r}); merge them, or "
                         "give one a larger weight")
    counted = [s for s in sources if s.resample is not None or s.choose is not None]
    if counted:
        weighted = [s for s in sources if explicit[s.key]]
        if weighted:
            w = weighted[0]
            raise r.fail(w.key, f"{'/'.join(sorted(explicit[w.key]))} cannot be combined "
                         f"with resample/choose (as in {counted[0].key}): a spec either mixes "
                         "sources by relative weight, or counts shards per epoch")
        return
    if sum(s.weight * s.scale[1] for s in sources) <= 0:
        raise r.fail("", "all weights are zero: give at least one source a weight > 0")
    if sum(s.weight * s.scale[0] for s in sources) <= 0:
        raise r.fail("", "every source's weight x scale can be zero in the same epoch (the "
                     "scale ranges start at 0); raise a lower bound")
