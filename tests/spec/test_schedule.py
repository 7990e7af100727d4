"""Weight schedules: a source's weight over samples or steps, measured against its points in
windows of 5,000 samples, across a resume and through a WebLoader with two workers; strict
validation naming the file and the key as written; Energon's weight; Mosaic's refused."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import SpecError
from wds_cloud.spec import DatasetSpec

WINDOW = 5000
TOTAL = 30000
POINTS = {0: 0.9, 20000: 0.1}  # a's weight; b's is 1 - a's: a's share is its weight


def _source(root: Path, name: str, shards: int, per_shard: int) -> str:
    (root / name).mkdir()
    for s in range(shards):
        write_tar(root / name / f"{s:03d}.tar",
                  [(f"{name}-{s:03d}-{i:04d}", {"txt": b"x"}) for i in range(per_shard)])
    return f"{root}/{name}/{{000..{shards - 1:03d}}}.tar"


@pytest.fixture
def spec(tmp_path: Path) -> dict[str, Any]:
    return {"seed": 11, "datasets": [
        {"name": "a", "shards": _source(tmp_path, "a", 4, 100),
         "weight": {"schedule": "linear", "points": POINTS}},
        {"name": "b", "shards": _source(tmp_path, "b", 3, 100),
         "weight": {"schedule": "linear", "points": {0: 0.1, 20000: 0.9}}},
    ]}


def _share_of_a(position: float) -> float:
    (x0, y0), (x1, y1) = POINTS.items()
    return y0 + (y1 - y0) * min(max(position - x0, 0) / (x1 - x0), 1.0)


def _check_windows(sources: list[str]) -> None:
    assert len(sources) == TOTAL
    for start in range(0, TOTAL, WINDOW):
        window = sources[start:start + WINDOW]
        observed = window.count("a") / WINDOW
        # the mean of a linear share over the window is its value in the middle
        expected = (_share_of_a(start) + _share_of_a(start + WINDOW)) / 2
        assert abs(observed - expected) < 0.02, (start, observed, expected)


def test_a_linear_schedule_is_followed_across_a_resume(spec: dict[str, Any]) -> None:
    def make() -> Any:
        return wds.WebDataset(spec).to_tuple("__source__", "__key__")

    full = list(itertools.islice(iter(make()), TOTAL))
    _check_windows([s for s, _ in full])
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(12345)]
    state = first.state_dict()
    again = make()
    again.load_state_dict(state)
    tail = list(itertools.islice(iter(again), TOTAL - len(head)))
    assert head + tail == full  # derived from the position: nothing of it was stored


def test_a_schedule_through_a_webloader_with_two_workers(spec: dict[str, Any]) -> None:
    def make() -> wds.WebLoader:
        dataset = wds.WebDataset(spec).to_tuple("__source__").batched(100, collation_fn=list)
        return wds.WebLoader(dataset, batch_size=None, num_workers=2)

    def flat(batches: Any) -> list[str]:
        return [source for batch in batches for (source,) in batch]

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(120)]
    state = loader.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    tail = list(itertools.islice(iter(again), TOTAL // 100 - 120))
    _check_windows(flat(head + tail))


def test_steps_count_batches_over_ranks(spec: dict[str, Any]) -> None:
    for source in spec["datasets"]:
        source["weight"] = {**source["weight"], "by": "step",
                            "points": {k // 10: v for k, v in source["weight"]["points"].items()}}
    dataset = wds.WebDataset(spec).to_tuple("__source__").batched(10, collation_fn=list)
    sources = [s for batch in itertools.islice(iter(dataset), TOTAL // 10) for (s,) in batch]
    _check_windows(sources)  # step k is sample 10 k: the same windows
    unbatched = wds.WebDataset(spec)
    with pytest.raises(wds.ConfigError, match="batch size"):
        next(iter(unbatched))


def test_a_step_schedule_switches_at_its_points(spec: dict[str, Any]) -> None:
    spec["datasets"][0]["weight"] = {"schedule": "step", "points": {0: 1.0, 10000: 0.0}}
    spec["datasets"][1]["weight"] = {"schedule": "step", "points": {0: 0.0, 10000: 1.0}}
    sources = [s["__source__"] for s in itertools.islice(iter(wds.WebDataset(spec)), 20000)]
    # the weights are evaluated once per block of 256 draws, at its middle
    assert set(sources[:9984]) == {"a"} and set(sources[10240:]) == {"b"}
    shares = DatasetSpec.from_dict(spec).probabilities(0, at=10000)
    assert shares == {"a": 0.0, "b": 1.0}


@pytest.mark.parametrize(("weight", "key", "message"), [
    ({"schedule": "linear", "points": {100: 1.0, 50: 0.5}}, "datasets[0].scaleprob.points.50",
     "positions must increase"),
    ({"schedule": "linear", "points": {-1: 1.0}}, "datasets[0].scaleprob.points.-1",
     "integer >= 0"),
    ({"schedule": "linear", "points": {0: -0.5}}, "datasets[0].scaleprob.points.0",
     "weight >= 0"),
    ({"schedule": "cosine", "points": {0: 1.0}}, "datasets[0].scaleprob.schedule",
     "linear, step"),
    ({"schedule": "step", "points": {0: 1.0}, "by": "epochs"}, "datasets[0].scaleprob.by",
     "samples or step"),
    ({"schedule": "step", "pionts": {0: 1.0}}, "datasets[0].scaleprob.pionts", "unknown key"),
    ({"schedule": "step", "points": {0: 1.0, 500: 0.0}}, "datasets[0].scaleprob",
     "zero at 500 samples"),
])
def test_schedules_are_validated_strictly(tmp_path: Path, weight: dict[str, Any], key: str,
                                          message: str) -> None:
    path = tmp_path / "sched.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"datasets": [
        {"shards": "a-{0..3}.tar", "scaleprob": weight},
        {"shards": "b-{0..3}.tar", "weight": 0}]}, sort_keys=False))
    with pytest.raises(SpecError) as error:
        DatasetSpec.from_yaml(path)
    assert str(error.value).startswith(f"{path}: {key}: "), error.value
    assert message in str(error.value)


def test_schedules_count_one_thing_and_need_a_mix() -> None:
    with pytest.raises(SpecError, match=r"datasets\[1\]\.weight\.by: 'step'"):
        DatasetSpec.from_dict({"datasets": [
            {"shards": "a.tar", "weight": {"schedule": "linear", "points": {0: 1}}},
            {"shards": "b.tar", "weight": {"schedule": "linear", "points": {0: 1}, "by": "step"}},
        ]})
    with pytest.raises(SpecError, match=r"streams\.x\.proportion: a weight schedule"):
        DatasetSpec.from_dict({"streams": {"x": {"remote": "s3://b/x", "proportion": {
            "schedule": "linear", "points": {0: 1}}}}})


def test_energon_blend_weights_take_schedules(tmp_path: Path) -> None:
    spec = DatasetSpec.from_dict({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend": [
            {"path": str(tmp_path / "x"), "weight": {"schedule": "linear",
                                                     "points": {0: 3, 1000: 1}}},
            {"path": str(tmp_path / "y"), "weight": 1}]}}})
    assert spec.probabilities(0, at=0) == {"x": 0.75, "y": 0.25}
    assert spec.probabilities(0, at=1000) == {"x": 0.5, "y": 0.5}

