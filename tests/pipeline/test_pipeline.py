"""DataPipeline, curried stages and the epoch helpers, against webdataset 1.0.2."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import webdataset as wd
import webdataset.utils as wd_utils

import wds_cloud as wds
from wds_cloud.errors import ConfigError
from wds_cloud.pipeline import DataPipeline, PipelineStage, filters, pipelinefilter, stage


def make_samples(n: int = 10) -> list[dict[str, Any]]:
    return [{"__key__": f"s{i:03d}", "x": i, "y": i * 10} for i in range(n)]


def add_offset(data: Any, offset: int, *, scale: int = 1) -> Any:
    for item in data:
        yield item * scale + offset


def double_x(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "x": sample["x"] * 2}


@pipelinefilter
def decorated_plus(data: Any, n: int) -> Any:
    for item in data:
        yield item + n


class EpochCounter(PipelineStage):
    """A stateful stage written with webdataset's `run`."""

    def __init__(self) -> None:
        self.epochs = 0

    def run(self, src: Any) -> Any:
        self.epochs += 1
        return ((self.epochs, s) for s in src)


class InvokeOnly(PipelineStage):
    """A stage written against webdataset's utils.PipelineStage docs (defines `invoke`)."""

    def invoke(self, src: Any) -> Any:
        return (s + 1 for s in src)


def test_construction_matches_webdataset() -> None:
    samples = make_samples()
    stages: list[Any] = [[samples], None, [filters.map(double_x), None], filters.to_tuple("x y")]
    ours = DataPipeline(*stages)
    theirs = wd.DataPipeline([samples], None, [wd.map(double_x)], wd.to_tuple("x y"))
    assert len(ours.pipeline) == len(theirs.pipeline) == 3
    assert ours.stage(0) is samples
    assert list(ours) == list(theirs)
    assert list(ours) == list(ours)  # a second epoch starts afresh


def test_sources_of_every_kind() -> None:
    assert list(DataPipeline(range(5))) == list(range(5))
    assert list(DataPipeline(lambda: iter("abc"))) == ["a", "b", "c"]
    inner = DataPipeline([[1, 2, 3]], add_offset_stage(10))
    assert list(DataPipeline(inner, add_offset_stage(1))) == [12, 13, 14]
    assert list(DataPipeline([[1, 2]], InvokeOnly())) == [2, 3]


def add_offset_stage(offset: int) -> stage:
    return pipelinefilter(add_offset)(offset)


def test_bad_stages_are_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="not a valid pipeline stage"):
        list(DataPipeline(range(3), 42))
    with pytest.raises(ConfigError, match="string"):
        list(DataPipeline("shard-{000..009}.tar"))
    with pytest.raises(ConfigError, match="keyword"):
        DataPipeline(range(3), length=3)
    with pytest.raises(ConfigError, match="no stages"):
        list(DataPipeline())


def test_append_and_compose() -> None:
    base = DataPipeline(range(4))
    composed = base.compose(add_offset_stage(1), add_offset_stage(100))
    assert list(composed) == [101, 102, 103, 104]
    assert list(base) == [0, 1, 2, 3]  # compose copies
    base.append(add_offset_stage(5))
    assert list(base) == [5, 6, 7, 8]
    assert len(composed.pipeline) == 3


def test_pipelinefilter_is_a_picklable_curry() -> None:
    curried = pipelinefilter(add_offset)
    st = curried(3, scale=2)
    assert isinstance(st, PipelineStage)
    assert list(st(iter([1, 2]))) == list(add_offset(iter([1, 2]), 3, scale=2)) == [5, 7]
    for obj in (curried, st):
        clone = pickle.loads(pickle.dumps(obj))
        assert repr(clone) == repr(obj)
    assert list(pickle.loads(pickle.dumps(st))(iter([1, 2]))) == [5, 7]
    assert "add_offset" in repr(st)
    assert curried.__name__ == "add_offset"  # type: ignore[attr-defined]


def test_decorated_pipelinefilter_pickles() -> None:
    st = decorated_plus(3)
    assert pickle.loads(pickle.dumps(decorated_plus)) is decorated_plus
    clone = pickle.loads(pickle.dumps(st))
    assert list(clone(iter([1, 2]))) == list(st(iter([1, 2]))) == [4, 5]
    ds = pickle.loads(pickle.dumps(DataPipeline(range(3), st, decorated_plus(10))))
    assert list(ds) == [13, 14, 15]


def test_stateful_stage_runs_once_per_epoch() -> None:
    counter = EpochCounter()
    ds = DataPipeline([[1, 2]], counter)
    assert list(ds) == [(1, 1), (1, 2)]
    assert list(ds) == [(2, 1), (2, 2)]


@pytest.mark.parametrize("n", [1, 7, 10, 23])
def test_with_epoch_matches_webdataset(n: int) -> None:
    samples = make_samples(10)
    ours = DataPipeline([samples], filters.map(double_x)).with_epoch(n)
    theirs = wd.DataPipeline([samples], wd.map(double_x)).with_epoch(n)
    assert list(ours) == list(theirs)
    assert len(list(ours)) == n
    batched = DataPipeline([samples], filters.batched(3)).with_epoch(nbatches=5)
    assert len(list(batched)) == 5


