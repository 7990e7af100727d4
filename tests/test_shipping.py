"""A WebLoader's workers send small items in groups (``wds_cloud.shipping.grouped``): the main
process gets the items, their order, their errors and their resumes exactly as torch's
DataLoader gives single items, in fewer of torch's trips."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar
from torch.utils.data import DataLoader

import wds_cloud as wds
from wds_cloud import shipping
from wds_cloud.shipping import GROUP_BYTES, GROUP_MAX, Group, grouped


def _shards(directory: Path, sizes: list[int]) -> list[str]:
    """Tar shards of ``sizes[s]`` samples each (a ``.txt`` and a ``.cls``)."""
    return [write_tar(directory / f"shard-{s:02d}.tar",
                      [(f"s{s:02d}-{i:04d}", {"txt": f"sample {s} {i}".encode(),
                                              "cls": b"%d" % i}) for i in range(count)])
            for s, count in enumerate(sizes)]


def _keys(items: Any) -> list[str]:
    return [sample["__key__"] for sample in items]


def _trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the items torch brings from the workers: each is unpickled here once, and
    notes its size (the workers, forked with this patch, never call it)."""
    trips: list[int] = []

    def note(cls: Any, size: int) -> None:
        trips.append(size)

    monkeypatch.setattr(shipping._Sizes, "note", classmethod(note))
    return trips


def test_groups_give_torchs_order_in_fewer_trips(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # uneven workers: worker 0 reads shards 0 and 2 (230 samples), worker 1 shard 1 (70);
    # torch gives one of each in turn, then the rest of worker 0's
    urls = _shards(tmp_path, [200, 70, 30])
    theirs = _keys(DataLoader(wds.WebDataset(urls, shardshuffle=False), batch_size=None,
                              num_workers=2))
    trips = _trips(monkeypatch)
    ours = _keys(wds.WebLoader(wds.WebDataset(urls, shardshuffle=False), batch_size=None,
                               num_workers=2))
    assert ours == theirs
    assert len(ours) == 300 and len(set(ours)) == 300
    assert 0 < len(trips) < len(ours)  # items went in groups


def test_a_resume_goes_on_exactly_with_groups(tmp_path: Path) -> None:
    urls = _shards(tmp_path, [90, 60, 40])

    def loader() -> wds.WebLoader:
        dataset = wds.WebDataset(urls, shardshuffle=10, seed=5).shuffle(20)
        return wds.WebLoader(dataset, batch_size=None, num_workers=2)

    whole = _keys(loader())
    first = loader()
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(77)]  # mid-group, very likely
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    assert head + _keys(second) == whole


class _Broken(Exception):
    pass


def _break_at(key: str) -> Any:
    def check(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__key__"] == key:
            raise _Broken(f"bad sample {key}")
        return sample
    return check


def _until_error(items: Any) -> tuple[list[str], BaseException | None]:
    keys: list[str] = []
    it = iter(items)
    try:
        for sample in it:
            keys.append(sample["__key__"])
    except Exception as exc:
        # torch's own iterator keeps its workers until it is collected, and then waited 10 s
        # for them in a later test: shut them down now (ours has, shut_on_error)
        getattr(it, "_shutdown_workers", lambda: None)()
        return keys, exc
    return keys, None


def test_a_workers_error_comes_where_torch_raises_it(tmp_path: Path) -> None:
    urls = _shards(tmp_path, [120, 120])  # the error in worker 1's 50th sample
    check = _break_at("s01-0049")
    theirs, their_error = _until_error(DataLoader(
        wds.WebDataset(urls, shardshuffle=False).map(check), batch_size=None, num_workers=2))
    ours, our_error = _until_error(wds.WebLoader(
        wds.WebDataset(urls, shardshuffle=False).map(check), batch_size=None, num_workers=2))
    assert ours == theirs and len(ours) == 99  # 50 of worker 0's, 49 of worker 1's
    assert type(our_error) is type(their_error) is _Broken
    assert "in DataLoader worker process 1" in str(our_error)
    assert "bad sample s01-0049" in str(our_error)


def test_a_workers_error_shuts_the_workers_down_at_once(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # the error's traceback holds torch's iterator in a cycle: were its workers left to the
    # garbage collector, the next loader's forked workers could collect it and fail there
    urls = _shards(tmp_path, [60, 60])
    before = set(multiprocessing.active_children())  # (other tests' loaders, not collected)
    broken = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False).map(_break_at("s00-0030")),
                           batch_size=None, num_workers=2)
    keys, error = _until_error(broken)
    assert isinstance(error, _Broken) and len(keys) == 60
    assert set(multiprocessing.active_children()) <= before
    again = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False), batch_size=None,
                          num_workers=2)
    assert len(_keys(again)) == 120
    assert "can only test a child process" not in capfd.readouterr().err


