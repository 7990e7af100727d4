"""``WebDataset(spec)``: the sample-level mix and webdataset's counted specs, on local shards,
through real DataLoaders: shares, ``__source__``, determinism per (seed, rank, worker, epoch),
epochs that advance without ``set_epoch``, and ``MultiShardSample``."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError
from wds_cloud.pipeline.shards import WorkerInfo
from wds_cloud.spec import DatasetSpec
from wds_cloud.spec.build import source_draws


def _source(root: Path, name: str, shards: int, per_shard: int) -> str:
    (root / name).mkdir()
    for s in range(shards):
        write_tar(root / name / f"{s:03d}.tar",
                  [(f"{name}-{s:03d}-{i:04d}", {"txt": f"{name} {s} {i}".encode(),
                                                "cls": b"1"})
                   for i in range(per_shard)])
    return f"{root}/{name}/{{000..{shards - 1:03d}}}.tar"


@pytest.fixture
def spec(tmp_path: Path) -> dict[str, Any]:
    return {"datasets": [
        {"name": "a", "shards": _source(tmp_path, "a", 4, 50), "weight": 0.5},
        {"name": "b", "shards": _source(tmp_path, "b", 2, 30), "weight": 0.3,
         "scale": [0.5, 1.5]},
        {"name": "c", "shards": _source(tmp_path, "c", 1, 20), "weight": 0.2},
    ]}


def _keys(dataset: Any, n: int) -> list[tuple[str, str]]:
    return [(s["__key__"], s["__source__"]) for s in itertools.islice(iter(dataset), n)]


def _at(rank: int = 0, world: int = 1, worker: int = 0, workers: int = 1) -> WorkerInfo:
    return WorkerInfo(rank, world, worker, workers)


def test_shares_follow_the_realized_probabilities(spec: dict[str, Any]) -> None:
    dataset = wds.WebDataset(spec, seed=7)
    got = Counter(source for _, source in _keys(dataset, 20000))
    want = DatasetSpec.from_dict(spec).probabilities(0, 7)
    for name, share in want.items():
        assert abs(got[name] / 20000 - share) < 0.015, (name, got, want)


def test_a_small_source_never_runs_dry_and_samples_are_whole(spec: dict[str, Any]) -> None:
    samples = list(itertools.islice(iter(wds.WebDataset(spec, seed=1)), 3000))
    from_c = [s for s in samples if s["__source__"] == "c"]
    assert len(from_c) > 100  # c has 20 samples: read over and over
    assert all(s["txt"].startswith(s["__source__"].encode()) for s in samples)
    assert {s["__url__"].split("/")[-2] for s in samples} == {"a", "b", "c"}


def test_the_stream_is_a_function_of_seed_rank_worker_and_epoch(spec: dict[str, Any]) -> None:
    def stream(seed: int, where: WorkerInfo, epoch: int = 0) -> list[tuple[str, str]]:
        dataset = wds.WebDataset(spec, seed=seed)
        dataset.pipeline[0].worker_info = where
        dataset.set_epoch(epoch)
        return _keys(dataset, 400)

    first = stream(3, _at())
    assert stream(3, _at()) == first
    assert stream(4, _at()) != first
    assert stream(3, _at(rank=1, world=2)) != stream(3, _at(rank=0, world=2))
    assert stream(3, _at(worker=1, workers=2)) != stream(3, _at(worker=0, workers=2))
    assert stream(3, _at(), epoch=1) != first


def test_source_draws_are_the_runtimes(spec: dict[str, Any]) -> None:
    loaded = DatasetSpec.from_dict(spec)
    dataset = wds.WebDataset(spec, seed=11)
    names = [s for _, s in _keys(dataset, 1000)]
    draws = source_draws(loaded, seed=11, epoch=0, slot=0, n=1000)
    assert names == [loaded.sources[i].name for i in draws]


def test_source_draws_golden_values() -> None:
    """Pinned: a library upgrade must not change which source a sample comes from."""
    loaded = DatasetSpec.from_dict({"datasets": [
        {"name": "x", "shards": "x.tar", "weight": 1}, {"name": "y", "shards": "y.tar",
                                                         "weight": 3}]})
    assert source_draws(loaded, seed=1234, epoch=0, slot=0, n=24) == GOLDEN_DRAWS


GOLDEN_DRAWS = [1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 0]


@pytest.mark.slow
def test_each_iteration_is_a_new_epoch_in_dataloader_workers(spec: dict[str, Any]) -> None:
    # spawned workers import torch anew each epoch (seconds each): two epochs of one worker
    # show that the epoch reaches a pickled copy; the forked ones show the rest
    for context, persistent, n, workers in [("fork", False, 3, 2), ("fork", True, 3, 2),
                                            ("spawn", False, 2, 1)]:
        dataset = wds.WebDataset(spec, seed=5).with_epoch(50)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                             multiprocessing_context=context,
                                             persistent_workers=persistent)
        epochs = [[s["__key__"] for s in loader] for _ in range(n)]
        assert all(len(e) == 50 * workers for e in epochs)
        assert len({tuple(e) for e in epochs}) == n, (context, persistent)
        if context == "spawn":
            continue
        again = wds.WebDataset(spec, seed=5).with_epoch(50)
        loader = torch.utils.data.DataLoader(again, batch_size=None, num_workers=2,
                                             multiprocessing_context=context,
                                             persistent_workers=persistent)
        assert [[s["__key__"] for s in loader] for _ in range(3)] == epochs
        again.set_epoch(1)
        assert [s["__key__"] for s in loader] == epochs[1]


def test_extensions_keep_only_those_members(spec: dict[str, Any]) -> None:
    spec["datasets"][0]["extensions"] = "txt"
    for sample in itertools.islice(iter(wds.WebDataset(spec, seed=2)), 500):
        if sample["__source__"] == "a":
            assert "cls" not in sample and "txt" in sample
        else:
            assert "cls" in sample


def test_a_yaml_file_and_the_seed_precedence(spec: dict[str, Any], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump({**spec, "seed": 9}))
    assert wds.WebDataset(str(path)).seed == 9
    assert _keys(wds.WebDataset(path), 50) == _keys(wds.WebDataset(spec, seed=9), 50)
    monkeypatch.setenv("WDS_SEED", "10")
    assert wds.WebDataset(str(path)).seed == 10
    assert wds.WebDataset(str(path), seed=11).seed == 11


def test_counted_specs_deal_one_epoch_list_to_the_slots(tmp_path: Path) -> None:
    spec = {"datasets": [
        {"name": "a", "shards": _source(tmp_path, "a", 6, 3), "choose": 4},
        {"name": "b", "shards": _source(tmp_path, "b", 2, 3), "resample": 4},
        {"name": "c", "shards": _source(tmp_path, "c", 2, 3)},
    ]}

    def slot(rank: int, worker: int, epoch: int) -> list[str]:
        dataset = wds.WebDataset(spec, seed=1)
        dataset.pipeline[0].worker_info = _at(rank, 2, worker, 2)
        dataset.set_epoch(epoch)
        return [s["__url__"] for s in dataset]

    for epoch in (0, 1):
        shards = [slot(r, w, epoch) for r in range(2) for w in range(2)]
        urls = [u for s in shards for u in dict.fromkeys(s)]
        by_source = Counter(u.split("/")[-2] for s in shards for u in s)
        assert by_source == {"a": 4 * 3, "b": 4 * 3, "c": 2 * 3}  # samples: 3 per shard
        assert len({u for u in urls if "/a/" in u}) == 4  # choose: without replacement
    assert slot(0, 0, 0) != slot(0, 0, 1)


def test_multishardsample_yields_shards_for_the_splitters(tmp_path: Path) -> None:
    spec = {"datasets": [{"name": "a", "shards": _source(tmp_path, "a", 3, 2)},
                         {"name": "b", "shards": _source(tmp_path, "b", 2, 2), "choose": 1}]}
    shards = list(wds.MultiShardSample(spec, seed=3))
    assert len(shards) == 4 and {s["__source__"] for s in shards} == {"a", "b"}
    pipeline = wds.DataPipeline(wds.MultiShardSample(spec, seed=3), wds.split_by_worker,
                                wds.tarfile_to_samples())
    assert len(list(pipeline)) == 8


def test_a_source_of_empty_shards_is_an_error_naming_it(spec: dict[str, Any],
                                                        tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    write_tar(tmp_path / "e" / "0.tar", [])
    spec["datasets"].append({"name": "e", "shards": f"{tmp_path}/e/0.tar", "weight": 1})
    with pytest.raises(ConfigError, match=r"datasets\[3\].*'e'.*no samples"):
        list(itertools.islice(iter(wds.WebDataset(spec, seed=1)), 5000))


def test_shuffle_of_a_spec_is_keyed_too(spec: dict[str, Any]) -> None:
    def stream(seed: int, worker: int) -> list[str]:
        dataset = wds.WebDataset(spec, seed=seed).shuffle(100)
        dataset.pipeline[0].worker_info = _at(worker=worker, workers=2)
        return [k for k, _ in _keys(dataset, 300)]

    first = stream(1, 0)
    assert stream(1, 0) == first
    assert stream(1, 1) != first and stream(2, 0) != first
    unshuffled = [k for k, _ in _keys(wds.WebDataset(spec, seed=1), 300)]
    assert first != unshuffled[:300]


def test_a_state_restored_twice_goes_on_exactly(spec: dict[str, Any]) -> None:
    """The samples drawn that a state holds (``mix.n``) count the skipped part of a restored
    block too: a second save and restore, mid-block, goes on exactly (it lost the skip)."""
    def keys(dataset: Any, n: int) -> list[str]:
        it = iter(dataset)
        return [next(it)["__key__"] for _ in range(n)]

    full = keys(wds.WebDataset(spec, seed=3), 1200)
    got, state = [], None
    for n in (300, 300, 600):
        dataset = wds.WebDataset(spec, seed=3)
        if state is not None:
            dataset.load_state_dict(state)
        got += keys(dataset, n)
        state = dataset.state_dict()
        assert state["mix.n"] == len(got)
    assert got == full


@pytest.mark.parametrize("weighted", [True, False])
def test_an_extension_that_matches_nothing_is_warned_about_once(
        spec: dict[str, Any], weighted: bool, caplog: pytest.LogCaptureFixture) -> None:
    """``extensions: txt clss`` (``cls`` misspelt) kept only ``txt``, silently: a WARNING names
    the source, the extension and the closest extension the samples have, once per process;
    a spelling that matches says nothing."""
    spec["datasets"][0]["extensions"] = "txt clss"
    spec["datasets"][1]["extensions"] = "txt"
    if not weighted:  # a counted spec: every shard once
        spec["datasets"] = [{k: v for k, v in d.items() if k not in ("weight", "scale")}
                            for d in spec["datasets"]]
    for _ in range(2):
        samples = list(itertools.islice(iter(wds.WebDataset(spec, seed=2)), 500))
        assert all("cls" not in s for s in samples if s["__source__"] in ("a", "b"))
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
            and r.name == "wds_cloud.spec.extensions"]
    assert len(said) == 1, said
    assert said[0].endswith(": datasets[0].extensions (source 'a'): 'clss' matches no member "
                            "of the first 100 samples read "
                            "(extensions there: cls, txt): none is kept for it; did you "
                            "mean 'cls'?")


def test_a_source_with_fewer_samples_than_checked_is_warned_about_at_its_end(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = {"datasets": [{"name": "small", "shards": _source(tmp_path, "small", 1, 7),
                          "extensions": ["txt", "jpeg"]}]}
    assert len(list(wds.WebDataset(spec))) == 7
    said = [r.getMessage() for r in caplog.records if r.name == "wds_cloud.spec.extensions"]
    assert len(said) == 1 and said[0].endswith(
        "'jpeg' matches no member of the 7 samples read (extensions there: cls, txt): none is "
        "kept for it")
