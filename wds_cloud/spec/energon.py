"""Megatron-Energon metadatasets, as their users write them, read into the one schema.

The wrapper ``__module__: megatron.energon`` with ``__class__: MetadatasetV2`` (or the older
``Metadataset``, whose splits hold ``datasets:``), ``splits:`` with one entry per split; in a
split, ``blend:`` (``weight`` per entry, default 1) or ``blend_epochized:`` (``repetitions``,
fractional too), or one dataset reference. A reference's ``path`` is an Energon-prepared
directory (``.nv-meta/``; its shards are found when the dataset is built, see
:mod:`wds_cloud.specshards`), a plain directory of shards, or another metadataset file (nested:
its ``split_part`` split, weights multiplied, repetitions multiplied, relative to the including
file). ``subflavors`` (and the legacy ``subflavor``) go into each sample as ``__subflavors__``,
outer ones overriding inner ones, as Energon merges them.

The train split mixes by weight, endlessly (Energon's training mode), or counts samples per
epoch with ``blend_epochized``; any other split reads every sample once per epoch (Energon's
validation mode: blends are concatenated, repetitions ignored). Keys that configure Energon's own
sample loading are noted as not used here (refused with ``strict``); ``join`` and ``subset``
are refused, naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .reader import Reader, finish
from .schedule import WeightSchedule
from .schema import DatasetSpec, SourceSpec

__all__ = ["parse_energon"]

_CLASSES = ("MetadatasetV2", "Metadataset")
_REFERENCE = ("path", "split_part", "subflavors", "subflavor", "split_config",
              "shuffle_over_epochs_multiplier", "dataset_config", "aux", "subset")
#: keys of Energon's sample loading: valid there, meaningless here
_LOADING = ("sample_type", "field_map", "sample_loader", "part_filter", "cookers", "decoder",
            "auto_decode", "image_decode", "av_decode", "guess_content", "subset_ratio")
_UNUSED = {
    "shuffle_over_epochs_multiplier": "Energon's shuffle window over epochs; here shards get a "
                                      "new permutation every epoch",
    "dataset_config": "names Energon's sample-loading config (sample_type, field_map); samples "
                      "here are dicts of tar members (use .decode(), .to_tuple(), .map())",
    "aux": "auxiliary datasets are read by Energon's cookers; here each sample has its own "
           "tar members only",
}
_LOADING_WHY = ("configures Energon's sample loading; samples here are dicts of tar members "
                "(use .decode(), .to_tuple(), .map())")


@dataclass
class _Leaf:
    """A dataset reached through the metadataset tree."""

    path: str
    split_part: str
    key: str
    weight: float = 1.0
    repetitions: float = 1.0
    subflavors: dict[str, Any] = field(default_factory=dict)
    split_config: str | None = None
    schedule: WeightSchedule | None = None


def parse_energon(r: Reader, data: Any, split: str) -> DatasetSpec:
    """The spec of an Energon metadataset's ``split``."""
    top = _top(r, data)
    training = split == "train"
    if "splits" in top:
        splits = top["splits"]
        if not isinstance(splits, Mapping) or not splits:
            raise r.fail("splits", "expected a mapping of split name to its datasets "
                         "(train:, val:, ...)")
        if split not in splits:
            raise r.fail("splits", f"no split {split!r} (splits here: "
                         f"{', '.join(map(str, splits))}); pick one with split=... or "
                         "--split")
        node, where = splits[split], f"splits.{split}"
    else:
        node, where = top, ""
    mode, leaves = _node(r, node, where, split)
    sources = [_source(r, leaf, mode if training else "samples", training) for leaf in leaves]
    return finish(r, sources, mode=mode if training else "samples", dialect="energon",
                  split=split)


def _top(r: Reader, data: Any) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise r.fail("", f"expected a mapping of keys, got {type(data).__name__}")
    module, cls = data.get("__module__"), data.get("__class__")
    if module is not None and module != "megatron.energon":
        raise r.fail("__module__", f"{module!r}: an Energon metadataset has "
                     "'__module__: megatron.energon'")
    if cls is not None and cls not in _CLASSES:
        hint = (" (that is a prepared dataset's .nv-meta/dataset.yaml: name the dataset's "
                "directory as a source instead)" if "Webdataset" in str(cls) else "")
        raise r.fail("__class__", f"{cls!r}: expected one of {', '.join(_CLASSES)}{hint}")
    if "splits" in data:
        known: tuple[str, ...] = ("__module__", "__class__", "splits")
    else:  # a split's content on its own: blend:, blend_epochized:, or a reference
        known = ("__module__", "__class__", "blend", "blend_epochized", *_REFERENCE, *_LOADING)
    out, _ = r.mapping(data, "", known)
    return {k: v for k, v in out.items() if k not in ("__module__", "__class__")}


