"""Real torch DataLoaders: epochs with non-persistent workers, reproducibility, pickling.

The contrast with webdataset 1.0.2 is deliberate and documented: its ResampledShards keeps its
epoch counter in the dataset object, which a DataLoader with ``persistent_workers=False``
pickles afresh into new workers each epoch, so every epoch replays the same shards.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import webdataset
from shardgen import write_tar
from torch.utils.data import DataLoader, IterableDataset

import wds_cloud as wds

URLS = [f"shard-{i:03d}.tar" for i in range(50)]


def url_of(item: dict[str, str]) -> str:
    return item["url"]


def epochs_of(loader: Any, n: int = 3) -> list[list[str]]:
    return [list(loader) for _ in range(n)]


def resampled_pipeline(lib: Any, **kw: Any) -> Any:
    return lib.DataPipeline(lib.ResampledShards(URLS, nshards=8, **kw), lib.map(url_of))


def test_plain_dataloader_epochs_differ_webdataset_repeats() -> None:
    torch.manual_seed(0)
    ours = DataLoader(resampled_pipeline(wds, deterministic=True), batch_size=None,
                      num_workers=2, persistent_workers=False)
    theirs = DataLoader(resampled_pipeline(webdataset, deterministic=True), batch_size=None,
                        num_workers=2, persistent_workers=False)
    our_epochs, their_epochs = epochs_of(ours), epochs_of(theirs)
    assert all(len(e) == 16 for e in our_epochs + their_epochs)
    # webdataset 1.0.2: every epoch is the same (the defect this package fixes)
    assert their_epochs[0] == their_epochs[1] == their_epochs[2]
    # wds_cloud: torch's per-epoch worker seed is mixed in when nobody calls set_epoch
    assert len({tuple(e) for e in our_epochs}) == 3
    # ... which is reproducible under torch.manual_seed
    torch.manual_seed(0)
    assert epochs_of(ours) == our_epochs


def test_webloader_epochs_differ_and_reproduce_across_runs() -> None:
    def run() -> list[list[str]]:
        dataset = resampled_pipeline(wds, deterministic=True, seed=42)
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2, persistent_workers=False)
        return epochs_of(loader)

    torch.manual_seed(1)
    first = run()
    torch.manual_seed(2)  # the torch seed does not matter: WebLoader numbers the epochs
    second = run()
    assert first == second
    assert len({tuple(e) for e in first}) == 3
    assert all(len(e) == 16 for e in first)
    # the two workers draw different streams
    assert first[0][0::2] != first[0][1::2]


def test_persistent_workers_also_advance() -> None:
    dataset = resampled_pipeline(wds, deterministic=True, seed=3)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    epochs = epochs_of(loader)
    assert len({tuple(e) for e in epochs}) == 3


def test_datasets_are_torch_iterable_datasets() -> None:
    assert isinstance(wds.DataPipeline([1, 2]), IterableDataset)
    assert isinstance(wds.ResampledShards(URLS), IterableDataset)
    assert isinstance(wds.SimpleShardList(URLS), IterableDataset)
    loader = DataLoader(wds.SimpleShardList(URLS[:4]), batch_size=None, num_workers=0)
    assert [d["url"] for d in loader] == URLS[:4]


# ---------------------------------------------------------------- with tar shards


def make_shards(directory: Path, nshards: int = 4, per_shard: int = 5) -> list[str]:
    def samples(s: int) -> Iterator[tuple[str, dict[str, bytes]]]:
        for i in range(per_shard):
            key = f"s{s:03d}_{i:03d}"
            yield key, {"txt": f"{key} text".encode(), "cls": str(s * 100 + i).encode()}

    return [write_tar(directory / f"data-{s:03d}.tar", samples(s)) for s in range(nshards)]


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def test_webdataset_pickles_with_length_and_runs_in_spawned_workers(tmp_path: Path) -> None:
    urls = make_shards(tmp_path)
    ds = wds.WebDataset(urls, shardshuffle=False).map(key_of).with_length(20, silent=True)
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy) == 20
    assert list(copy) == list(ds)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert len(loader) == 20
    expected = sorted(f"s{s:03d}_{i:03d}" for s in range(4) for i in range(5))
    assert sorted(loader) == expected


def test_resampled_webdataset_through_webloader(tmp_path: Path) -> None:
    urls = make_shards(tmp_path, nshards=8, per_shard=3)

    def run() -> list[list[str]]:
        ds = wds.WebDataset(urls, resampled=True, seed=5).map(key_of).with_epoch(6)
        loader = wds.WebLoader(ds, batch_size=None, num_workers=2)
        return epochs_of(loader)

    first = run()
    assert all(len(e) == 12 for e in first)
    assert len({tuple(e) for e in first}) == 3
    universe = {f"s{s:03d}_{i:03d}" for s in range(8) for i in range(3)}
    assert {k for e in first for k in e} <= universe
    assert run() == first  # an explicit seed makes resampling reproducible


def test_webloader_fluid_methods(tmp_path: Path) -> None:
    urls = make_shards(tmp_path, nshards=4, per_shard=6)
    ds = wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls").batched(4)
    loader = wds.WebLoader(ds, batch_size=None, num_workers=2)
    rebatched = loader.unbatched().shuffle(10).batched(5)
    batches = list(rebatched)
    assert [len(keys) for keys, _ in batches] == [5, 5, 5, 5, 4]
    everything = sorted(k for keys, _ in loader for k in keys)
    assert sorted(k for keys, _ in batches for k in keys) == everything
    assert everything == sorted(f"s{s:03d}_{i:03d}" for s in range(4) for i in range(6))
    assert isinstance(rebatched, wds.WebLoader)
    assert isinstance(loader.dataloader, DataLoader)
    limited = loader.unbatched().with_epoch(7)
    assert len(list(limited)) == 7
    assert len(loader.with_length(3, silent=True)) == 3


def test_webloader_set_epoch_for_resuming() -> None:
    def epoch_two(resume: bool) -> list[str]:
        loader = wds.WebLoader(resampled_pipeline(wds, deterministic=True, seed=9),
                               batch_size=None, num_workers=2)
        if resume:
            loader.set_epoch(2)
            return list(loader)
        return epochs_of(loader)[2]

    assert epoch_two(resume=True) == epoch_two(resume=False)


def test_the_parent_reads_plain_samples_after_a_webloader_read_the_dataset(
        tmp_path: Path) -> None:
    """A WebLoader's workers send their state with each item; the dataset in the main
    process, iterated after the loader (or between its epochs), still yields samples."""
    for i in range(4):
        write_tar(tmp_path / f"s-{i}.tar", [(f"k{i}-{j}", {"txt": b"x"}) for j in range(3)])
    spec = {"datasets": [{"name": "s", "shards": f"{tmp_path}/s-{{0..3}}.tar"}]}
    for dataset in (wds.WebDataset(f"{tmp_path}/s-{{0..3}}.tar", shardshuffle=False),
                    wds.WebDataset(spec, seed=0)):
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
        by_workers = sorted(s["__key__"] for s in loader)
        in_parent = sorted(s["__key__"] for s in dataset)
        assert in_parent == by_workers and len(in_parent) == 12
        assert sorted(s["__key__"] for s in loader) == by_workers  # the loader again


def test_small_tensors_travel_in_the_pickle_of_their_batch() -> None:
    """A WebLoader's worker packs its batches so that small CPU tensors travel as bytes (not
    each through shared memory and a file descriptor of its own): the same values, dtypes and
    shapes come out; a larger tensor goes torch's way; other objects are untouched."""
    from multiprocessing.reduction import ForkingPickler

    from wds_cloud.shipping import INLINE_TENSOR_BYTES, _Packed

    small = {"i": torch.arange(64), "f": torch.rand(3, 4, dtype=torch.float16),
             "b": torch.tensor([True, False]), "view": torch.arange(20).reshape(4, 5)[:, 1],
             "empty": torch.zeros(0), "text": ["a", b"b"], "n": 3}
    data = bytes(ForkingPickler.dumps(_Packed(small)))
    back = pickle.loads(data)
    assert back.keys() == small.keys() and back["text"] == ["a", b"b"] and back["n"] == 3
    for key in ("i", "f", "b", "view", "empty"):
        assert back[key].dtype == small[key].dtype and back[key].shape == small[key].shape
        assert torch.equal(back[key], small[key])
    assert b"rebuild_storage" not in data  # no shared memory for them
    large = torch.zeros(INLINE_TENSOR_BYTES // 4 + 1, dtype=torch.float32)
    assert b"rebuild_storage" in bytes(ForkingPickler.dumps(_Packed(large)))


def test_batches_from_workers_equal_the_dataloaders_own(tmp_path: Path) -> None:
    """Batches collated in the workers (numbers become tensors) come out of a WebLoader as
    out of a plain DataLoader over the same dataset."""
    urls = [write_tar(tmp_path / f"s{k}.tar", [(f"k{k}_{i:03d}", {"cls": str(i).encode()})
                                                for i in range(40)]) for k in range(2)]

    def dataset() -> Any:
        return wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("cls").batched(8)

    ours = list(wds.WebLoader(dataset(), batch_size=None, num_workers=2))
    theirs = list(DataLoader(dataset(), batch_size=None, num_workers=2))
    assert len(ours) == len(theirs) == 10
    for a, b in zip(ours, theirs, strict=True):
        assert isinstance(a[0], torch.Tensor) and torch.equal(a[0], b[0])


def test_a_dataset_loads_the_openers_of_its_shards_for_the_workers_it_forks(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Built in the process that forks the workers, a dataset has the opener of each scheme
    of its shards imported (its library with it), so no worker imports it again; an opener
    that cannot be loaded is reported by the read, as before, not by the constructor."""
    import sys

    from wds_cloud.io import unregister_opener

    shard = tmp_path / "a.tar"
    write_tar(shard, [("k0", {"txt": b"zero"})])
    (tmp_path / "prep_opener.py").write_text(
        "class Opener:\n"
        "    def open(self, url, mode, **options):\n"
        f"        return open({str(shard)!r}, 'rb')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "prep_opener", raising=False)
    wds.register_opener("prep", "prep_opener:Opener")
    wds.register_opener("prepmissing", "prep_no_such_module:Opener")
    try:
        dataset = wds.WebDataset("prep://bucket/a.tar", shardshuffle=False)
        assert "prep_opener" in sys.modules
        assert [s["txt"] for s in dataset] == [b"zero"]
        missing = wds.WebDataset("prepmissing://bucket/a.tar", shardshuffle=False)
        assert "prep_no_such_module" not in sys.modules
        with pytest.raises(wds.OpenError, match="prep_no_such_module"):
            next(iter(missing))
    finally:
        unregister_opener("prep")
        unregister_opener("prepmissing")
