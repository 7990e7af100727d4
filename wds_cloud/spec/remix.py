"""Resuming a mix whose sources changed: :func:`remap_state`.

A mix's state names its sources (``src.<i>.name``) and records, per source, a digest of its
shard list (``src.<i>.list``), its weight and the index its shard permutation was keyed by
(``src.<i>.key``). Restored into a spec whose sources changed, sources are known by name:

- a kept source continues from its own cursor (its position in its shard stream, and the
  permutation it was reading), with its new weight;
- a new source starts at its beginning; a removed one is dropped, with its samples in the
  shuffle buffer;
- each change is logged once at INFO; a kept source whose shard list changed under it cannot
  continue: :class:`~wds_cloud.errors.ResumeError` with ``field="src.<name>.shards"``.

Layer 2: plain dicts in, plain dicts out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ResumeError
from ..pipeline.state import decode_refs, encode_refs, fingerprint
from .schema import DatasetSpec

__all__ = ["remap_state", "source_keys"]

log = logging.getLogger(__name__)

_SOURCE_KEY = re.compile(r"^(src|ref)\.(\d+)\.(.*)$")


def source_keys(spec: DatasetSpec, urls: Sequence[Sequence[str]],
                keys: Sequence[int]) -> dict[str, Any]:
    """What a mix's state says of its sources (see the module docstring)."""
    out: dict[str, Any] = {}
    for i, (source, found) in enumerate(zip(spec.sources, urls, strict=True)):
        out[f"src.{i}.name"] = source.name
        out[f"src.{i}.list"] = fingerprint(list(found))
        out[f"src.{i}.weight"] = _weight(source)
        out[f"src.{i}.key"] = keys[i]
    return out


def _weight(source: Any) -> str:
    """A source's weight as a state records it (a schedule as its text)."""
    return repr(source.weight) if source.schedule is None else str(source.schedule)


def remap_state(state: Mapping[str, Any], *, spec: DatasetSpec,
                urls: Sequence[Sequence[str]], now: str) -> dict[str, Any]:
    """``state`` (one worker's, of a mix) for the sources of ``spec`` (``urls`` listed), with
    fingerprint ``now``; :class:`ResumeError` where it cannot be honoured."""
    count = 1 + max((int(m.group(2)) for k in state if (m := _SOURCE_KEY.match(k))),
                    default=-1)
    saved = {i: state.get(f"src.{i}.name") for i in range(count)}
    if not saved or any(name is None for name in saved.values()):
        raise ResumeError("cannot resume: the dataset's spec changed, and this state does not "
                          "name its sources (saved by an older wds_cloud); resume with the "
                          "saved spec", field="fingerprint")
    index = {s.name: j for j, s in enumerate(spec.sources)}
    moved: dict[int, int] = {}
    for i, name in saved.items():
        j = index.get(str(name))
        if j is None:
            log.info("resuming %s: source %r was removed: dropped (with its buffered samples)",
                     spec.origin, name)
            continue
        if state.get(f"src.{i}.list") != fingerprint(list(urls[j])):
            raise ResumeError(
                f"cannot resume: the shards of source {name!r} changed since the state was "
                f"saved ({len(urls[j])} shards now), so its position means nothing; keep its "
                "shard list, or give the changed source a new name (it then starts afresh)",
                field=f"src.{name}.shards")
        weight = _weight(spec.sources[j])
        if state.get(f"src.{i}.weight") != weight:
            log.info("resuming %s: source %r goes on from where it stood with weight %s (was "
                     "%s)", spec.origin, name, weight, state.get(f"src.{i}.weight"))
        moved[i] = j
    for name in index.keys() - {str(n) for n in saved.values()}:
        log.info("resuming %s: source %r was added: it starts at its beginning", spec.origin,
                 name)
    return _moved(state, moved, now)


def _moved(state: Mapping[str, Any], moved: Mapping[int, int], now: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        match = _SOURCE_KEY.match(key)
        if match is None:
            out[key] = value
        elif int(match.group(2)) in moved:
            out[f"{match.group(1)}.{moved[int(match.group(2))]}.{match.group(3)}"] = value
    if "mix.last" in out:
        out["mix.last"] = moved.get(int(out["mix.last"]), 0)
    if out.get("shuffle.buffer"):
        refs = [(moved[i], k, o, b) for i, k, o, b in decode_refs(out["shuffle.buffer"])
                if i in moved]
        out["shuffle.buffer"] = encode_refs(refs)
    out["fingerprint"] = now
    return out