@pytest.mark.parametrize(("nepochs", "nbatches"), [(3, -1), (2, 15), (-1, 25)])
def test_repeat_matches_webdataset(nepochs: int, nbatches: int) -> None:
    ours = DataPipeline(range(10)).repeat(nepochs, nbatches)
    theirs = wd.DataPipeline([list(range(10))]).repeat(nepochs, nbatches)
    assert list(ours) == list(theirs)


def test_repeat_honours_nbatches_for_one_epoch() -> None:
    assert list(DataPipeline(range(10)).repeat(1, 4)) == [0, 1, 2, 3]


def test_repeating_an_empty_source_stops() -> None:
    assert list(DataPipeline([[]]).with_epoch(100)) == []
    assert list(DataPipeline(range(0)).repeat()) == []


def test_with_length_declares_len_and_pickles() -> None:
    ds = DataPipeline(range(10), add_offset_stage(1))
    with pytest.raises(TypeError, match="with_length"):
        len(ds)
    assert bool(ds)
    with pytest.warns(UserWarning, match="with_length"):
        assert ds.with_length(4) is ds
    assert len(ds) == 4
    assert list(ds) == list(range(1, 11))  # the epoch is unchanged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.with_length(5, silent=True)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 5
    assert list(clone) == list(ds)


def test_whole_pipeline_pickles_with_length_and_epoch() -> None:
    samples = make_samples(12)
    ds = DataPipeline(
        [samples],
        filters.shuffle(5, seed=7),
        filters.map(double_x),
        filters.select(bool),
        filters.rename(a="x", b="y"),
        filters.to_tuple("a b"),
        filters.map_tuple(str, None),
        filters.batched(4),
    ).with_epoch(7).with_length(7, silent=True)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 7
    assert repr(clone) == repr(ds)
    first, again = list(ds), list(clone)
    assert len(first) == 7
    assert [(list(a), list(b)) for a, b in first] == [(list(a), list(b)) for a, b in again]


def test_close_closes_stages() -> None:
    inner = DataPipeline(range(3))
    outer = DataPipeline(inner, add_offset_stage(0))
    outer.close()
    assert outer.pipeline == [] and inner.pipeline == []


def test_with_epoch_class_continues_across_epochs() -> None:
    ds = wds.with_epoch(range(5), 3)
    assert [list(ds) for _ in range(4)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    clone = pickle.loads(pickle.dumps(ds))  # the live iterator is not pickled
    assert list(clone) == [0, 1, 2]
    assert list(wds.with_epoch([], 3)) == []
    assert list(DataPipeline(range(7), wds.with_epoch(None, 4))) == [0, 1, 2, 3]  # type: ignore[arg-type]


def test_stage_and_mock_dataset() -> None:
    st = stage(add_offset, 1, scale=3)
    assert list(DataPipeline(wds.MockDataset(2, 4), st)) == [7, 7, 7, 7]
    assert len(wds.MockDataset("x", 5)) == 5
    with pytest.raises(ConfigError, match="not callable"):
        stage(42)  # type: ignore[arg-type]


def test_with_length_class() -> None:
    ds = wds.with_length(range(5), 42)
    assert len(ds) == 42
    assert list(ds) == list(range(5))
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 42 and list(clone) == list(range(5))


@pytest.mark.parametrize(
    "kw",
    [{"nepochs": 3}, {"nbatches": 7}, {"nsamples": 10}, {"nepochs": 2, "nbatches": 5}],
)
def test_repeatedly_matches_webdataset(kw: dict[str, int]) -> None:
    batches = [([1, 2, 3], "abc"), ([4, 5, 6], "def"), ([7, 8], "gh")]
    assert list(wds.repeatedly(batches, **kw)) == list(wd_utils.repeatedly(batches, **kw))


def test_repeatedly_stops_on_an_exhausted_iterator() -> None:
    it = iter([[1], [2]])
    assert list(wds.repeatedly(it)) == [[1], [2]]  # webdataset loops forever here


def test_repeatedly_uses_the_given_batchsize() -> None:
    items = [[0] * 5] * 10
    assert len(list(wds.repeatedly(items, nsamples=6, batchsize=lambda b: 2))) == 3


def test_torch_subclass_runs_in_dataloader_workers() -> None:
    import torch.utils.data as torch_data

    class TorchPipeline(DataPipeline, torch_data.IterableDataset):  # type: ignore[misc]
        pass

    ds = TorchPipeline(range(5), add_offset_stage(100)).with_epoch(8)
    assert isinstance(ds, torch_data.IterableDataset)
    assert list(ds) == [100, 101, 102, 103, 104, 100, 101, 102]
    loader = torch_data.DataLoader(ds, batch_size=None, num_workers=2)
    got = [int(x) for x in loader]
    # with_epoch counts per worker: each of the two workers yields 8 items
    assert len(got) == 16
    assert sorted(got) == sorted(list(ds) * 2)
