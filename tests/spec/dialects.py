"""Datasets and spec files written the way Megatron-Energon's and Mosaic's users write them,
for the dialect tests: an Energon-prepared dataset (``.nv-meta/`` as ``energon prepare``
writes it: ``.info.json`` with ``shard_counts``, ``split.yaml`` with ``split_parts`` and
``exclude``, ``dataset.yaml`` with ``sample_type``/``field_map``), on a local directory or a
bucket of the test servers; shards of samples on a store; and readers that take what the
slots of R ranks x W DataLoader workers yield."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

import wds_cloud as wds
from wds_cloud.testing.contract import tar_bytes


def shard_bytes(samples: Iterable[tuple[str, Mapping[str, bytes]]]) -> bytes:
    """A tar shard of ``(key, {extension: data})`` samples."""
    return tar_bytes(list(samples))


def put_shards(put: Any, folder: str, name: str, shards: int, per_shard: int) -> list[str]:
    """``shards`` shards of ``per_shard`` samples (keys ``<name>-<shard>-<i>``, a ``txt``
    member) put with ``put(key, data)`` as ``folder/parts/data-<n>.tar``; their names."""
    names = []
    for s in range(shards):
        key = f"parts/data-{s}.tar"
        samples = [(f"{name}-{s:02d}-{i:04d}", {"txt": f"{name} {s} {i}".encode()})
                   for i in range(per_shard)]
        put(f"{folder}/{key}" if folder else key, shard_bytes(samples))
        names.append(key)
    return names


def prepare(put: Any, folder: str, name: str, *, shards: int, per_shard: int,
            splits: Mapping[str, list[str]] | None = None,
            exclude: list[str] | None = None) -> dict[str, list[str]]:
    """An Energon-prepared dataset under ``folder`` (``put(key, data)`` writes a file): by
    default the first 80% of its shards are ``train``, the rest ``val``; its split parts."""
    names = put_shards(put, folder, name, shards, per_shard)
    k = max(1, len(names) * 8 // 10)
    parts = dict(splits) if splits is not None else {"train": names[:k],
                                                     "val": names[k:] or names[:1]}
    meta = f"{folder}/.nv-meta" if folder else ".nv-meta"
    info = {"energon_version": "7.1.0", "shard_counts": {n: per_shard for n in names}}
    put(f"{meta}/.info.json", json.dumps(info, indent=2).encode())
    split = {"exclude": exclude or [], "split_parts": parts}
    put(f"{meta}/split.yaml", yaml.dump(split, sort_keys=False).encode())
    dataset = {"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
               "field_map": {"text": "txt"}}
    put(f"{meta}/dataset.yaml", yaml.dump(dataset, sort_keys=False).encode())
    return parts


def local_put(root: Path) -> Any:
    """``put(key, data)`` writing files under ``root``."""
    def put(key: str, data: bytes) -> None:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return put


def slots_read(make: Any, monkeypatch: pytest.MonkeyPatch, *, ranks: int, workers: int,
               limit: int | None = None, epochs: int = 1) -> list[list[dict[str, Any]]]:
    """What each rank read of ``make()`` (a fresh dataset per rank, as each rank's process
    builds its own, with ``RANK``/``WORLD_SIZE`` as torchrun sets them), through a
    ``WebLoader`` with ``workers`` workers: ``out[epoch * ranks + rank]``; ``limit``: samples
    per rank and epoch (an endless mix)."""
    import itertools

    out: list[list[dict[str, Any]]] = [[] for _ in range(epochs * ranks)]
    for rank in range(ranks):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(ranks))
        loader = wds.WebLoader(make(), batch_size=None, num_workers=workers)
        for epoch in range(epochs):
            samples = iter(loader)
            got = list(itertools.islice(samples, limit) if limit is not None else samples)
            out[epoch * ranks + rank] = [{k: v for k, v in s.items() if k.startswith("__")}
                                         for s in got]
    return out
