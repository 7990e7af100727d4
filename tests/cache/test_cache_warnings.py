"""The shard cache's warnings (logger ``wds_cloud.cache``): a shard larger than the whole cache
is named once per run, not once per DataLoader worker and epoch (workers are new processes
each epoch), and each such shard is named; a new run names them again."""

from __future__ import annotations

import logging
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cachetools import make_shard, sample_digest, settled
from zygote import Zygote

import wds_cloud as wds

KiB = 2**10
LIMIT = 8 * KiB  # smaller than any shard below


def _shards(root: Path, count: int) -> tuple[list[str], list[str]]:
    urls, keys = [], []
    root.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        data, names = make_shard(f"big{k}", 4, 16 * KiB)
        (root / f"big-{k}.tar").write_bytes(data)
        urls.append(str(root / f"big-{k}.tar"))
        keys += names
    return urls, keys


def _read(urls: list[str], cache: Path) -> list[dict[str, Any]]:
    samples = list(wds.WebDataset(urls, shardshuffle=False, cache_dir=str(cache),
                                  cache_size=LIMIT, cache_local=True))
    assert all(ok for _, ok in map(sample_digest, samples))
    return samples


def _too_big(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == logging.WARNING
            and r.name == "wds_cloud.cache" and "larger than the whole cache" in r.getMessage()]


def test_each_shard_too_big_for_the_cache_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    urls, keys = _shards(tmp_path / "shards", 3)
    cache = tmp_path / "cache"
    caplog.set_level(logging.DEBUG, logger="wds_cloud.cache")
    for _ in range(3):  # three epochs in one process
        assert [s["__key__"] for s in _read(urls, cache)] == keys
    warnings = _too_big(caplog.records)
    assert len(warnings) == 3, warnings
    assert sorted(w.split(" (", 1)[0] for w in warnings) == urls  # read ahead: any order
    for warning in warnings:
        assert str(cache) in warning and "cache_size" in warning  # where, and how to fix it
    assert settled(cache) == []
    # later epochs still say so, at the cache's own level
    skips = [r for r in caplog.records if r.levelno == logging.DEBUG
             and "larger than the whole cache" in r.getMessage()]
    assert len(skips) == 6


_RUN = textwrap.dedent("""
    import logging, sys
    import torch
    import wds_cloud as wds
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    urls, cache, limit = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    ds = wds.WebDataset(urls, shardshuffle=False, cache_dir=cache, cache_size=limit,
                        cache_local=True)
    loader = torch.utils.data.DataLoader(ds, num_workers=2, batch_size=None)
    for epoch in range(3):
        print(epoch, sum(1 for _ in loader), flush=True)
""")


def _run(zygote: Zygote, urls: list[str], cache: Path) -> list[str]:
    """One training run (3 epochs, 2 workers) in its own process (forked from the zygote): its
    warning lines."""
    done = zygote.run([sys.executable, "-c", _RUN, ",".join(urls), str(cache), str(LIMIT)],
                      capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "16", "1", "16", "2", "16"]
    return [line for line in done.stderr.splitlines() if line.startswith("WARNING")]


def test_dataloader_workers_name_each_shard_once_per_run(tmp_path: Path, zygote: Zygote) -> None:
    urls, _ = _shards(tmp_path / "shards", 4)
    cache = tmp_path / "cache"
    for _ in range(2):  # a second run is told again
        lines = _run(zygote, urls, cache)
        assert len(lines) == 4, lines
        assert all(line.startswith("WARNING wds_cloud.cache: ") for line in lines)
        named = sorted(re.sub(r"^WARNING wds_cloud.cache: (\S+) \(.*", r"\1", line)
                       for line in lines)
        assert named == sorted(urls)
