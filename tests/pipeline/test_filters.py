"""Every pipeline stage against webdataset 1.0.2's stage of the same name, on the same input."""

from __future__ import annotations

import io
import pickle
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wd
import webdataset.filters as wdf

from wds_cloud import handlers
from wds_cloud.errors import ConfigError, ShardFormatError
from wds_cloud.pipeline import filters

URL = "file:///data/shard-000.tar"


def make_samples(n: int = 12) -> list[dict[str, Any]]:
    return [
        {"__key__": f"s{i:03d}", "__url__": URL, "x": i, "y": f"v{i}", "z": float(i) / 2}
        for i in range(n)
    ]


def run(stage: Callable[[Any], Iterable[Any]], data: Iterable[Any]) -> list[Any]:
    return list(stage(iter(data)))


def both(ours: Any, theirs: Any, data_factory: Callable[[], list[Any]] = make_samples) -> list[Any]:
    """Run our stage and webdataset's on fresh copies of the same data; assert equal outputs."""
    got, want = run(ours, data_factory()), run(theirs, data_factory())
    assert_same(got, want)
    return got


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert np.array_equal(a, b)
    elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (a, b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def fails_on_odd(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["x"] % 2:
        raise ValueError(f"odd {sample['x']}")
    return {**sample, "x": sample["x"] * 3}


def none_for_threes(sample: dict[str, Any]) -> dict[str, Any] | None:
    return None if sample["x"] % 3 == 0 else {"x": sample["x"]}


def is_even(sample: dict[str, Any]) -> bool:
    return sample["x"] % 2 == 0


# --- simple stages -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw", [{}, {"n": 2, "width": 5, "name": "N"}, {"fmt": "{__key__}:{x}", "n": 0, "every": 4}]
)
def test_info_matches_webdataset(kw: dict[str, Any]) -> None:
    ours, theirs = io.StringIO(), io.StringIO()
    both(filters.info(stream=ours, **kw), wd.info(stream=theirs, **kw))
    assert ours.getvalue() == theirs.getvalue() and ours.getvalue()


def test_select_map_and_slice_match_webdataset() -> None:
    both(filters.select(is_even), wd.select(is_even))
    both(filters.map(fails_on_odd, handler=handlers.ignore_and_continue),
         wd.map(fails_on_odd, handler=wd.ignore_and_continue))
    got = both(filters.map(none_for_threes), wd.map(none_for_threes))
    assert all("__key__" in s for s in got)  # dict results get the sample's key
    for args in [(5,), (2, 9), (1, 11, 3)]:
        both(filters.slice(*args), wd.slice(*args))


@pytest.mark.parametrize(
    "handler", [handlers.ignore_and_continue, handlers.ignore_and_stop, handlers.reraise_exception]
)
def test_handler_semantics_match_webdataset(handler: Callable[[BaseException], bool]) -> None:
    pairs = [
        (filters.map(fails_on_odd, handler=handler), wd.map(fails_on_odd, handler=handler)),
        (filters.map_dict(x=lambda v: 1 // (v % 2), handler=handler),
         wd.map_dict(x=lambda v: 1 // (v % 2), handler=handler)),
        (filters.to_tuple("x nothere", handler=handler),
         wd.to_tuple("x nothere", handler=handler)),
        (filters.rename(a="nothere", handler=handler), wd.rename(a="nothere", handler=handler)),
    ]
    for ours, theirs in pairs:
        if handler is handlers.reraise_exception:
            with pytest.raises(Exception) as theirs_error:  # any error: compared below
                run(theirs, make_samples())
            with pytest.raises(type(theirs_error.value)):
                run(ours, make_samples())
        else:
            both(ours, theirs)


def test_warn_and_continue_warns_and_skips() -> None:
    with pytest.warns(UserWarning, match="odd"):
        got = run(filters.map(fails_on_odd, handler=handlers.warn_and_continue), make_samples())
    assert [s["x"] for s in got] == [3 * i for i in range(0, 12, 2)]


def test_rename_matches_webdataset() -> None:
    both(filters.rename(a="x", b="nope;y"), wd.rename(a="x", b="nope;y"))
    both(filters.rename(keep=False, a="x", b="y;z"), wd.rename(keep=False, a="x", b="y;z"))
    with pytest.raises(ShardFormatError, match=r"s000.*nope.*shard-000\.tar"):
        run(filters.rename(a="nope"), make_samples())


def test_associate_and_map_dict_match_webdataset() -> None:
    extra = {"s001": {"label": 1}, "s004": {"label": 4}}
    both(filters.associate(extra), wd.associate(extra))
    both(filters.associate(lambda key: {"k2": key * 2}), wd.associate(lambda key: {"k2": key * 2}))
    both(filters.map_dict(x=str, y=len), wd.map_dict(x=str, y=len))
    with pytest.raises(ConfigError):
        run(filters.map_dict(), make_samples())
    with pytest.raises(ConfigError, match="'x'"):
        run(filters.map_dict(x=3), make_samples())


# --- tuples ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [("x y",), ("x", "y"), ("x",), ("nope;x z",), (["nope", "y"], "x"), ("__key__ z",)]
)
def test_to_tuple_matches_webdataset(args: tuple[Any, ...]) -> None:
    got = both(filters.to_tuple(*args), wd.to_tuple(*args))
    assert all(isinstance(t, tuple) for t in got)


def test_to_tuple_missing_keys() -> None:
    with pytest.raises(ShardFormatError) as info:
        run(filters.to_tuple("x jpg;png"), make_samples())
    message = str(info.value)
    assert "jpg" in message and "png" in message and "s000" in message and URL in message
    assert info.value.url == URL
    kw: dict[str, Any] = {"missing_is_error": False}
    both(filters.to_tuple("x jpg", **kw), wd.to_tuple("x jpg", **kw))
    kw = {"missing_is_error": False, "none_is_error": True}
    with pytest.raises(ShardFormatError, match="jpg"):
        run(filters.to_tuple("x jpg", **kw), make_samples())
    samples_with_none = [{"x": None, "y": 1}]
    with pytest.raises(ShardFormatError, match="'x'"):
        run(filters.to_tuple("x y"), samples_with_none)
    with pytest.raises(ConfigError, match="at least one"):
        run(filters.to_tuple(), make_samples())


def tuples() -> list[tuple[Any, ...]]:
    return [(i, f"s{i}", i / 4) for i in range(9)]


def test_map_tuple_matches_webdataset() -> None:
    both(filters.map_tuple(str, None, int), wd.map_tuple(str, None, int), tuples)
    both(filters.map_tuple(None, len), wd.map_tuple(None, len), tuples)
    both(filters.map_tuple(str, str, str, str), wd.map_tuple(str, str, str, str), tuples)
    with pytest.raises(ConfigError, match="function 1"):
        run(filters.map_tuple(str, 5), tuples())


def test_getfirst_transform_with_and_compose_match_webdataset() -> None:
    sample = make_samples(1)[0]
    for keys in ["x", "nope;y", ["nope", "z"]]:
        assert filters.getfirst(sample, keys) == wdf.getfirst(sample, keys)
    assert filters.getfirst(sample, "nope", 7, missing_is_error=False) == 7
    with pytest.raises(ShardFormatError, match="nope"):
        filters.getfirst(sample, "nope")
    with pytest.raises(ConfigError, match="space"):
        filters.getfirst(sample, "x y")
    t = (1, "a", 2.0)
    for fs in [[str, None], [None, None, int], []]:
        assert filters.transform_with(t, fs) == wdf.transform_with(t, fs)
    f = filters.compose(str, len, float)
    assert f(12345) == wdf.compose(str, len, float)(12345)
    assert pickle.loads(pickle.dumps(f))(12345) == 5.0


# --- batches ---------------------------------------------------------------------------------


def rich_samples(n: int = 11) -> list[dict[str, Any]]:
    return [
        {
            "__key__": f"k{i}",
            "i": i,
            "f": i * 0.5,
            "b": i % 2 == 0,
            "s": f"text{i}",
            "a": np.full((2, 3), i, dtype=np.float32),
            "t": torch.full((3,), i, dtype=torch.int64),
            "d": {"nested": i},
        }
        for i in range(n)
    ]


def rich_tuples(n: int = 11) -> list[tuple[Any, ...]]:
    return [tuple(s[k] for k in ("i", "f", "s", "a", "t")) for s in rich_samples(n)]


@pytest.mark.parametrize("factory", [rich_samples, rich_tuples])
@pytest.mark.parametrize(
    "kw", [{}, {"partial": False}, {"collation_fn": None}, {"batchsize": 1}, {"batchsize": 20}]
)
def test_batched_matches_webdataset(factory: Callable[[], list[Any]], kw: dict[str, Any]) -> None:
    kw = {"batchsize": 4, **kw}
    got = both(filters.batched(**kw), wd.batched(**kw), factory)
    assert got, "no batches"


def test_collation_without_combining_matches_webdataset() -> None:
    samples = rich_samples(5)
    for kw in [{"combine_tensors": False}, {"combine_scalars": False}]:
        assert_same(
            filters.default_collation_fn(samples, **kw), wdf.default_collation_fn(samples, **kw)
        )


def test_collation_errors_name_the_field() -> None:
    arrays = [{"a": np.zeros((2, 2))}, {"a": np.zeros((3, 2))}]
    with pytest.raises(ShardFormatError, match=r"'a'.*shapes"):
        filters.default_collation_fn(arrays)
    with pytest.raises(ShardFormatError, match="different keys"):
        filters.default_collation_fn([{"a": 1}, {"b": 2}])
    with pytest.raises(ConfigError, match="batchsize"):
        run(filters.batched(0), [1, 2])


@pytest.mark.parametrize("factory", [rich_samples, rich_tuples])
def test_unbatched_matches_webdataset(factory: Callable[[], list[Any]]) -> None:
    def batches() -> list[Any]:
        return run(wd.batched(4), factory())

    got = both(filters.unbatched(), wd.unbatched(), batches)
    assert len(got) == 11


def test_listed_and_unlisted_roundtrip() -> None:
    lists = both(filters.listed(5), wd.batched(5, collation_fn=None))
    assert [len(b) for b in lists] == [5, 5, 2]
    assert run(filters.listed(5, partial=False), make_samples()) == lists[:2]
    both(filters.unlisted(), wdf.unlisted(), lambda: run(filters.listed(5), make_samples()))
    with pytest.raises(ConfigError, match="list"):
        run(filters.unlisted(), [(1, 2)])


# --- randomness ------------------------------------------------------------------------------


def keys_of(samples: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in samples]


@pytest.mark.parametrize(("bufsize", "initial"), [(1000, 100), (5, 2), (1, 1), (20, 50)])
def test_shuffle(bufsize: int, initial: int) -> None:
    data = [{"__key__": f"{i:04d}"} for i in range(300)]
    state = random.getstate()
    a = run(filters.shuffle(bufsize, initial, seed=1), data)
    assert random.getstate() == state, "shuffle touched the global random generator"
    assert Counter(keys_of(a)) == Counter(keys_of(data))
    assert keys_of(run(filters.shuffle(bufsize, initial, seed=1), data)) == keys_of(a)
    assert keys_of(run(filters.shuffle(bufsize, initial, rng=random.Random(1)), data)) == keys_of(
        run(filters.shuffle(bufsize, initial, rng=random.Random(1)), data)
    )
    if bufsize > 1:
        assert keys_of(run(filters.shuffle(bufsize, initial, seed=2), data)) != keys_of(a)
        assert keys_of(a) != keys_of(data)
        unseeded = {tuple(keys_of(run(filters.shuffle(bufsize, initial), data))) for _ in range(3)}
        assert len(unseeded) == 3


def test_shuffle_errors() -> None:
    with pytest.raises(ConfigError, match="either"):
        run(filters.shuffle(10, rng=random.Random(), seed=3), [1])
    with pytest.raises(ConfigError, match="bufsize"):
        run(filters.shuffle("ten"), [1])  # type: ignore[arg-type]
    for bufsize in (0, -3):  # webdataset's loop yields each sample as it comes
        assert run(filters.shuffle(bufsize, seed=1), list(range(20))) == list(range(20))


def test_detshuffle_is_deterministic_per_epoch() -> None:
    data = list(range(200))
    one, two = filters.detshuffle(50, 10, seed=3), filters.detshuffle(50, 10, seed=3)
    epochs = [run(one, data) for _ in range(3)]
    assert [run(two, data) for _ in range(3)] == epochs
    assert all(sorted(e) == data for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    resumed = filters.detshuffle(50, 10, seed=3, epoch=1)  # next run is epoch 2
    assert run(resumed, data) == epochs[2]
    assert run(filters.detshuffle(50, 10, seed=4), data) != epochs[0]


def test_rsample() -> None:
    data = list(range(2000))
    state = random.getstate()
    kept = run(filters.rsample(0.3, seed=5), data)
    assert random.getstate() == state
    assert kept == run(filters.rsample(0.3, seed=5), data)
    assert 450 < len(kept) < 750 and kept == sorted(kept)
    assert run(filters.rsample(0.0), data) == []
    assert run(filters.rsample(1.0), data) == data
    with pytest.raises(ConfigError, match="probability"):
        run(filters.rsample(1.5), data)


# --- keys by pattern -------------------------------------------------------------------------


def file_samples() -> list[dict[str, Any]]:
    return [
        {
            "__key__": f"f{i}",
            "__url__": URL,
            "img.JPG": b"jpeg%d" % i,
            "seg.png": b"png%d" % i,
            "cls": b"%d" % i,
            "meta.txt": b"hello %d" % i,
            "obj.pyd": pickle.dumps({"i": i}),
            "raw.bin": b"\x00\x01",
        }
        for i in range(6)
    ]


@pytest.mark.parametrize(
    ("args", "kw"),
    [
        (("*.jpg;*.JPG", "cls"), {}),
        (("seg.*", "*.txt", "nothing"), {"ignore_missing": True}),
        (("*.png;*.JPG",), {"duplicate_is_error": False}),
    ],
)
def test_extract_keys_matches_webdataset(args: tuple[str, ...], kw: dict[str, Any]) -> None:
    both(filters.extract_keys(*args, **kw), wd.extract_keys(*args, **kw), file_samples)


def test_extract_keys_errors() -> None:
    with pytest.raises(ShardFormatError, match="nothing"):
        run(filters.extract_keys("nothing"), file_samples())
    with pytest.raises(ShardFormatError, match="several"):
        run(filters.extract_keys("*.png;*.JPG"), file_samples())


@pytest.mark.parametrize(
    ("args", "kw"),
    [
        ((("image", "*.jpg"),), {"label": "cls"}),
        ((), {"image": "img.*", "txt": "*.txt", "keep_unselected": True}),
        ((("x", "*.png"), ("x", "seg.*")), {"must_match": False}),
    ],
)
def test_rename_keys_matches_webdataset(args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    both(filters.rename_keys(*args, **kw), wd.rename_keys(*args, **kw), file_samples)


def test_rename_keys_errors() -> None:
    with pytest.raises(ShardFormatError, match=r"\*\.gif"):
        run(filters.rename_keys(image="*.gif", label="cls"), file_samples())
    with pytest.raises(ShardFormatError, match="'x'"):
        run(filters.rename_keys(("x", "*.png"), ("x", "*.jpg")), file_samples())
    kw: dict[str, Any] = {"duplicate_is_error": False}
    both(filters.rename_keys(("x", "*.png"), ("x", "*.jpg"), **kw),
         wd.rename_keys(("x", "*.png"), ("x", "*.jpg"), **kw), file_samples)


def upper(stream: Any) -> Any:
    return stream.read().upper()


def test_xdecode_matches_webdataset() -> None:
    kw: dict[str, Any] = {"must_decode": False}
    both(filters.xdecode(**kw), wd.xdecode(**kw), file_samples)
    both(filters.xdecode(("*.jpg", upper), png=upper, cls=False, **kw),
         wd.xdecode(("*.jpg", upper), png=upper, cls=False, **kw), file_samples)
    with pytest.raises(ShardFormatError, match=r"img\.JPG"):
        run(filters.xdecode(), file_samples())


# --- decode, log_keys, Cached ----------------------------------------------------------------


def encoded() -> list[dict[str, Any]]:
    out = []
    for i in range(4):
        buf = io.BytesIO()
        np.save(buf, np.arange(i + 1))
        out.append({"__key__": f"d{i}", "cls": b"%d" % i, "txt": b"t%d" % i,
                    "json": b'{"a": %d}' % i, "npy": buf.getvalue()})
    return out


def test_decode_matches_webdataset() -> None:
    both(filters.decode(), wd.decode(), encoded)
    broken = [{"__key__": "bad", "json": b"{not json"}, *encoded()]
    got = run(filters.decode(handler=handlers.ignore_and_continue), broken)
    assert [s["__key__"] for s in got] == ["d0", "d1", "d2", "d3"]
    with pytest.raises(ValueError, match=r"'bad'"):
        run(filters.decode(), broken)


def test_log_keys_matches_webdataset(tmp_path: Any) -> None:
    ours, theirs = tmp_path / "ours.log", tmp_path / "theirs.log"
    both(filters.log_keys(str(ours)), wdf.log_keys(str(theirs)))
    assert ours.read_text() == theirs.read_text() and ours.read_text().count("\n") == 12
    both(filters.log_keys(), wdf.log_keys())


def test_cached_replays_the_first_epoch() -> None:
    cache = filters.Cached()
    calls = []

    def source() -> Any:
        calls.append(1)
        yield from range(5)

    assert list(cache.run(source())) == list(range(5))
    assert list(cache.run(source())) == list(range(5))
    assert len(calls) == 1


# --- pickling --------------------------------------------------------------------------------


PICKLABLE_STAGES: list[tuple[Any, Callable[[], list[Any]]]] = [
    (filters.info(stream=None, n=0), make_samples),
    (filters.shuffle(7, seed=3), make_samples),
    (filters.detshuffle(7, seed=3), make_samples),
    (filters.select(is_even), make_samples),
    (filters.log_keys(), make_samples),
    (filters.decode(), encoded),
    (filters.map(fails_on_odd, handler=handlers.ignore_and_continue), make_samples),
    (filters.rename(a="x", b="nope;y"), make_samples),
    (filters.associate({"s001": {"l": 1}}), make_samples),
    (filters.map_dict(x=str), make_samples),
    (filters.to_tuple("x y;z"), make_samples),
    (filters.map_tuple(str, None), tuples),
    (filters.batched(5), make_samples),
    (filters.listed(5), make_samples),
    (filters.rsample(0.5, seed=1), make_samples),
    (filters.slice(2, 8), make_samples),
    (filters.extract_keys("*.txt", "cls"), file_samples),
    (filters.rename_keys(image="*.jpg", keep_unselected=True), file_samples),
    (filters.xdecode(must_decode=False), file_samples),
    (filters.Cached(), make_samples),
]


def _stable_id(value: Any) -> str:
    """A test id without memory addresses: every xdist worker must collect the same ids."""
    return getattr(value, "__name__", None) or re.sub(r" at 0x[0-9a-f]+", "", repr(value))[:40]


@pytest.mark.parametrize(("stage", "factory"), PICKLABLE_STAGES, ids=_stable_id)
def test_every_stage_pickles(stage: Any, factory: Callable[[], list[Any]]) -> None:
    clone = pickle.loads(pickle.dumps(stage))
    assert_same(run(clone, factory()), run(stage, factory()))
    unbatch = pickle.loads(pickle.dumps(filters.unbatched()))
    assert len(run(unbatch, run(filters.batched(5), make_samples()))) == 12
    unlist = pickle.loads(pickle.dumps(filters.unlisted()))
    assert len(run(unlist, run(filters.listed(5), make_samples()))) == 12