def _node(r: Reader, node: Any, where: str, split: str) -> tuple[str, list[_Leaf]]:
    """``(mode, leaves)`` of a split entry: ``"mix"`` (weights) or ``"samples"``."""
    if not isinstance(node, Mapping):
        raise r.fail(where, f"expected blend:, blend_epochized: or a dataset path:, got "
                     f"{type(node).__name__}")
    at = f"{where}." if where else ""
    _refuse_join(r, node, where)
    kinds = [k for k in ("blend", "blend_epochized", "datasets") if k in node]
    if len(kinds) > 1:
        raise r.fail(where, f"give one of blend, blend_epochized, not both ({', '.join(kinds)})")
    if not kinds:
        return "mix", _reference(r, node, where, split, "", {})
    kind = kinds[0]
    extra = [k for k in node if k != kind]
    for key in extra:
        if key == "subset":
            _refuse_subset(r, f"{at}subset")
        raise r.fail(f"{at}{key}", f"unknown key {key!r} beside {kind} (known: {kind}, subset)")
    entries = node[kind]
    if not isinstance(entries, list) or not entries:
        raise r.fail(f"{at}{kind}", "expected a list of datasets (each with a path:)")
    if kind == "blend_epochized":
        leaves: list[_Leaf] = []
        for i, entry in enumerate(entries):
            leaves += _reference(r, entry, f"{at}{kind}[{i}]", split, "repetitions", {})
        return "samples", leaves
    weighted = [(*_weight(r, e, f"{at}{kind}[{i}]"), f"{at}{kind}[{i}]", e)
                for i, e in enumerate(entries)]
    scheduled = any(schedule is not None for _, schedule, _, _ in weighted)
    # a blend's weights are relative: normalised, so that a nested blend's leaves share its
    # weight; with a schedule (read in the outermost blend only) the total changes over time
    total = 1.0 if scheduled else sum(w for w, _, _, _ in weighted)
    if total <= 0:
        raise r.fail(f"{at}{kind}", "all weights are zero: give one dataset a weight > 0")
    leaves = []
    for w, schedule, path, entry in weighted:
        if schedule is not None and r.nested:
            raise r.fail(f"{path}.weight", "a weight schedule in a nested metadataset: give "
                         "it in the outermost blend (the one the spec names)")
        for leaf in _reference(r, entry, path, split, "weight", {}):
            factor = leaf.weight
            leaf.weight *= w / total
            if schedule is not None:
                leaf.schedule = schedule.scaled(factor)
            leaves.append(leaf)
    return "mix", leaves


def _weight(r: Reader, entry: Any, path: str) -> tuple[float, WeightSchedule | None]:
    value = entry.get("weight", 1.0) if isinstance(entry, Mapping) else 1.0
    return r.weight(value, f"{path}.weight")


def _refuse_join(r: Reader, node: Any, where: str) -> None:
    """Energon's ``join``/``joiner`` (a split's, or a blend entry's): refused by name."""
    if isinstance(node, Mapping) and ("join" in node or "joiner" in node):
        at = f"{where}." if where else ""
        raise r.fail(f"{at}join", "joining datasets (Energon's join/joiner) is not supported "
                     "here: list the datasets in a blend, or join their samples in .map()")


def _refuse_subset(r: Reader, path: str) -> None:
    raise r.fail(path, "Energon's subset ranges are not supported here yet: remove it to read "
                 "the whole dataset, or list the shards to read in the prepared dataset's "
                 ".nv-meta/split.yaml")


