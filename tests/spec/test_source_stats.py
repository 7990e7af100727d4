"""The shares a job really saw: per spec source, samples, shards opened, GETs, bytes, cache hits
and retries, summed over a WebLoader's two workers, on the local S3 server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from shardgen import put_source
from stores.base import Store

import wds_cloud as wds

BATCHES, BATCH = 80, 100  # per epoch: 8,000 samples


def _members(name: str, shard: int, i: int) -> dict[str, bytes]:
    return {"txt": f"{name} {shard} {i}".encode() * 4}


@pytest.fixture
def spec_file(store_factory: Callable[[str], Store], tmp_path: Path) -> Path:
    s3 = store_factory("s3")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"seed": 5, "storage_options": s3.storage_options,
                                    "datasets": [
        {"name": "big", "weight": 0.7,
         "shards": put_source(s3, tmp_path, "stats", "big", 6, 200, _members)},
        {"name": "small", "weight": 0.3,
         "shards": put_source(s3, tmp_path, "stats", "small", 4, 200, _members)},
    ]}))
    return path


def test_per_source_stats_add_up_over_two_workers(spec_file: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    dataset = (wds.WebDataset(str(spec_file)).to_tuple("__source__")
               .batched(BATCH, collation_fn=list).with_epoch(nbatches=BATCHES))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2, stats_every=40)
    with caplog.at_level(logging.INFO, logger="wds_cloud.stats"):
        yielded = [source for batch in loader for (source,) in batch]
    assert len(yielded) == BATCHES * BATCH
    stats = loader.stats()
    sources = stats["sources"]
    assert sum(s["samples"] for s in sources.values()) == len(yielded) == stats["samples"]
    for name, s in sources.items():
        assert s["samples"] == yielded.count(name)
        assert abs(s["share"] - s["configured"]) < 0.02, (name, s)
        assert s["shards"] >= 2 and s["requests"] == s["shards"]  # one GET per shard
        assert s["bytes_read"] > 0 and s["retries"] == s["cache_hits"] == 0
    assert sources["big"]["configured"] == pytest.approx(0.7)
    io = loader.io_stats()
    assert sum(s["requests"] for s in sources.values()) == io["requests"] == stats["io"]["requests"]
    assert sum(s["bytes_read"] for s in sources.values()) == io["bytes_read"]
    lines = [r.getMessage() for r in caplog.records if r.name == "wds_cloud.stats"]
    assert len(lines) == 2 and lines[0].startswith("sources after ")
    assert "big " in lines[-1] and "(configured 70.0%)" in lines[-1]


def test_cache_hits_count_for_their_source(spec_file: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")

    def epoch() -> dict[str, dict[str, int]]:
        dataset = (wds.WebDataset(str(spec_file), cache_dir=cache)
                   .batched(50, collation_fn=list).with_epoch(nbatches=20))
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
        assert sum(len(batch) for batch in loader) == 1000
        sources: dict[str, dict[str, int]] = loader.stats()["sources"]
        return sources

    for name, s in epoch().items():  # a worker may read along the other's download
        assert s["requests"] > 0 and s["requests"] + s["cache_hits"] == s["shards"], (name, s)
    spec = yaml.safe_load(spec_file.read_text())
    for source in spec["datasets"]:  # every shard whole in the cache
        whole = wds.WebDataset(source["shards"], shardshuffle=False, cache_dir=cache,
                               storage_options=spec["storage_options"])
        assert sum(1 for _ in whole) > 0
    wds.cache.wait_downloads()
    for name, s in epoch().items():  # the same shards again: from the cache, no GET
        assert s["requests"] == 0 and s["cache_hits"] == s["shards"] > 0, (name, s)
