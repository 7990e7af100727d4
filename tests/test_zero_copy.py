"""``WebDataset(zero_copy=True)``: members of local and cached shards as views of the file,
the same bytes as the default; decoding, DataLoader workers and remote shards get ``bytes``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from shardgen import write_tar
from stores.base import Store

import wds_cloud as wds


def _shards(root: Path) -> list[str]:
    paths = []
    for s in range(3):
        samples = [(f"s{s}-{i:03d}", {"tokens": np.arange(i, i + 1000, dtype=np.uint16).tobytes(),
                                       "json": json.dumps({"i": i}).encode(),
                                       "jpg": bytes([i % 251]) * (70_000 + i)})
                   for i in range(12)]
        paths.append(write_tar(root / f"shard-{s}.tar", samples))
    return paths


def _fields(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with views as bytes (and without a cached shard's ``__local_path__``)."""
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()
            if k != "__local_path__"}


def test_views_of_local_shards_hold_the_same_bytes(tmp_path: Path) -> None:
    paths = _shards(tmp_path)
    plain = list(wds.WebDataset(paths, shardshuffle=False))
    views = list(wds.WebDataset(paths, shardshuffle=False, zero_copy=True))
    assert len(views) == len(plain) == 36
    assert {type(s["tokens"]) for s in views} == {type(s["jpg"]) for s in views} == {memoryview}
    assert [_fields(s) for s in views] == [_fields(s) for s in plain]
    tokens = np.frombuffer(views[5]["tokens"], dtype=np.uint16)  # no copy: a view of the map
    assert tokens[0] == 5 and not tokens.flags.owndata
    # decoding hands its handlers bytes: the same decoded samples as the default
    decoded = list(wds.WebDataset(paths, shardshuffle=False, zero_copy=True).decode())
    assert decoded == list(wds.WebDataset(paths, shardshuffle=False).decode())
    assert decoded[3]["json"] == {"i": 3}


def test_webloader_workers_send_bytes(tmp_path: Path) -> None:
    paths = _shards(tmp_path)
    dataset = wds.WebDataset(paths, shardshuffle=False, zero_copy=True).to_tuple("__key__",
                                                                                   "jpg")
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    got = sorted(tuple(item) for item in loader)
    assert {type(jpg) for _, jpg in got} == {bytes}
    want = sorted((s["__key__"], s["jpg"]) for s in wds.WebDataset(paths, shardshuffle=False))
    assert got == want


def test_cached_shards_are_views_remote_ones_bytes(
        tmp_path: Path, store_factory: Callable[[str], Store]) -> None:
    s3 = store_factory("s3")
    for path in _shards(tmp_path):
        s3.put(Path(path).name, Path(path).read_bytes())
    url = s3.url("shard-{0..2}.tar")
    expected = list(wds.WebDataset(url, shardshuffle=False,
                                   storage_options=s3.storage_options))
    remote = list(wds.WebDataset(url, shardshuffle=False, zero_copy=True,
                                 storage_options=s3.storage_options))
    assert {type(s["jpg"]) for s in remote} == {bytes} and remote == expected
    cached = wds.WebDataset(url, shardshuffle=False, zero_copy=True, cache_dir=tmp_path / "c",
                            storage_options=s3.storage_options)
    first = list(cached)  # filled while read: a file still being written is read as a stream
    again = list(cached)  # from the cache's files
    assert [_fields(s) for s in first] == [_fields(s) for s in again] == \
        [_fields(s) for s in expected]
    assert again[0]["__local_path__"].startswith(str(tmp_path / "c"))
    assert {type(s["jpg"]) for s in again} == {memoryview}
