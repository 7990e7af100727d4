"""A stage changed between save and restore is honoured (the rest of the epoch, every sample
exactly once) or refused in ``load_state_dict`` with a ResumeError naming the stage: never a
silently different stream. In one process and through a WebLoader with 2 workers."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ResumeError

SHARDS, PER_SHARD = 8, 30
KEYS = {f"s{s}-{i:03d}" for s in range(SHARDS) for i in range(PER_SHARD)}


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("shards")
    for s in range(SHARDS):
        write_tar(root / f"s-{s}.tar", [(f"s{s}-{i:03d}", {"txt": b"x"})
                                        for i in range(PER_SHARD)])
    return f"{root}/s-{{0..{SHARDS - 1}}}.tar"


def keys_of(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def build(urls: str, shuffle: int = 0, batch: int = 10, extra_map: bool = False) -> Any:
    dataset = wds.WebDataset(urls, shardshuffle=SHARDS, seed=1)
    if shuffle:
        dataset = dataset.shuffle(shuffle)
    if extra_map:
        dataset = dataset.map(dict)
    return dataset.batched(batch, collation_fn=keys_of)


CHANGES = {  # saved -> restored: honoured?
    "batch size": ({"shuffle": 40, "batch": 10}, {"shuffle": 40, "batch": 12}, True),
    "shuffle size": ({"shuffle": 40, "batch": 10}, {"shuffle": 90, "batch": 10}, True),
    "shuffle added": ({"batch": 10}, {"shuffle": 40, "batch": 10}, True),
    "map added": ({"shuffle": 40}, {"shuffle": 40, "extra_map": True}, True),
    "shuffle removed": ({"shuffle": 40, "batch": 10}, {"batch": 10}, False),
}


def _epoch_rest(first: list[str], rest: list[str]) -> None:
    counts = Counter(first + rest)
    assert set(counts) == KEYS and set(counts.values()) == {1}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_stage_in_one_process(urls: str, change: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    saved, restored, honoured = CHANGES[change]
    dataset = build(urls, **saved)
    first = [k for batch in itertools.islice(iter(dataset), 5) for k in batch]
    state = dataset.state_dict()
    again = build(urls, **restored)
    if not honoured:
        with pytest.raises(ResumeError, match=r"\.shuffle\(40\)") as error:
            again.load_state_dict(state)
        assert error.value.field == "stages"
        return
    with caplog.at_level("INFO"):
        again.load_state_dict(state)
    assert "honoured" in caplog.text or "anew" in caplog.text or "order" in caplog.text \
        or "go through" in caplog.text
    _epoch_rest(first, [k for batch in again for k in batch])


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_stage_through_a_webloader(urls: str, change: str) -> None:
    """A worker's state is its last full one plus items replayed through the stages: only a
    change of a stage that gives one item per item (an added map) is honoured; the others are
    refused, naming the stage."""
    saved, restored, _ = CHANGES[change]
    loader = wds.WebLoader(build(urls, **saved), batch_size=None, num_workers=2)
    first = [k for batch in itertools.islice(iter(loader), 6) for k in batch]
    state = loader.state_dict()
    again = wds.WebLoader(build(urls, **restored), batch_size=None, num_workers=2)
    if change != "map added":
        with pytest.raises(ResumeError, match=r"\.(shuffle|batched)\(\d+\)") as error:
            again.load_state_dict(state)
        assert error.value.field == "stages"
        return
    again.load_state_dict(state)
    _epoch_rest(first, [k for batch in again for k in batch])


def test_an_unhonourable_stage_change_is_refused_naming_it(urls: str) -> None:
    dataset = build(urls, shuffle=40)
    next(iter(dataset))
    state = dataset.state_dict()
    with pytest.raises(ResumeError, match=r"first difference at \.slice\(\)") as error:
        build(urls, shuffle=40).slice(100).load_state_dict(state)
    assert error.value.field == "stages"


def test_a_changed_source_is_refused_in_load_state_dict(tmp_path: Path, urls: str) -> None:
    spec = {"datasets": [{"name": "a", "shards": urls, "weight": 1}]}
    dataset = wds.WebDataset(spec, seed=3)
    next(iter(dataset))
    state = dataset.state_dict()
    spec["datasets"][0]["shards"] = urls.replace("{0..7}", "{0..3}")
    with pytest.raises(ResumeError, match=r"the shards of source 'a' changed") as error:
        wds.WebDataset(spec, seed=3).load_state_dict(state)  # not at the first iteration
    assert error.value.field == "src.a.shards"
    plain = wds.WebDataset(urls, shardshuffle=SHARDS, seed=1)
    next(iter(plain))
    with pytest.raises(ResumeError, match=r"the dataset .spec or shard list. differs") as error:
        wds.WebDataset(urls.replace("{0..7}", "{0..6}"), shardshuffle=SHARDS,
                       seed=1).load_state_dict(plain.state_dict())
    assert error.value.field == "fingerprint"
