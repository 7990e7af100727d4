"""Mosaic streaming's and llm-foundry's ``streams:``, with Mosaic's meanings, read into the one
schema (mode ``"samples"``: each stream gives a count of samples per epoch).

``streams:`` is a mapping of name to stream, or a list; a dataset section with ``remote``/``local``
and no ``streams`` is one stream. A stream's ``remote`` is where its shards are (a prefix,
directory, glob or brace pattern; ``split`` is a subdirectory of it), ``local`` the shard cache
directory for that stream (where the shards are when there is no ``remote``); relative paths
are taken from the working directory, as Mosaic takes them.

Per stream at most one of ``proportion`` (relative: a share of ``epoch_size``, default the total
samples), ``repeat`` (a multiplier of the stream's samples per epoch) or ``choose`` (samples per
epoch, never shards); proportions and ``repeat``/``choose`` do not mix (Mosaic's rule). With
none of them every sample is read once per epoch, or with ``epoch_size`` streams share it by
size. ``shuffle``, ``shuffle_seed``, ``cache_limit``, ``download_retry`` and
``download_timeout`` map onto our shuffle, seed, cache bound, retries and timeout, with Mosaic's
defaults (``shuffle: false``; ``shuffle_seed: 9176``, below ``WDS_SEED`` and ``seed=``); the keys of
Mosaic's own partitioning and of llm-foundry's tokenization are noted as not used here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..settings import parse_size
from .reader import Reader, finish
from .schema import DatasetSpec, SourceSpec, expand_braces, refuse_pipe

__all__ = ["parse_mosaic"]

#: ``StreamingDataset``'s default ``shuffle_seed``: a run is repeatable unless a seed is given
MOSAIC_SEED = 9176

_STREAM = ("remote", "local", "split", "proportion", "repeat", "choose", "download_retry",
           "download_timeout", "validate_hash", "keep_zip")
_MAPPED = ("streams", "remote", "local", "split", "epoch_size", "shuffle", "shuffle_seed",
           "cache_limit", "download_retry", "download_timeout")
_UNUSED = {
    "predownload": "Mosaic's samples fetched ahead; here read-ahead counts shards "
                   "(WDS_READAHEAD)",
    "batch_size": "batch in the pipeline (.batched(n)) or the DataLoader",
    "partition_algo": "Mosaic's sample partitioning; here shards and samples are dealt to "
                      "ranks x workers by the seed",
    "num_canonical_nodes": "Mosaic's canonical nodes; here the stream is dealt to ranks x "
                           "workers by the seed",
    "shuffle_algo": "Mosaic's shuffle algorithm; here shards are permuted per epoch and "
                    ".shuffle(n) shuffles samples",
    "shuffle_block_size": "Mosaic's shuffle blocks; use .shuffle(n) for a sample buffer",
    "sampling_method": "Mosaic's balanced/fixed sampling; here epochs draw by the seed",
    "sampling_granularity": "Mosaic's sampling granularity",
    "batching_method": "Mosaic's per-batch stream composition; here streams mix per sample",
    "replication": "Mosaic's sample replication across ranks",
    "allow_unsafe_types": "MDS column types; tar members are bytes until decoded",
    "validate_hash": "MDS shard hashes; tar shards are checked by their headers and the "
                     "cache's own record",
    "keep_zip": "MDS compressed shards",
}
#: llm-foundry's dataset keys (tokenization, packing): meaningless for raw tar members
_FOUNDRY = ("max_seq_len", "decoder_only_format", "eos_token_id", "bos_token_id", "hf_name",
            "hf_kwargs", "preprocessing_fn", "packing_ratio", "max_leftover_bins_to_keep",
            "target_responses", "target_prompts", "allow_pad_trimming", "token_encoding_type",
            "tokenizer", "name", "seq_len")
_FOUNDRY_WHY = ("llm-foundry's tokenization and packing; here samples are dicts of tar "
                "members (tokenize in .map())")
_ABBREV = re.compile(r"^\s*([0-9.]+)\s*([kmbt]?)\s*$", re.IGNORECASE)


def parse_mosaic(r: Reader, data: Any) -> DatasetSpec:
    """The spec of a Mosaic / llm-foundry dataset section."""
    r.base = None  # Mosaic opens relative paths from the working directory, not the file's
    known = (*_MAPPED, *_UNUSED, *_FOUNDRY)
    top, _ = r.mapping(data, "", known)
    for key in top:
        if key in _UNUSED:
            r.not_used(key, _UNUSED[key])
        elif key in _FOUNDRY:
            r.not_used(key, _FOUNDRY_WHY)
    default_split = top.get("split")
    if "streams" in top:
        for key in ("remote", "local"):
            if top.get(key) is not None:
                r.not_used(key, "the streams give their own; StreamingDataset reads this "
                           "only without streams")
        entries = _entries(r, top["streams"])
    else:
        entries = [("", "", {k: top[k] for k in ("remote", "local") if k in top})]
    read = [_stream(r, path, name, d, default_split) for path, name, d in entries]
    sources = [source for source, _ in read]
    epoch_size = _epoch_size(r, top.get("epoch_size"))
    shares = _check_weights(r, read, epoch_size)
    settings: dict[str, Any] = {}
    if top.get("download_retry") is not None:
        settings["retries"] = r.integer(top["download_retry"], "download_retry",
                                        "a number of retries >= 0")
    if top.get("download_timeout") is not None:
        settings["timeout"] = r.number(top["download_timeout"], "download_timeout",
                                       "seconds > 0")
    if top.get("cache_limit") is not None:
        settings["cache_size"] = _bytes(r, top["cache_limit"], "cache_limit")
    seed = top.get("shuffle_seed")
    shuffle = top.get("shuffle")
    return finish(r, sources, seed=MOSAIC_SEED if seed is None else r.seed(seed, "shuffle_seed"),
                  mode="samples", dialect="mosaic", epoch_size=epoch_size,
                  shuffle=False if shuffle is None else r.flag(shuffle, "shuffle"),
                  settings=settings, shares=shares)


def _entries(r: Reader, value: Any) -> list[tuple[str, str, Any]]:
    if isinstance(value, Mapping):
        entries = [(f"streams.{name}", str(name), entry) for name, entry in value.items()]
    elif isinstance(value, list):
        entries = [(f"streams[{i}]", "", entry) for i, entry in enumerate(value)]
    else:
        raise r.fail("streams", f"expected a mapping of name to stream, or a list, got "
                     f"{type(value).__name__}")
    if not entries:
        raise r.fail("streams", "no streams: give at least one (remote: and/or local:)")
    return entries


def _stream(r: Reader, path: str, name: str, entry: Any,
            default_split: Any) -> tuple[SourceSpec, str]:
    """The stream's source, and which of proportion/repeat/choose it gave ("" for none)."""
    d, _ = r.mapping(entry, path, _STREAM)
    at = f"{path}." if path else ""
    for key in ("validate_hash", "keep_zip"):
        if d.get(key) is not None:
            r.not_used(f"{at}{key}", _UNUSED[key])
    for key in ("download_retry", "download_timeout"):
        if d.get(key) is not None:
            r.not_used(f"{at}{key}", "retries and timeouts are per dataset here: give it at "
                       "the top level of the dataset section")
    given = [k for k in ("proportion", "repeat", "choose") if d.get(k) is not None]
    if len(given) > 1:
        raise r.fail(path or "streams", f"give at most one of proportion, repeat, choose "
                     f"(Mosaic's rule), got {' and '.join(given)}")
    remote = d.get("remote")
    local = d.get("local")
    if remote in (None, "") and local in (None, ""):
        raise r.fail(path or "remote", "no 'remote' or 'local': give where the shards are "
                     "(remote: a bucket prefix, directory, glob or brace pattern)")
    split = d.get("split", default_split)
    split = r.text(split, f"{at}split") if split not in (None, "") else ""
    where = r.location(remote if remote not in (None, "") else local,
                       f"{at}{'remote' if remote not in (None, '') else 'local'}")
    cache_dir = (r.location(local, f"{at}local")
                 if remote not in (None, "") and local not in (None, "") else None)
    urls = expand_braces(where)
    refuse_pipe(urls, f"{r.origin}: {at}remote", r.allow_pipe)
    source = SourceSpec(name=name, pattern=where, urls=tuple(urls), key=path or "remote",
                        cache_dir=cache_dir)
    if split:
        if not source.is_directory:
            raise r.fail(f"{at}split", f"{split!r} is a subdirectory of the remote, but "
                         f"{where!r} is a pattern, not a directory")
        joined = where.rstrip("/") + "/" + split
        source = SourceSpec(name=name, pattern=joined, urls=(joined,), key=source.key,
                            cache_dir=os.path.join(cache_dir, split) if cache_dir else None)
    if "proportion" in given:
        if isinstance(d["proportion"], Mapping):  # a schedule: counts per epoch cannot follow
            raise r.fail(f"{at}proportion", "a weight schedule needs a mix by weight; Mosaic's "
                         "proportions count each stream's samples per epoch (put the streams "
                         "in a webdataset or Energon spec to schedule their weights)")
        return replace(source, weight=r.number(d["proportion"], f"{at}proportion",
                                               "a proportion >= 0")), "proportion"
    if "repeat" in given:
        return replace(source, repeat=r.number(d["repeat"], f"{at}repeat",
                                               "a multiplier >= 0")), "repeat"
    if "choose" in given:
        return replace(source, samples=r.integer(d["choose"], f"{at}choose",
                                                 "a number of samples >= 0")), "choose"
    return source, ""


