"""Resume on another shape: a state saved by R ranks x W workers (with a batch size) loads into
R' x W' (and another batch size), and the rest of the epoch is read exactly once, counted per
sample key: the samples in shuffle buffers, the half-read shards, the shards not yet started.
Ranks are played in one process through RANK/WORLD_SIZE (as torchrun sets them); the torchrun
test on the S3 server is tests/spec/test_reshape_torchrun.py."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ResumeError

SHARDS, PER_SHARD = 7, 40


@pytest.fixture
def urls(tmp_path: Path) -> str:
    for s in range(SHARDS):
        write_tar(tmp_path / f"s-{s}.tar", [(f"s{s}-{i:03d}", {"txt": f"{s} {i}".encode()})
                                            for i in range(PER_SHARD)])
    return f"{tmp_path}/s-{{0..{SHARDS - 1}}}.tar"


def _key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def _loader(urls: str, workers: int, batch: int) -> wds.WebLoader:
    dataset = (wds.WebDataset(urls, shardshuffle=100, seed=11, nodesplitter=wds.split_by_node)
               .shuffle(25).map(_key))
    return wds.WebLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=list)


def _ranks(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def _run(urls: str, monkeypatch: pytest.MonkeyPatch, world: int, workers: int, batch: int,
         steps: int | None, state: Any) -> tuple[list[str], Any]:
    """Every rank of a job of ``world`` x ``workers``, resumed from ``state``, for ``steps``
    batches each (``None``: to the epoch's end); the keys they yielded, and the merged state
    (pickled, as a checkpoint is)."""
    keys: list[str] = []
    states = []
    for rank in range(world):
        _ranks(monkeypatch, rank, world)
        loader = _loader(urls, workers, batch)
        if state is not None:
            loader.load_state_dict(pickle.loads(state))
        it = iter(loader)
        for batch_ in itertools.islice(it, steps):
            keys += batch_
        states.append(loader.state_dict())
        del it
    return keys, pickle.dumps(wds.merge_state_dicts(states))


@pytest.mark.parametrize("plan", [
    # (ranks, workers, batch size, batches per rank; None: to the end of the epoch)
    [(2, 2, 4, 9), (1, 3, 6, None)],
    [(1, 2, 5, 3), (3, 1, 4, 7), (2, 3, 3, None)],
    [(2, 1, 8, 1), (1, 4, 2, 40), (1, 0, 7, None)],   # a worker of 4 that had yielded nothing
    [(1, 3, 4, 20), (2, 2, 4, 5), (2, 2, 4, None)],   # the same shape again, while playing
])
def test_the_rest_of_the_epoch_is_read_exactly_once_over_each_new_shape(
        urls: str, monkeypatch: pytest.MonkeyPatch, plan: list[tuple[int, int, int, Any]]
        ) -> None:
    seen: list[str] = []
    state = None
    for world, workers, batch, steps in plan:
        keys, state = _run(urls, monkeypatch, world, workers, batch, steps, state)
        assert keys or steps is None
        seen += keys
    counts = Counter(seen)
    assert sorted(counts) == sorted(f"s{s}-{i:03d}" for s in range(SHARDS)
                                    for i in range(PER_SHARD))
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:5]


def test_the_next_epoch_runs_in_the_new_shape(urls: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _, state = _run(urls, monkeypatch, 2, 2, 4, 5, None)
    _ranks(monkeypatch, 0, 1)
    loader = _loader(urls, 3, 4)
    loader.load_state_dict(pickle.loads(state))
    rest = [k for batch in loader for k in batch]
    epoch1 = [k for batch in loader for k in batch]
    assert len(rest) == SHARDS * PER_SHARD - 2 * 5 * 4  # 2 ranks x 5 batches of 4
    assert sorted(epoch1) == sorted(f"s{s}-{i:03d}" for s in range(SHARDS)
                                    for i in range(PER_SHARD))
    fresh = _loader(urls, 3, 4)  # epoch 1 of a job that ran in this shape from the start
    fresh.set_epoch(1)
    assert epoch1 == [k for batch in fresh for k in batch]


def test_resampled_streams_go_on_where_they_stood_and_the_rest_is_shared_evenly(
        urls: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def loader(workers: int) -> wds.WebLoader:
        dataset = (wds.WebDataset(urls, resampled=True, seed=5).shuffle(10).map(_key)
                   .with_epoch(60))
        return wds.WebLoader(dataset, batch_size=4, num_workers=workers, collate_fn=list)

    _ranks(monkeypatch, 0, 1)
    whole = list(loader(2))  # 2 workers x 60 samples: batches from worker 0, 1, 0, 1, ...
    first = loader(2)
    it = iter(first)
    head = list(itertools.islice(it, 6))
    state = first.state_dict()
    del it
    again = loader(3)
    again.load_state_dict(state)
    rest = list(again)
    assert head == whole[:6]
    # each saved worker's stream goes on where it stood (in the new workers 0 and 1), the
    # new worker 2 draws a stream of its own; the 96 samples left are shared evenly
    assert rest[:2] == whole[6:8]
    assert sum(map(len, rest)) == 120 - 6 * 4


def test_merging_names_what_does_not_fit(urls: str, monkeypatch: pytest.MonkeyPatch) -> None:
    states = []
    for rank in range(2):
        _ranks(monkeypatch, rank, 2)
        loader = _loader(urls, 2, 4)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
        del it
    with pytest.raises(ResumeError, match=r"ranks \[1\] of 2 are missing") as missing:
        wds.merge_state_dicts(states[:1])
    assert missing.value.field == "rank"
    with pytest.raises(ResumeError, match="twice") as twice:
        wds.merge_state_dicts([states[0], states[0]])
    assert twice.value.field == "rank"
    with pytest.raises(ResumeError, match="different epochs") as epochs:
        wds.merge_state_dicts([states[0], {**states[1], "epoch": 1}])
    assert epochs.value.field == "epoch"
    _ranks(monkeypatch, 0, 1)  # one rank's state alone into another shape: merge them all
    with pytest.raises(ResumeError, match="missing"):
        _loader(urls, 3, 4).load_state_dict(states[0])
    merged = wds.merge_state_dicts(states)
    assert [(s["rank"], s["worker"]) for s in merged["slots"]] == [(0, 0), (0, 1), (1, 0),
                                                                    (1, 1)]
    other = wds.WebLoader(wds.WebDataset(urls, shardshuffle=100, seed=12,
                                          nodesplitter=wds.split_by_node).shuffle(25).map(_key),
                          batch_size=4, num_workers=3, collate_fn=list)
    with pytest.raises(ResumeError) as seed:  # another seed: refused in load_state_dict
        other.load_state_dict(merged)
    assert seed.value.field == "seed"


def test_every_rank_takes_the_same_steps_in_the_rest_of_a_resampled_epoch(
        urls: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def loader(workers: int) -> wds.WebLoader:
        dataset = (wds.WebDataset(urls, resampled=True, seed=5, nodesplitter=wds.split_by_node)
                   .map(_key).batched(4, collation_fn=list).with_epoch(nbatches=15))
        return wds.WebLoader(dataset, batch_size=None, num_workers=workers)

    states = []
    for rank in range(2):  # 2 ranks x 2 workers, 15 batches a rank: stopped after 5
        _ranks(monkeypatch, rank, 2)
        first = loader(2)
        it = iter(first)
        assert len(list(itertools.islice(it, 5))) == 5
        states.append(first.state_dict())
        del it
    merged = pickle.dumps(wds.merge_state_dicts(states))
    steps = []
    for rank in range(3):  # the rest, 2 x 10 batches, on 3 ranks x 1 worker: 7 each
        _ranks(monkeypatch, rank, 3)
        again = loader(1)
        again.load_state_dict(pickle.loads(merged))
        steps.append(sum(1 for _ in again))
    assert steps == [7, 7, 7]


# -- canonical slots: global batches that do not depend on the shape ----------------------

SLOTS, GLOBAL_BATCH = 4, 8


@pytest.fixture
def even(tmp_path: Path) -> str:
    """8 shards of 40: 80 samples a slot, so every rank takes the same steps."""
    for s in range(8):
        write_tar(tmp_path / f"e-{s}.tar", [(f"e{s}-{i:03d}", {"txt": b"x"})
                                            for i in range(PER_SHARD)])
    return f"{tmp_path}/e-{{0..7}}.tar"


def _canonical(urls: str, world: int, workers: int) -> wds.WebLoader:
    dataset = wds.WebDataset(urls, shardshuffle=100, seed=3).shuffle(20).map(_key)
    return wds.WebLoader(dataset, batch_size=GLOBAL_BATCH // world, num_workers=workers,
                         slots=SLOTS, collate_fn=list)


def _global_batches(urls: str, monkeypatch: pytest.MonkeyPatch, world: int, workers: int,
                    steps: int | None = None, state: bytes | None = None
                    ) -> tuple[list[list[str]], bytes]:
    """The job's global batches (the ranks' batches in rank order), and its merged state."""
    per_rank, states = [], []
    for rank in range(world):
        _ranks(monkeypatch, rank, world)
        loader = _canonical(urls, world, workers)
        if state is not None:
            loader.load_state_dict(pickle.loads(state))
        it = iter(loader)
        per_rank.append(list(itertools.islice(it, steps)))
        states.append(loader.state_dict())
        del it
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps
    batches = [[key for rank in per_rank for key in rank[t]] for t in range(len(per_rank[0]))]
    return batches, pickle.dumps(wds.merge_state_dicts(states))


def test_canonical_slots_give_the_same_global_batches_on_every_shape(
        even: str, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = even
    reference, _ = _global_batches(urls, monkeypatch, 2, 2)
    assert sorted(k for batch in reference for k in batch) == sorted(
        f"e{s}-{i:03d}" for s in range(8) for i in range(PER_SHARD))
    assert [len(batch) for batch in reference] == [GLOBAL_BATCH] * 40
    for world, workers in ((1, 4), (4, 1), (1, 0), (2, 1)):
        assert _global_batches(urls, monkeypatch, world, workers)[0] == reference, (world,
                                                                                   workers)
    # killed after 7 global batches on 2 x 2, on 1 x 3 for 5, then on 4 x 1 to the end
    head, state = _global_batches(urls, monkeypatch, 2, 2, 7)
    middle, state = _global_batches(urls, monkeypatch, 1, 3, 5, state)
    tail, _ = _global_batches(urls, monkeypatch, 4, 1, None, state)
    assert head + middle + tail == reference


def test_canonical_slots_name_what_does_not_divide(urls: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _ranks(monkeypatch, 0, 3)
    with pytest.raises(wds.ConfigError, match="ranks must divide the slots"):
        _canonical(urls, 3, 1)
    _ranks(monkeypatch, 0, 2)
    dataset = wds.WebDataset(urls, shardshuffle=100, seed=3)
    with pytest.raises(wds.ConfigError, match="multiple of 2"):
        wds.WebLoader(dataset, batch_size=3, num_workers=1, slots=4)
    _, plain = _run(urls, monkeypatch, 1, 2, 4, 3, None)  # a job without slots
    _ranks(monkeypatch, 0, 1)
    with pytest.raises(ResumeError, match=r"1 ranks x 2 workers \(or slots\), not of "
                       r"WebLoader\(slots=4\)") as other:
        _canonical(urls, 1, 2).load_state_dict(pickle.loads(plain))
    assert other.value.field == "slots"


def test_a_changed_mix_resumes_on_another_shape_twice(tmp_path: Path, urls: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight halved and a shape changed in one resume, then the shape changed again before
    every slot had yielded: each saved stream goes on, no ResumeError."""
    def spec(weight: float) -> str:
        path = tmp_path / f"mix-{weight}.yaml"
        path.write_text(f"""\
seed: 9
datasets:
  - name: one
    shards: {tmp_path}/s-{{0..3}}.tar
    weight: 1.0
  - name: two
    shards: {tmp_path}/s-{{4..6}}.tar
    weight: {weight}
""")
        return str(path)

    def loader(weight: float, workers: int) -> wds.WebLoader:
        dataset = wds.WebDataset(spec(weight)).to_tuple("__key__", "__source__")
        return wds.WebLoader(dataset.with_epoch(200), batch_size=5, num_workers=workers,
                             collate_fn=list)

    _ranks(monkeypatch, 0, 1)
    first = loader(1.0, 2)
    it = iter(first)
    assert len(list(itertools.islice(it, 4))) == 4
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it
    second = loader(0.5, 3)  # the weight of 'two' halved, on 3 workers
    second.load_state_dict(state)
    it = iter(second)
    assert len(list(itertools.islice(it, 1))) == 1  # worker 1 has not yielded yet
    state = pickle.loads(pickle.dumps(second.state_dict()))
    del it
    third = loader(0.5, 1)
    third.load_state_dict(state)
    rest = [source for batch in third for _, source in batch]
    assert len(rest) == 2 * 200 - 4 * 5 - 5  # what the epoch had left
    assert {"one", "two"} == set(rest)
