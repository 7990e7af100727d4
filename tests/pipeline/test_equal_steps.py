"""``with_epoch(nbatches=N)``: exactly N batches per rank from a DataLoader, whatever
``num_workers``, with the pipeline or the DataLoader batching; positional ``with_epoch(n)``
keeps webdataset's per-worker meaning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError


@pytest.fixture
def urls(tmp_path: Path) -> list[str]:
    return [write_tar(tmp_path / f"{s}.tar", [(f"{s}-{i:03d}", {"txt": b"x"}) for i in range(7)])
            for s in range(3)]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("rank", [0, 1])
def test_nbatches_per_rank_with_the_pipeline_batching(urls: list[str], workers: int, rank: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = (wds.WebDataset(urls, resampled=True, seed=1, nodesplitter=None)
               .to_tuple("txt").batched(4)
               .with_epoch(nbatches=11))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    batches = list(loader)
    assert len(batches) == 11 and all(len(b[0]) == 4 for b in batches)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_nbatches_with_the_dataloader_batching(urls: list[str], workers: int) -> None:
    dataset = wds.WebDataset(urls, resampled=True, seed=1).to_tuple("txt").with_epoch(
        nbatches=7, batch_size=5)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=workers)
    sizes = [len(b[0]) for b in loader]
    assert sizes == [5] * 7  # no short batch at the end of a worker's share


def test_nsamples_converts_with_the_batch_size(urls: list[str]) -> None:
    dataset = wds.WebDataset(urls, resampled=True, seed=1).with_epoch(nsamples=23, batch_size=5)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=2)
    assert [len(b["txt"]) for b in loader] == [5] * 4  # 23 // 5 batches
    samples = wds.WebDataset(urls, resampled=True, seed=1).with_epoch(nsamples=13)
    loader = torch.utils.data.DataLoader(samples, batch_size=None, num_workers=3)
    assert len(list(loader)) == 13


def test_a_finite_source_repeats_to_fill_the_share(urls: list[str]) -> None:
    dataset = wds.WebDataset(urls, shardshuffle=False).with_epoch(nbatches=50)  # 21 samples
    assert len(list(dataset)) == 50


def test_positional_keeps_webdatasets_per_worker_meaning(urls: list[str]) -> None:
    dataset = wds.WebDataset(urls, resampled=True, seed=1).with_epoch(6)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert len(list(loader)) == 12  # 6 from each worker's copy


@pytest.mark.parametrize("kw, match", [
    ({"nbatches": 0}, "nbatches=0"), ({"nsamples": 3, "batch_size": 5}, "less than one batch"),
    ({"nbatches": 2, "nsamples": 3}, "not both"), ({"nbatches": True}, "nbatches=True"),
])
def test_bad_arguments(urls: list[str], kw: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        wds.WebDataset(urls, resampled=True, seed=1).with_epoch(**kw)