def _reference(r: Reader, entry: Any, path: str, split: str, scale_key: str,
               inherited: dict[str, Any]) -> list[_Leaf]:
    """The leaves of one dataset reference (a nested metadataset gives several)."""
    known = (*_REFERENCE, *_LOADING, *((scale_key,) if scale_key else ()))
    _refuse_join(r, entry, path)
    d, _ = r.mapping(entry, path, known)
    for key in _LOADING:
        if key in d:
            r.not_used(f"{path}.{key}", _LOADING_WHY)
    for key, why in _UNUSED.items():
        if key in d and not (key == "shuffle_over_epochs_multiplier" and d[key] == 1):
            r.not_used(f"{path}.{key}", why)
    if "subset" in d:
        _refuse_subset(r, f"{path}.subset")
    if "path" not in d:
        raise r.fail(path, "no 'path': name an Energon-prepared dataset directory, a directory "
                     "of shards, or another metadataset .yaml")
    subflavors = _subflavors(r, d, path)
    merged = {**subflavors, **inherited}  # the outer metadataset's subflavors win
    part = r.text(d["split_part"], f"{path}.split_part") if "split_part" in d else split
    scale = (r.number(d[scale_key], f"{path}.{scale_key}", f"{scale_key} >= 0")
             if scale_key == "repetitions" and scale_key in d else 1.0)
    location = r.location(d["path"], f"{path}.path")
    if location.endswith(".jsonl"):
        raise r.fail(f"{path}.path", f"{location}: Energon's JSONL datasets (a .jsonl file "
                     "with its .idx) are not supported here: name an Energon-prepared dataset "
                     "of tar shards, a directory of shards, or another metadataset .yaml")
    if location.endswith((".yaml", ".yml", ".json")):
        return _nested(r, location, path, part, scale_key, scale, merged)
    split_config = (r.text(d["split_config"], f"{path}.split_config")
                    if "split_config" in d else None)
    return [_Leaf(path=location, split_part=part, key=path, repetitions=scale,
                  subflavors=merged, split_config=split_config)]


def _subflavors(r: Reader, d: Mapping[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "subflavor" in d:  # Energon's legacy single subflavor
        out["__subflavor__"] = d["subflavor"]
    if "subflavors" in d and d["subflavors"] is not None:
        if not isinstance(d["subflavors"], Mapping):
            raise r.fail(f"{path}.subflavors", "expected a mapping of name to value, e.g. "
                         "{augmentation_type: small_images}")
        out.update({str(k): v for k, v in d["subflavors"].items()})
    return out


def _nested(r: Reader, location: str, path: str, split: str, scale_key: str, scale: float,
            subflavors: dict[str, Any]) -> list[_Leaf]:
    """The leaves of the metadataset file at ``location`` (its ``split`` split)."""
    from .files import read_document

    doc = read_document(location, r.environ(), r.open_stream)
    inner = Reader(doc.origin, r.environ(), r.allow_pipe,
                   base=os.path.dirname(doc.path) or ".", strict=r.strict,
                   open_stream=r.open_stream)
    inner.unused = r.unused
    inner.nested = True
    top = _top(inner, doc.data)
    if "splits" in top:
        splits = top["splits"]
        if not isinstance(splits, Mapping) or split not in splits:
            have = ", ".join(map(str, splits)) if isinstance(splits, Mapping) else "none"
            raise r.fail(f"{path}.split_part", f"{doc.origin} has no split {split!r} (its "
                         f"splits: {have})")
        node, where = splits[split], f"splits.{split}"
    else:
        node, where = top, ""
    mode, leaves = _node(inner, node, where, split)
    if scale_key == "repetitions" and mode == "mix" and "blend" in node:
        raise r.fail(path, f"{doc.origin} blends by weight (blend:); a blend_epochized entry "
                     "needs repetitions (blend_epochized:) all the way down")
    if scale_key == "weight" and mode == "samples":
        raise r.fail(path, f"{doc.origin} blends by repetitions (blend_epochized:); a blend "
                     "entry needs weights (blend:) all the way down")
    for leaf in leaves:
        leaf.key = f"{path} -> {doc.origin}: {leaf.key}"
        leaf.repetitions *= scale
        leaf.subflavors = {**leaf.subflavors, **subflavors}
    return leaves


def _source(r: Reader, leaf: _Leaf, mode: str, training: bool) -> SourceSpec:
    return SourceSpec(
        name="", pattern=leaf.path, urls=(leaf.path,),
        weight=leaf.weight if mode == "mix" else 1.0,
        repeat=(leaf.repetitions if training else 1.0) if mode == "samples" else None,
        subflavors=leaf.subflavors, split_part=leaf.split_part,
        split_config=leaf.split_config, key=leaf.key,
        schedule=leaf.schedule if mode == "mix" else None)
