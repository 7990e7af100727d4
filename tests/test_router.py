"""One router per dataset and process: rules parsed and the cache made once, not per shard."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud import router as router_module
from wds_cloud.cache import ShardCache


def _shards(root: Path, n: int = 10) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(n):
        write_tar(root / f"r-{s:03d}.tar", [(f"k{s:03d}_{i}", {"txt": b"x" * i}) for i in range(3)])
    return str(root / f"r-{{000..{n - 1:03d}}}.tar")


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_rules_and_cache_are_built_once_per_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "data"
    pattern = _shards(data)
    monkeypatch.setenv("WDS_REWRITE", f"gs://bucket/={data}/")  # every shard is rewritten
    parsed = _counting(monkeypatch, router_module, "parse_rewrite_rules")
    caches = _counting(monkeypatch, ShardCache, "from_settings")
    ds = wds.WebDataset(pattern.replace(str(data) + "/", "gs://bucket/"), shardshuffle=False,
                        cache_dir=str(tmp_path / "cache"), cache_local=True)
    for _ in range(2):
        assert len(list(ds)) == 30
    assert (len(parsed), len(caches)) == (1, 1)
    assert len(list((tmp_path / "cache" / "data").iterdir())) == 10


def test_the_router_is_not_pickled_and_is_rebuilt_in_a_copy(tmp_path: Path) -> None:
    ds = wds.WebDataset(_shards(tmp_path / "data", 2), shardshuffle=False)
    assert len(list(ds)) == 6  # the router now exists in this process
    state = pickle.dumps(ds)
    assert b"Router" not in state
    copy = pickle.loads(state)
    assert len(list(copy)) == 6

