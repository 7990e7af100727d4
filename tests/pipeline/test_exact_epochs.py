"""``WebDataset(urls, epoch_mode="exact")``: each epoch's shards, permuted with a seed all
ranks share, dealt to rank x worker slots in equal numbers (pad or drop), moving between ranks
across epochs; through real DataLoaders."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError
from wds_cloud.pipeline.exact import deal


@pytest.fixture
def urls(tmp_path: Path) -> list[str]:
    return [write_tar(tmp_path / f"{s:02d}.tar",
                      [(f"{s:02d}-{i}", {"txt": b"x"}) for i in range(4)]) for s in range(10)]


def _shards_of(urls: list[str], rank: int, workers: int, epoch: int, seed: int = 1,
               remainder: str = "pad") -> Counter[str]:
    dataset = wds.WebDataset(urls, epoch_mode="exact", seed=seed, remainder=remainder)
    counts: Counter[str] = Counter()
    for w in range(workers):
        dataset.pipeline[0].worker_info = wds.WorkerInfo(rank, 2, w, workers)
        dataset.set_epoch(epoch)
        counts.update(s["__url__"] for s in dataset)
    return counts


def test_deal_golden_values() -> None:
    """Pinned: a library upgrade must not move shards between slots."""
    assert deal([f"s{i}" for i in range(7)], seed=1, epoch=0, slots=3) == GOLDEN


GOLDEN = [["s3", "s0", "s1"], ["s4", "s5", "s3"], ["s2", "s6", "s4"]]


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_every_shard_once_equal_counts_per_slot(urls: list[str], remainder: str) -> None:
    for workers in (1, 2):
        per_rank = [_shards_of(urls, r, workers, epoch=0, remainder=remainder)
                    for r in range(2)]
        slots = 2 * workers
        total = per_rank[0] + per_rank[1]
        if remainder == "drop":
            assert sum(total.values()) == (10 - 10 % slots) * 4 and max(total.values()) == 4
        else:
            assert set(total) == set(urls) and sum(total.values()) == -(-10 // slots) * slots * 4
        assert sum(per_rank[0].values()) == sum(per_rank[1].values())


def test_shards_move_between_ranks_across_epochs_and_runs_repeat(urls: list[str]) -> None:
    epoch0 = _shards_of(urls, 0, 1, epoch=0)
    assert _shards_of(urls, 0, 1, epoch=1) != epoch0
    assert _shards_of(urls, 0, 1, epoch=0) == epoch0
    assert _shards_of(urls, 0, 1, epoch=0, seed=2) != epoch0


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_advance_in_dataloader_workers_without_set_epoch(urls: list[str],
                                                                persistent: bool) -> None:
    dataset = wds.WebDataset(urls, epoch_mode="exact", seed=3, remainder="drop")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                         persistent_workers=persistent)
    epochs = [sorted({s["__url__"] for s in loader}) for _ in range(4)]
    assert all(len(e) == 10 for e in epochs)  # one rank, 2 slots: all 10 shards
    orders = [[s["__key__"] for s in loader] for _ in range(2)]
    assert orders[0] != orders[1]


def test_fewer_shards_than_slots_names_both(urls: list[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("WORKER", "0")
    monkeypatch.setenv("NUM_WORKERS", "3")
    with pytest.raises(ConfigError, match=r"10 shards for 12 slots \(4 ranks x 3 workers\)"):
        list(wds.WebDataset(urls, epoch_mode="exact", seed=1))


@pytest.mark.parametrize("kw, match", [
    ({"epoch_mode": "sometimes"}, "the one mode is 'exact'"),
    ({"epoch_mode": "exact", "resampled": True}, "choose one"),
    ({"remainder": "drop"}, "goes with epoch_mode"),
    ({"epoch_mode": "exact", "remainder": "trim"}, "remainder must be one of"),
])
def test_bad_arguments(urls: list[str], kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        wds.WebDataset(urls, **kw)  # type: ignore[arg-type]