def test_out_of_order_loaders_take_groups_as_they_come(tmp_path: Path) -> None:
    urls = _shards(tmp_path, [50, 50, 50])
    loader = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False), batch_size=None,
                           num_workers=2, in_order=False)
    keys = _keys(loader)
    assert sorted(keys) == sorted(_keys(wds.WebDataset(urls, shardshuffle=False)))


def test_torch_batching_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # with batch_size, torch asks the dataset for one sample at a time: nothing to group
    urls = _shards(tmp_path, [40, 40])
    trips = _trips(monkeypatch)
    loader = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls"),
                           batch_size=8, num_workers=2)
    batches = list(loader)
    assert len(trips) == len(batches) == 10
    assert sorted(k for keys, _ in batches for k in keys) == sorted(
        f"s{s:02d}-{i:04d}" for s in range(2) for i in range(40))


# -- the rules of a group, on their own -------------------------------------------------------

def _groups(items: Iterator[Any], per_item: int, monkeypatch: pytest.MonkeyPatch
            ) -> list[Group]:
    monkeypatch.setattr(shipping._Sent, "per_item", per_item)
    monkeypatch.setattr(shipping, "GROUP_SECONDS", 3600.0)  # (time is not what is tested)
    return list(grouped(items, worker=3))


def test_a_group_holds_at_most_group_max_items(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = _groups(iter(range(2 * GROUP_MAX + 5)), 10, monkeypatch)
    assert [len(g.items) for g in groups] == [GROUP_MAX, GROUP_MAX, 5]
    assert [g.last for g in groups] == [False, False, True]
    assert {g.worker for g in groups} == {3}
    assert [x for g in groups for x in g.items] == list(range(2 * GROUP_MAX + 5))


def test_large_items_and_unknown_sizes_go_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for per_item in (0, GROUP_BYTES, GROUP_BYTES * 4):
        groups = _groups(iter(range(4)), per_item, monkeypatch)
        assert [g.items for g in groups] == [[0], [1], [2], [3], []]
        assert groups[-1].last and not any(g.last for g in groups[:-1])
    groups = _groups(iter(range(10)), GROUP_BYTES // 4, monkeypatch)
    assert [len(g.items) for g in groups] == [4, 4, 2]  # up to GROUP_BYTES a group


def test_an_error_ends_the_last_group(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise _Broken("the third")

    groups = _groups(failing(), 10, monkeypatch)
    assert len(groups) == 1 and groups[0].items == [1, 2] and groups[0].last
    entries = groups[0].entries()
    assert entries[:2] == [1, 2]
    with pytest.raises(_Broken, match="the third"):
        entries[2].reraise()


def test_slow_items_go_alone_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # each item comes GROUP_SECONDS x 4 after the one before: none waits for the next
    monkeypatch.setattr(shipping._Sent, "per_item", 10)

    def slow() -> Iterator[int]:
        for i in range(3):
            time.sleep(shipping.GROUP_SECONDS * 4)
            yield i

    assert [g.items for g in grouped(slow(), worker=0)] == [[0], [1], [2], []]
