"""What the dialects' readers share: :class:`Reader` (messages that name the file and the key as
written, typed values, unknown and unused keys) and the checks every spec gets once its sources
are read (:func:`finish`)."""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import SpecError
from .files import OpenStream, is_url
from .schedule import WeightSchedule, check_positive, read_schedule
from .schema import DatasetSpec, SourceSpec, close_key, expand_vars

__all__ = ["Reader", "finish"]

_UNIT = {"samples": "samples", "step": "steps"}
_NAME_CUT = re.compile(r"[{*?\[]")


class Reader:
    """Reads one spec; ``fail(path, what)`` is a SpecError naming the origin and key path.

    ``base``: the directory relative paths of Energon's and Mosaic's sources start from (the
    spec file's). ``strict``: a key read but not used here is an error rather than a note in
    :attr:`unused`.
    """

    def __init__(self, origin: str, environ: Mapping[str, str] | None, allow_pipe: bool, *,
                 base: str | None = None, strict: bool = False,
                 open_stream: OpenStream | None = None) -> None:
        self.origin = origin
        self._environ = environ
        self.allow_pipe = allow_pipe
        self.base = base
        self.strict = strict
        #: reads the spec files a spec names at URLs (Energon's nested metadatasets)
        self.open_stream = open_stream
        self.unused: list[tuple[str, str]] = []
        #: reading a metadataset that another one includes (Energon)
        self.nested = False

    def fail(self, path: str, what: str) -> SpecError:
        return SpecError(f"{self.origin}: {path}: {what}" if path else f"{self.origin}: {what}")

    def not_used(self, path: str, why: str) -> None:
        """Note a key that is valid where the file comes from but means nothing here."""
        if self.strict:
            raise self.fail(path, f"not used here: {why} (refused under --strict / "
                            "strict=True; remove the key)")
        self.unused.append((path, why))

    def environ(self) -> Mapping[str, str]:
        if self._environ is None:
            from ..settings import Settings

            self._environ = Settings.from_env().environ
        return self._environ

    def text(self, value: Any, path: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(path, f"expected a string, got {type(value).__name__} {value!r}")
        value = str(value)
        return expand_vars(value, self.environ(), f"{self.origin}: {path}") \
            if "${" in value else value

    def mapping(self, data: Any, path: str, known: tuple[str, ...],
                aliases: Mapping[str, str] | None = None) -> tuple[dict[str, Any],
                                                                   dict[str, str]]:
        """``(values, spelled)``: ``data``'s keys with aliases replaced, and each canonical key
        as written; unknown keys and two spellings of one key are errors."""
        aliases = aliases or {}
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
            out[name], spelled[name] = value, str(key)
        return out, spelled

    def canonical(self, data: Any, path: str, known: tuple[str, ...],
                  aliases: Mapping[str, str]) -> dict[str, Any]:
        """``data`` with aliases replaced (see :meth:`mapping`)."""
        return self.mapping(data, path, known, aliases)[0]

    def number(self, value: Any, path: str, what: str) -> float:
        if isinstance(value, str):  # an interpolated ${VAR}
            text = self.text(value, path)
            try:
                value = float(text)
            except ValueError:
                raise self.fail(path, f"expected {what}, got {text!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"expected {what}, got {value!r}")
        if value < 0:
            raise self.fail(path, f"expected {what}, got {value!r} (negative)")
        return float(value)

    def weight(self, value: Any, path: str, what: str = "a weight >= 0"
               ) -> tuple[float, WeightSchedule | None]:
        """``(weight, schedule)``: a number, or a schedule mapping (:mod:`.schedule`), whose
        weight at 0 is the number."""
        if isinstance(value, Mapping):
            schedule = read_schedule(value, self.fail, path)
            return schedule.at(0), schedule
        return self.number(value, path, what), None

    def integer(self, value: Any, path: str, what: str, least: int = 0) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise self.fail(path, f"expected {what}, got {value!r}")
        return value

    def count(self, value: Any, path: str) -> int:
        return self.integer(value, path, "a number of shards >= 1", 1)

    def seed(self, value: Any, path: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = self.text(value, path)
            value = int(value) if value.strip().lstrip("-").isdigit() else value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {value!r}")
        return value

    def flag(self, value: Any, path: str) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise self.fail(path, f"expected true or false, got {value!r}")

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

    def location(self, value: Any, path: str) -> str:
        """A path or URL; a relative local path is taken from :attr:`base`."""
        text = self.text(value, path).strip()
        if not text:
            raise self.fail(path, "empty: give a directory, prefix or shard pattern")
        if self.base is not None and "://" not in text and not text.startswith(
                ("/", "pipe:", "-")) and ":" not in text.split("/")[0]:
            if is_url(self.base):  # beside a spec in a bucket: s3://b/specs + ../x
                scheme, _, rest = self.base.partition("://")
                return f"{scheme}://{posixpath.normpath(posixpath.join(rest, text))}"
            return os.path.normpath(os.path.join(self.base, text))
        return text


def _default_name(source: SourceSpec, index: int) -> str:
    first = source.urls[0] if len(source.urls) == 1 else source.pattern.split(" ")[0]
    base = os.path.basename(first.rstrip("/"))
    base = _NAME_CUT.split(base, 1)[0]
    for ext in (".tar.gz", ".tgz", ".tar"):
        base = base.removesuffix(ext)
    return base.rstrip("-_.") or f"source{index}"


def _named(r: Reader, sources: list[SourceSpec]) -> list[SourceSpec]:
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
            if s.split_part and name in seen:
                name = base = f"{base}-{s.split_part}"
            n = 2
            while name in seen:
                name, n = f"{base}-{n}", n + 1
            seen[name] = s.key
            s = replace(s, name=name)
        out.append(s)
    return out


def _same_shards(r: Reader, sources: list[SourceSpec]) -> None:
    first: dict[tuple[Any, ...], str] = {}
    for s in sources:
        identity = (s.urls, s.extensions, s.split_part,
                    json.dumps(s.subflavors, sort_keys=True, default=str))
        same = first.setdefault(identity, s.key)
        if same != s.key:
            raise r.fail(s.key, f"the same shards as {same} ({s.pattern!r}); merge them, or "
                         "give one a larger weight")


def finish(r: Reader, sources: list[SourceSpec], **fields: Any) -> DatasetSpec:
    """The spec of ``sources`` (named, checked for repeats and for a zero total weight), with
    ``fields`` and the unused keys noted while reading."""
    if not sources:
        raise r.fail("", "no sources: list at least one")
    sources = _named(r, sources)
    _same_shards(r, sources)
    spec = DatasetSpec(sources=tuple(sources), origin=r.origin, unused=tuple(r.unused),
                       **fields)
    scheduled = [s for s in sources if s.schedule is not None]
    if scheduled and spec.mode != "mix":
        raise r.fail(f"{scheduled[0].key}.{scheduled[0].spelling('weight')}",
                     "a weight schedule needs a mix by weight; this spec counts "
                     f"{spec.mode} per epoch")
    if scheduled:
        _check_schedules(r, scheduled, sources)
    elif spec.mode == "mix":
        if sum(s.weight * s.scale[1] for s in sources) <= 0:
            raise r.fail("", "all weights are zero: give at least one source a weight > 0")
        if sum(s.weight * s.scale[0] for s in sources) <= 0:
            raise r.fail("", "every source's weight x scale can be zero in the same epoch "
                         "(the scale ranges start at 0); raise a lower bound")
    return spec


def _check_schedules(r: Reader, scheduled: list[SourceSpec], sources: list[SourceSpec]) -> None:
    """One unit for every schedule, and some weight > 0 at every position (with each scale
    at its low end)."""
    first = scheduled[0]
    assert first.schedule is not None
    for s in scheduled[1:]:
        assert s.schedule is not None
        if s.schedule.by != first.schedule.by:
            raise r.fail(f"{s.key}.{s.spelling('weight')}.by", f"{s.schedule.by!r}, but "
                         f"{first.key} counts its schedule by {first.schedule.by!r}: the "
                         "schedules of a spec count the same thing")
    where = check_positive([(s.scale[0] if s.schedule is not None else s.weight * s.scale[0],
                             s.schedule) for s in sources])
    if where is not None:
        raise r.fail(f"{first.key}.{first.spelling('weight')}",
                     f"every source's weight is zero at {where:,} {_UNIT[first.schedule.by]} (with "
                     "each scale at its low end): give some source a weight > 0 there")
