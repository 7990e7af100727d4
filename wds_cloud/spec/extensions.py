"""A source's ``extensions`` that match nothing: a misspelt ``clss`` keeps no member, silently.

``extensions: txt clss`` keeps the ``txt`` of each sample and drops its ``cls``: nothing
fails, the samples only lack what was wanted. :func:`unmatched_extensions` finds the
extensions no member of the samples read had, with the closest of those they had ("did you
mean 'cls'?"); ``wds-cloud spec check`` warns about them for the shard it reads of each source,
and :class:`ExtensionCheck` logs one WARNING per source, extension and process when the first
:data:`SAMPLES` samples of a source (or all of them, if fewer) had none.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .schema import DatasetSpec

__all__ = ["SAMPLES", "ExtensionCheck", "sample_extensions", "unmatched_extensions",
           "unmatched_message"]

log = logging.getLogger(__name__)

#: samples of a source looked at before an extension none of them had is reported
SAMPLES = 100
#: (spec origin, source key, its shards, extension) already reported in this process
_WARNED: set[tuple[str, str, str, str]] = set()


def sample_extensions(sample: Mapping[str, Any]) -> Iterable[str]:
    """The member extensions of ``sample`` (not its ``__key__``-style metadata)."""
    return (k for k in sample if not k.startswith("__"))


def unmatched_extensions(wanted: Sequence[str], seen: Iterable[str]
                         ) -> list[tuple[str, str | None]]:
    """The extensions of ``wanted`` not among ``seen``, each with the closest of ``seen`` not
    wanted (or None)."""
    there = set(seen)
    others = sorted(there - set(wanted))
    return [(ext, next(iter(difflib.get_close_matches(ext, others, n=1)), None))
            for ext in wanted if ext not in there]


def unmatched_message(ext: str, close: str | None, seen: Iterable[str], where: str) -> str:
    """``'clss' matches no member of <where> (extensions there: cls, txt): none is kept for
    it; did you mean 'cls'?``"""
    there = ", ".join(sorted(set(seen))) or "none"
    return (f"{ext!r} matches no member of {where} (extensions there: {there}): none is kept "
            "for it" + (f"; did you mean {close!r}?" if close else ""))


def _noted(spec: DatasetSpec, i: int, ext: str) -> tuple[str, str, str, str]:
    source = spec.sources[i]
    return spec.origin, source.key, source.pattern, ext


class ExtensionCheck:
    """Watches the samples of ``spec``'s sources with ``extensions`` (call :meth:`see` with
    each, before the extensions are kept) until each wanted extension was seen or
    :data:`SAMPLES` were; :meth:`finish` when the stream ends. :attr:`active` is False once
    there is nothing left to watch."""

    def __init__(self, spec: DatasetSpec) -> None:
        self.spec = spec
        self._seen: dict[int, set[str]] = {}
        self._counts: dict[int, int] = {}
        for i, source in enumerate(spec.sources):
            if source.extensions is not None and not all(
                    _noted(spec, i, ext) in _WARNED for ext in source.extensions):
                self._seen[i], self._counts[i] = set(), 0
        self.active = bool(self._seen)

    def see(self, i: int, sample: Mapping[str, Any]) -> None:
        seen = self._seen.get(i)
        if seen is None:
            return
        seen.update(sample_extensions(sample))
        self._counts[i] += 1
        wanted = self.spec.sources[i].extensions or ()
        if self._counts[i] >= SAMPLES or all(ext in seen for ext in wanted):
            self._report(i)

    def finish(self) -> None:
        for i in list(self._seen):
            if self._counts[i]:
                self._report(i)

    def _report(self, i: int) -> None:
        seen, count = self._seen.pop(i), self._counts.pop(i)
        self.active = bool(self._seen)
        source = self.spec.sources[i]
        for ext, close in unmatched_extensions(source.extensions or (), seen):
            if _noted(self.spec, i, ext) in _WARNED:
                continue
            _WARNED.add(_noted(self.spec, i, ext))
            where = f"the {'first ' if count >= SAMPLES else ''}{count:,} samples read"
            log.warning("%s: %s.extensions (source %r): %s", self.spec.origin, source.key,
                        source.name, unmatched_message(ext, close, seen, where))
