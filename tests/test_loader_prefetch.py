"""A WebLoader's workers get more items in flight when its items are small
(``EpochedLoader._deepened``): up to ``PREFETCH_MAX`` each while they all fit in
``PREFETCH_BYTES``; never when the caller chose ``prefetch_factor``; the items, their order
and a resume are those of torch's default."""

from __future__ import annotations

from pathlib import Path

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.dataloader import PREFETCH_BYTES, PREFETCH_MAX


def _shards(directory: Path, shards: int, per_shard: int, size: int) -> list[str]:
    return [write_tar(directory / f"shard-{s:02d}.tar",
                      [(f"s{s:02d}-{i:04d}", {"bin": bytes([i % 256]) * size})
                       for i in range(per_shard)])
            for s in range(shards)]


def _dataset(urls: list[str]) -> wds.WebDataset:
    return wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "bin").batched(4)


def _keys(loader: wds.WebLoader) -> list[str]:
    return [key for keys, _ in loader for key in keys]


def test_small_items_get_more_in_flight_and_stay_the_same_items(tmp_path: Path) -> None:
    urls = _shards(tmp_path, 4, 200, 100)
    deep = wds.WebLoader(_dataset(urls), batch_size=None, num_workers=2)
    assert _keys(deep) == _keys(wds.WebLoader(_dataset(urls), batch_size=None,
                                              num_workers=2, prefetch_factor=2))
    assert deep._epoched.prefetch == PREFETCH_MAX
    assert len(_keys(deep)) == 800  # a second pass, from a new iterator, rises again
    assert deep._epoched.prefetch == PREFETCH_MAX


def test_large_items_keep_torchs_default(tmp_path: Path) -> None:
    # batches of 4 items of a quarter of the budget: 2 workers x 2 already hold it all
    urls = _shards(tmp_path, 2, 40, PREFETCH_BYTES // 16)
    loader = wds.WebLoader(_dataset(urls), batch_size=None, num_workers=2)
    assert len(_keys(loader)) == 80
    assert loader._epoched.prefetch == 2


@pytest.mark.parametrize("chosen", [1, 3])
def test_a_chosen_prefetch_factor_is_kept(tmp_path: Path, chosen: int) -> None:
    urls = _shards(tmp_path, 2, 100, 100)
    loader = wds.WebLoader(_dataset(urls), batch_size=None, num_workers=2,
                           prefetch_factor=chosen)
    assert len(_keys(loader)) == 200
    assert loader._epoched.prefetch == chosen


def test_a_resume_with_more_in_flight_is_exact(tmp_path: Path) -> None:
    urls = _shards(tmp_path, 4, 150, 100)

    def make() -> wds.WebLoader:
        dataset = wds.WebDataset(urls, shardshuffle=4, seed=1).shuffle(20) \
            .to_tuple("__key__", "bin").batched(4)
        return wds.WebLoader(dataset, batch_size=None, num_workers=2)

    full = _keys(make())
    loader = make()
    first = []
    for n, (keys, _) in enumerate(loader, 1):
        first += keys
        if n == 40:  # well after the rise (every 16 items), with items in flight
            state = loader.state_dict()
            break
    assert loader._epoched.prefetch == PREFETCH_MAX
    again = make()
    again.load_state_dict(state)
    assert first + _keys(again) == full
