"""Resuming a mix whose sources changed: sources are known by name; a kept source continues
from its own cursor with its new weight, a new one starts at its beginning, a removed one is
dropped, each logged; only a kept source whose shard list changed is refused."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from dialects import local_put, put_shards

import wds_cloud as wds
from wds_cloud.errors import ResumeError

SHARDS, PER_SHARD = 6, 40  # 240 samples a source


@pytest.fixture
def root(tmp_path: Path) -> Path:
    put = local_put(tmp_path)
    for name in ("a", "b", "c", "d"):
        put_shards(put, name, name, SHARDS, PER_SHARD)
    return tmp_path


def spec(root: Path, weights: dict[str, float]) -> dict[str, Any]:
    return {"seed": 5, "datasets": [
        {"name": name, "shards": f"{root}/{name}/parts/data-{{0..{SHARDS - 1}}}.tar",
         "weight": weight} for name, weight in weights.items()]}


def test_add_remove_and_reweigh_sources_on_resume(root: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    before = wds.WebDataset(spec(root, {"a": 1, "b": 1, "c": 1})).shuffle(30)
    it = iter(before)
    head = [(s["__source__"], s["__key__"]) for s in itertools.islice(it, 300)]
    state = before.state_dict()

    after = wds.WebDataset(spec(root, {"a": 0.5, "b": 1, "d": 1})).shuffle(30)
    with caplog.at_level("INFO"):
        after.load_state_dict(state)
        tail = [(s["__source__"], s["__key__"]) for s in itertools.islice(iter(after), 6000)]
    assert "source 'c' was removed" in caplog.text
    assert "source 'd' was added" in caplog.text
    assert "source 'a' goes on from where it stood with weight 0.5 (was 1.0)" in caplog.text
    shares = Counter(source for source, _ in tail)
    for name, share in {"a": 0.2, "b": 0.4, "d": 0.4}.items():
        assert shares[name] / len(tail) == pytest.approx(share, abs=0.02), shares
    # a kept source goes on: no sample again before its pass ends (the shuffle buffer of 30
    # holds back at most 30 of a pass when the next pass's samples start coming in)
    for name in ("a", "b"):
        keys = [k for source, k in head + tail if source == name]
        first_pass = keys[:SHARDS * PER_SHARD - 30]
        assert len(set(first_pass)) == len(first_pass), name
    d = [k for source, k in tail if source == "d"]
    assert len(set(d[:SHARDS * PER_SHARD - 30])) == SHARDS * PER_SHARD - 30  # from its start


def test_a_kept_source_whose_shards_changed_is_refused(root: Path) -> None:
    before = wds.WebDataset(spec(root, {"a": 1, "b": 1}))
    next(iter(before))
    state = before.state_dict()
    changed = spec(root, {"a": 1, "b": 1})
    changed["datasets"][1]["shards"] = f"{root}/b/parts/data-{{0..2}}.tar"
    with pytest.raises(ResumeError, match=r"the shards of source 'b' changed") as error:
        wds.WebDataset(changed).load_state_dict(state)
    assert error.value.field == "src.b.shards"


def test_the_same_spec_resumes_exactly_as_before(root: Path) -> None:
    """Naming the sources in the state changes nothing for an unchanged spec."""
    whole = [s["__key__"] for s in itertools.islice(
        iter(wds.WebDataset(spec(root, {"a": 1, "b": 2})).shuffle(20)), 400)]
    first = wds.WebDataset(spec(root, {"a": 1, "b": 2})).shuffle(20)
    head = [s["__key__"] for s in itertools.islice(iter(first), 150)]
    again = wds.WebDataset(spec(root, {"a": 1, "b": 2})).shuffle(20)
    again.load_state_dict(first.state_dict())
    assert head + [s["__key__"] for s in itertools.islice(iter(again), 250)] == whole
