"""One router per dataset and process: rules parsed and the cache made once, not per shard."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud import router as router_module
from wds_cloud.cache import ShardCache
from wds_cloud.settings import Settings


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



def test_only_urls_a_round_trip_away_are_opened_ahead(
    tmp_path: Path, nginx_server: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read-ahead opens shards whose first byte is a round trip away; local files, stdin and
    published cache entries are served by the page cache and are opened when their turn
    comes (no thread, no memory held before)."""
    store = nginx_server.new_store()
    shard = write_tar(tmp_path / "a.tar", [("k", {"txt": b"text"})])
    store.put("a.tar", Path(shard).read_bytes())
    remote = store.url("a.tar")
    monkeypatch.setenv("WDS_REWRITE", f"gs://mirror/={tmp_path}/")
    settings = router_module.with_cache(Settings.from_env(), str(tmp_path / "cache"), None)
    router = router_module.Router(settings)
    local = str(tmp_path / "x.tar")
    assert not router.costs_round_trip(local)
    assert not router.costs_round_trip(f"file://{local}")
    assert not router.costs_round_trip("-")
    assert not router.costs_round_trip("gs://mirror/x.tar")  # rewritten onto a local path
    assert router.costs_round_trip("pipe:cat x.tar")
    assert router.costs_round_trip("s3://bucket/x.tar")
    assert router.costs_round_trip(remote)  # not cached yet
    with router.open(remote) as stream:
        stream.read()
    assert not router.costs_round_trip(remote)  # published in the cache now


def test_local_shards_are_read_without_readahead_threads(tmp_path: Path) -> None:
    ds = wds.WebDataset(_shards(tmp_path / "data", 4), shardshuffle=False)
    names = set()
    for _ in ds:
        names |= {t.name for t in threading.enumerate()}
    assert not any(name.startswith("wds-readahead") for name in names)