def _check_weights(r: Reader, read: list[tuple[SourceSpec, str]],
                   epoch_size: int | None) -> str:
    """Mosaic's rule (proportions, or repeat/choose/none, never both); how the epoch's samples
    are counted (:attr:`DatasetSpec.shares`)."""
    relative = [s for s, kind in read if kind == "proportion"]
    others = [(s, kind) for s, kind in read if kind != "proportion"]
    if relative and others:
        other, kind = others[0]
        gave = f"gives {kind}" if kind else "gives none"
        raise r.fail(other.key, f"{relative[0].key} gives a proportion and {other.key} {gave} "
                     "(Mosaic's rule: a spec uses proportions (relative) or repeat/choose "
                     "(absolute), not both): give every stream a proportion, or none")
    if relative and sum(s.weight for s in relative) <= 0:
        raise r.fail("streams", "all proportions are zero: give one stream a proportion > 0")
    absolute = [s for s, kind in others if kind]
    if absolute and epoch_size is not None:
        raise r.fail("epoch_size", "epoch_size goes with proportions (relative weights), not "
                     f"with repeat/choose (as in {absolute[0].key}; Mosaic's rule)")
    if relative:
        return "proportion"
    return "size" if not absolute and epoch_size is not None else "counts"


def _epoch_size(r: Reader, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        match = _ABBREV.match(value)
        if not match:
            raise r.fail("epoch_size", f"expected a number of samples (e.g. 100000 or '100k'),"
                         f" got {value!r}")
        scale = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
        value = int(float(match.group(1)) * scale[match.group(2).lower()])
    return r.integer(value, "epoch_size", "a number of samples >= 1", 1)


def _bytes(r: Reader, value: Any, path: str) -> int:
    try:
        return parse_size(value, name=path)
    except ValueError as exc:
        raise r.fail(path, f"expected a size (bytes, or e.g. '10gb'), got {value!r}") from exc
