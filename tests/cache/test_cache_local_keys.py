"""Local paths in the shard cache (``cache_local``) are keyed by the file they name: its
absolute, resolved path, so the same relative path read from two working directories is two
entries, and a ``file:`` URL, an absolute path and a symlinked directory naming one file share
one entry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cachetools import make_shard, sample_digest, settled

import wds_cloud as wds
from wds_cloud.cache import ShardCache

KiB = 2**10
SHARD = "shards/train-000000.tar"


def _seed(root: Path, prefix: str) -> list[str]:
    """``root/shards/train-000000.tar`` with samples named after ``prefix``; their keys."""
    data, keys = make_shard(prefix, 3, 4 * KiB)
    (root / "shards").mkdir(parents=True)
    (root / SHARD).write_bytes(data)
    return keys


def _read(url: str, cache: Path) -> list[dict[str, Any]]:
    samples = list(wds.WebDataset(url, shardshuffle=False, cache_dir=str(cache),
                                  cache_local=True))
    assert all(ok for _, ok in map(sample_digest, samples))
    return samples


def _keys(samples: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in samples]


def test_one_relative_path_in_two_directories_is_two_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = _seed(tmp_path / "a", "first"), _seed(tmp_path / "b", "second")
    cache = tmp_path / "cache"
    monkeypatch.chdir(tmp_path / "a")
    assert _keys(_read(SHARD, cache)) == first
    assert len(settled(cache)) == 1
    monkeypatch.chdir(tmp_path / "b")
    got = _read(SHARD, cache)
    assert _keys(got) == second  # was: the first directory's samples, from its cache entry
    assert len(settled(cache)) == 2
    # a hit now: the same samples again, from the second directory's entry
    got = _read(SHARD, cache)
    assert _keys(got) == second
    assert {s["__local_path__"] for s in got} < {str(cache / "data" / n) for n in settled(cache)}
    monkeypatch.chdir(tmp_path / "a")
    assert _keys(_read(SHARD, cache)) == first
    assert len(settled(cache)) == 2


def test_file_urls_absolute_paths_and_symlinks_name_one_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = _seed(tmp_path / "a", "only")
    os.symlink(tmp_path / "a", tmp_path / "link")
    cache = tmp_path / "cache"
    monkeypatch.chdir(tmp_path / "a")
    spellings = [SHARD, f"file:{SHARD}", str(tmp_path / "a" / SHARD),
                 f"file://{tmp_path / 'a' / SHARD}", str(tmp_path / "link" / SHARD),
                 f"./shards/../{SHARD}"]
    for url in spellings:
        assert _keys(_read(url, cache)) == keys, url
        assert len(settled(cache)) == 1, url
    monkeypatch.chdir(tmp_path / "link")
    assert _keys(_read(SHARD, cache)) == keys
    assert len(settled(cache)) == 1


def test_the_cache_keys_a_local_path_by_its_resolved_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ShardCache.open`` itself (as :func:`wds_cloud.gopen` uses it): one cache object, two
    working directories, the bytes of the file each names."""
    _seed(tmp_path / "a", "first")
    _seed(tmp_path / "b", "second")
    cache = ShardCache(tmp_path / "cache", cache_local=True)
    for where in ("a", "b", "a", "b"):
        monkeypatch.chdir(tmp_path / where)
        with cache.open(SHARD, lambda: open(SHARD, "rb")) as f:
            assert f.read() == (tmp_path / where / SHARD).read_bytes(), where
        settled(tmp_path / "cache")
    assert len(settled(tmp_path / "cache")) == 2
    assert cache.wants(SHARD) and not cache.wants(f"file:{tmp_path / 'cache' / 'data' / 'x'}")
