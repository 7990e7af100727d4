"""WebDataset, FluidInterface/FluidWrapper and the gopen-bound tar functions (wds_cloud.dataset).

Expected results come from webdataset 1.0.2 run on the same shards, or from the data the tests
wrote themselves.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import webdataset
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError


def make_shards(directory: Path, nshards: int = 4, per_shard: int = 5) -> list[str]:
    """Shards of samples with ``txt``, ``cls`` and ``json`` members; returns their paths."""
    def samples(s: int) -> Iterator[tuple[str, dict[str, bytes]]]:
        for i in range(per_shard):
            key = f"s{s:03d}_{i:03d}"
            yield key, {"txt": f"text of {key}".encode(), "cls": str(s * 100 + i).encode(),
                        "json": f'{{"shard": {s}, "index": {i}}}'.encode()}

    return [write_tar(directory / f"data-{s:03d}.tar", samples(s)) for s in range(nshards)]


def all_keys(nshards: int = 4, per_shard: int = 5) -> list[str]:
    return [f"s{s:03d}_{i:03d}" for s in range(nshards) for i in range(per_shard)]


def keys_of(samples: Any) -> list[str]:
    return [s["__key__"] for s in samples]


def quiet(lib: Any, *args: Any, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lib.WebDataset(*args, **kw)


@pytest.fixture
def urls(tmp_path: Path) -> list[str]:
    return make_shards(tmp_path)


# ---------------------------------------------------------------- reading like webdataset


def test_samples_equal_webdataset(urls: list[str]) -> None:
    ours = list(wds.WebDataset(urls, shardshuffle=False))
    theirs = list(webdataset.WebDataset(urls, shardshuffle=False))
    assert ours == theirs
    assert keys_of(ours) == all_keys()


def test_brace_pattern_urls(tmp_path: Path, urls: list[str]) -> None:
    spec = str(tmp_path / "data-{000..003}.tar")
    assert list(wds.WebDataset(spec, shardshuffle=False)) == list(
        webdataset.WebDataset(spec, shardshuffle=False)
    )


def test_shard_list_object_as_urls(urls: list[str]) -> None:
    ds = wds.WebDataset(wds.SimpleShardList(urls), shardshuffle=False)
    assert keys_of(ds) == all_keys()


def test_select_and_rename_files(urls: list[str]) -> None:
    def select(name: str) -> bool:
        return not name.endswith(".json")

    def rename(name: str) -> str:
        return name.replace(".txt", ".text")

    kw: dict[str, Any] = {"shardshuffle": False, "select_files": select, "rename_files": rename}
    ours = list(wds.WebDataset(urls, **kw))
    assert ours == list(webdataset.WebDataset(urls, **kw))
    assert set(ours[0]) >= {"text", "cls"} and "json" not in ours[0]


def test_tarfile_functions_match_webdataset(urls: list[str]) -> None:
    def drop_local(samples: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in s.items() if k != "__local_path__"} for s in samples]

    ours = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
    theirs = webdataset.DataPipeline(
        webdataset.SimpleShardList(urls), webdataset.tarfile_to_samples()
    )
    assert drop_local(ours) == drop_local(theirs)
    direct = drop_local(wds.tarfile_samples(iter([{"url": u} for u in urls])))
    assert direct == drop_local(theirs)
    opened = list(wds.url_opener(iter([{"url": urls[0]}])))
    assert opened[0]["stream"].read(512) == Path(urls[0]).read_bytes()[:512]
    opened[0]["stream"].close()


def test_groupings_written_for_webdataset_0_2_read_the_expanders_items(urls: list[str]) -> None:
    """After each shard ``tar_file_expander`` yields webdataset 1.0.2's end-of-shard ``{}``
    (1.0.2's own ``group_by_keys`` ends the sample there). A grouping written for webdataset
    0.2, which had no such item, reads ``fname`` and ``data`` of every item, as open_clip's
    ``group_by_keys_nothrow`` does (its training failed at the first batch on 1.0.2 with
    ``KeyError: 'fname'``); it gets a name that keys nothing and skips the marker."""
    def files() -> Any:
        tariterators = wds.tariterators  # open_clip's imports: webdataset.tariterators
        return tariterators.tar_file_expander(
            tariterators.url_opener(iter([{"url": u} for u in urls])))

    def grouped_as_in_webdataset_0_2(items: Any) -> list[dict[str, Any]]:
        samples: list[dict[str, Any]] = []
        for item in items:
            fname, value = item["fname"], item["data"]
            prefix, suffix = wds.tariterators.base_plus_ext(fname)
            if prefix is None:
                continue
            if not samples or samples[-1]["__key__"] != prefix:
                samples.append({"__key__": prefix, "__url__": item["__url__"]})
            samples[-1][suffix] = value
        return samples

    markers = [item for item in files() if "fname" not in item]
    assert len(markers) == len(urls) and all(m == {} and not m for m in markers)
    ours = list(wds.tarfile_samples(iter([{"url": u} for u in urls])))
    keep = ("__key__", "__url__", "txt", "cls", "json")
    assert grouped_as_in_webdataset_0_2(files()) == [{k: s[k] for k in keep if k in s}
                                                     for s in ours]
    assert [s["__key__"] for s in webdataset.tariterators.group_by_keys(files())] == \
        [s["__key__"] for s in ours]


def test_is_a_torch_iterable_dataset(urls: list[str]) -> None:
    import torch.utils.data as torch_data
    assert isinstance(wds.WebDataset(urls, shardshuffle=False), torch_data.IterableDataset)
    assert isinstance(wds.FluidWrapper([1]), torch_data.IterableDataset)


def test_works_without_torch(urls: list[str]) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import wds_cloud as wds\n"
        f"ds = wds.WebDataset({urls!r}, shardshuffle=False).map(lambda s: s['__key__'])\n"
        "print(len(list(ds)), 'torch' in sys.modules and sys.modules['torch'] is not None)\n"
        "print(wds.worker_info() == wds.WorkerInfo())\n"
        "try:\n"
        "    wds.WebLoader(ds)\n"
        "except wds.MissingDependencyError as exc:\n"
        "    print('torch' in str(exc))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["20", "False", "True", "True"]


def test_constructing_does_not_open_anything(tmp_path: Path) -> None:
    ds = wds.WebDataset(str(tmp_path / "missing-{0..3}.tar"), shardshuffle=False)
    with pytest.raises(FileNotFoundError):
        list(ds)


# ---------------------------------------------------------------- shard shuffling and seeds


def test_shardshuffle_same_multiset_new_order_each_epoch(tmp_path: Path) -> None:
    urls = make_shards(tmp_path, nshards=12, per_shard=2)
    ds = wds.WebDataset(urls, shardshuffle=10, seed=1)
    epochs = [keys_of(ds) for _ in range(3)]
    expected = sorted(keys_of(quiet(webdataset, urls, shardshuffle=10, seed=1)))
    for keys in epochs:
        assert sorted(keys) == expected
    assert len({tuple(k) for k in epochs}) == 3
    again = wds.WebDataset(urls, shardshuffle=10, seed=1)
    assert [keys_of(again) for _ in range(3)] == epochs
    assert keys_of(wds.WebDataset(urls, shardshuffle=10, seed=2)) != epochs[0]


def test_detshuffle_and_set_epoch(tmp_path: Path) -> None:
    urls = make_shards(tmp_path, nshards=12, per_shard=2)
    ds = wds.WebDataset(urls, shardshuffle=10, detshuffle=True, seed=4)
    first = keys_of(ds)
    assert sorted(first) == sorted(all_keys(12, 2))
    ds.set_epoch(0)
    assert keys_of(pickle.loads(pickle.dumps(ds))) == first
    ds.set_epoch(5)
    assert keys_of(ds) != first


def test_seeded_shuffles_give_webdataset_orders() -> None:
    """For the same generator or seed, the buffer shuffle draws what webdataset 1.0.2's
    draws: a ``shuffle`` stage, ``filters._shuffle`` (which open_clip's ``detshuffle2`` calls
    with ``random.Random(seed)``) and ``detshuffle`` epoch after epoch keep their orders when
    a job moves between the libraries; a buffer below 1 leaves the order alone in both."""
    import random

    for bufsize, initial, n in [(1000, 100, 300), (10, 3, 57), (5, 100, 40), (1, 1, 9),
                                (0, 5, 9), (-2, 1, 9), (7, 0, 30), (3, 3, 0)]:
        theirs = list(webdataset.filters._shuffle(iter(range(n)), bufsize, initial,
                                                  random.Random(bufsize)))
        ours = list(wds.filters._shuffle(iter(range(n)), bufsize, initial,
                                         random.Random(bufsize)))
        assert ours == theirs, (bufsize, initial)
        stage = (webdataset.shuffle(bufsize, initial=initial, seed=3),
                 wds.shuffle(bufsize, initial=initial, seed=3))
        assert [list(s(iter(range(n)))) for s in stage[1:]] == [list(stage[0](iter(range(n))))]
    theirs_det, ours_det = webdataset.detshuffle(20, 5, seed=4), wds.detshuffle(20, 5, seed=4)
    for _epoch in range(3):
        assert list(ours_det.run(iter(range(80)))) == list(theirs_det.run(iter(range(80))))


def test_unseeded_mixes_and_samples_follow_the_global_random_as_webdataset(
        urls: list[str]) -> None:
    """Without ``seed``/``rng``, ``RandomMix`` and ``rsample`` draw from the global ``random``
    as webdataset 1.0.2's do: after the same ``random.seed``, the same mix and the same kept
    samples (what a job that seeds everything, or torch seeding each worker's ``random``,
    relies on)."""
    import random

    sources = [[f"a{i}" for i in range(50)], [f"b{i}" for i in range(80)],
               [f"c{i}" for i in range(30)]]
    for probs, longest in [(None, False), (None, True), ([1, 3, 1], False),
                           ([0.2, 0.3, 0.5], True), ([1, 0, 2], False)]:
        mixes = []
        for lib in (webdataset, wds):
            random.seed(7)
            mixes.append(list(lib.RandomMix(sources, probs, longest=longest)))
        assert mixes[1] == mixes[0], (probs, longest)
    mixes = []  # datasets made after the seed: webdataset's draw a seed of the global random
    for lib in (webdataset, wds):
        random.seed(7)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = [lib.WebDataset(urls[:1], shardshuffle=False) for _ in range(2)]
        mixes.append([s["__key__"] for s in lib.RandomMix(made)])
    assert mixes[1] == mixes[0]
    kept = []
    for lib in (webdataset, wds):
        random.seed(3)
        kept.append(list(lib.filters._rsample(iter(range(500)), 0.3)))
        random.seed(3)
        kept.append(list(lib.tariterators.shardlist([f"s{i}.tar" for i in range(30)],
                                                    shuffle=True)))
    assert kept[2:] == kept[:2]


def test_seed_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = make_shards(tmp_path, nshards=12, per_shard=1)
    monkeypatch.setenv("WDS_SEED", "77")
    a = keys_of(wds.WebDataset(urls, shardshuffle=10))
    b = keys_of(wds.WebDataset(urls, shardshuffle=10))
    assert a == b == keys_of(wds.WebDataset(urls, shardshuffle=10, seed=77))
    monkeypatch.setenv("WDS_SEED", "abc")
    with pytest.raises(ConfigError, match="WDS_SEED"):
        wds.WebDataset(urls, shardshuffle=10)


def test_shardshuffle_warnings_match_webdataset(urls: list[str]) -> None:
    for kw in ({}, {"shardshuffle": True}, {"resampled": True, "shardshuffle": 5}):
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            wds.WebDataset(urls, **kw)
        with warnings.catch_warnings(record=True) as theirs:
            warnings.simplefilter("always")
            webdataset.WebDataset(urls, **kw)
        assert [str(w.message) for w in ours] == [str(w.message) for w in theirs][: len(ours)]
        assert ours, kw
    with pytest.raises(ConfigError, match="shardshuffle"):
        wds.WebDataset(urls, shardshuffle=-3)


# ---------------------------------------------------------------- resampling, repeat, epochs


def test_resampled(urls: list[str]) -> None:
    ds = wds.WebDataset(urls, resampled=True).with_epoch(50)
    keys = keys_of(ds)
    assert len(keys) == 50 and set(keys) <= set(all_keys())
    assert keys_of(ds) != keys  # no seed: webdataset's non-deterministic resampling
    seeded = [keys_of(wds.WebDataset(urls, resampled=True, seed=3).with_epoch(50))
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    mode = wds.WebDataset(urls, mode="resampled", shardshuffle=False)
    assert len(list(itertools.islice(mode, 30))) == 30
    with pytest.raises(ConfigError, match="resampled=True"):
        wds.WebDataset(wds.SimpleShardList(urls), resampled=True)


def test_repeat(urls: list[str]) -> None:
    ds = wds.WebDataset(urls, shardshuffle=False, repeat=True)
    keys = [s["__key__"] for s in itertools.islice(ds, 50)]
    assert keys == (all_keys() * 3)[:50]


def test_with_epoch_and_with_length(urls: list[str]) -> None:
    ds = wds.WebDataset(urls, shardshuffle=False).with_epoch(7).with_length(7, silent=True)
    assert keys_of(ds) == all_keys()[:7]
    assert len(ds) == 7
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy) == 7 and keys_of(copy) == all_keys()[:7]


# ---------------------------------------------------------------- splitting and empty checks


def test_split_by_node_env(urls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ours = keys_of(wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node))
        theirs = keys_of(webdataset.WebDataset(
            urls, shardshuffle=False, nodesplitter=webdataset.split_by_node))
        assert ours == theirs
        seen += ours
    assert sorted(seen) == all_keys()
    with pytest.raises(ValueError, match="single-node"):
        list(wds.WebDataset(urls, shardshuffle=False))
    assert len(list(wds.WebDataset(urls, shardshuffle=False, nodesplitter=None))) == 20


def test_empty_check(urls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER", "5")
    monkeypatch.setenv("NUM_WORKERS", "6")
    with pytest.raises(ConfigError, match=r"no samples found.*worker 5/6.*empty_check=False"):
        list(wds.WebDataset(urls, shardshuffle=False))
    assert list(wds.WebDataset(urls, shardshuffle=False, empty_check=False)) == []


# ---------------------------------------------------------------- arguments refused


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"mode": "unlink"}, "mode"),
    ],
)
def test_unsupported_arguments_are_refused(urls: list[str], kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        wds.WebDataset(urls, shardshuffle=False, **kw)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("train.yaml", "train.yaml: cannot read the spec"),
        ("train.yml", "train.yml: cannot read the spec"),
        ("train.json", "train.json: cannot read the spec"),
        ({"datasets": []}, "<dict>: datasets: no sources"), (42, "type int"),
    ],
)
def test_unsupported_urls_are_refused(spec: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        wds.WebDataset(spec, shardshuffle=False)
    with pytest.raises(wds.ShardNotFoundError, match=r"no shards .* in '/data/shards/'"):
        wds.WebDataset("/data/shards/", shardshuffle=False)  # a directory: its shards
    with pytest.raises(ConfigError, match="directory"):  # a queue on it (DirectoryShardList)
        wds.WebDataset("/data/shards/", mode="keep")


# ---------------------------------------------------------------- handlers, verbose, context


def test_handler_skips_a_corrupt_shard(tmp_path: Path) -> None:
    urls = make_shards(tmp_path, nshards=3, per_shard=2)
    Path(urls[1]).write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(ValueError):
        list(wds.WebDataset(urls, shardshuffle=False))
    ds = wds.WebDataset(urls, shardshuffle=False, handler=wds.ignore_and_continue)
    assert keys_of(ds) == ["s000_000", "s000_001", "s002_000", "s002_001"]


def test_verbose_logs_each_shard(urls: list[str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="wds_cloud.dataset"):
        list(wds.WebDataset(urls, shardshuffle=False, verbose=True))
    assert sum("opening shard" in r.getMessage() for r in caplog.records) == 4


def test_context_manager(urls: list[str]) -> None:
    with wds.WebDataset(urls, shardshuffle=False) as ds:
        assert len(keys_of(ds)) == 20


# ---------------------------------------------------------------- fluid interface


def chain(lib: Any, urls: list[str]) -> list[Any]:
    ds = (
        quiet(lib, urls, shardshuffle=False)
        .decode()
        .select(lambda s: s["cls"] % 3 != 0)
        .rename(label="cls", text="txt")
        .map_dict(label=lambda c: c * 2)
        .map(lambda s: {**s, "extra": len(s["text"])})
        .to_tuple("label", "text", "json", "extra")
        .map_tuple(lambda x: x + 1, str.upper, lambda j: j["index"], lambda e: e)
        .slice(1, 12)
        .batched(4)
        .unbatched()
        .listed(3)
        .unlisted()
    )
    return list(ds)


def test_fluid_chain_matches_webdataset(urls: list[str]) -> None:
    ours = chain(wds, urls)
    assert ours == chain(webdataset, urls)
    assert len(ours) == 11


def test_batched_collation_matches_webdataset(urls: list[str]) -> None:
    def batches(lib: Any) -> list[Any]:
        ds = quiet(lib, urls, shardshuffle=False).decode().to_tuple("cls", "txt").batched(6)
        return [(b[0].tolist(), b[1]) for b in ds]

    assert batches(wds) == batches(webdataset)


def test_fluid_keys_and_files(urls: list[str], tmp_path: Path) -> None:
    ds = wds.WebDataset(urls, shardshuffle=False)
    extracted = list(ds.extract_keys("t?t", "c*"))
    assert extracted == list(quiet(webdataset, urls, shardshuffle=False).extract_keys("t?t", "c*"))
    assert len(extracted) == 20 and extracted[0] == (b"text of s000_000", b"0")
    renamed = list(ds.rename_keys(text="t?t", keep_unselected=True))
    assert renamed == list(quiet(webdataset, urls, shardshuffle=False).rename_keys(
        text="t?t", keep_unselected=True))
    assert renamed[0]["text"] == b"text of s000_000"
    log = tmp_path / "keys.log"
    assert len(list(ds.log_keys(str(log)))) == 20
    assert len(log.read_text().splitlines()) == 20
    assert ds.shuffle(0) is ds
    shuffled = keys_of(ds.shuffle(8, seed=3))
    assert sorted(shuffled) == all_keys() and shuffled != all_keys()
    sub = keys_of(ds.rsample(0.5))
    assert set(sub) <= set(all_keys())
    cached = ds.mcached()
    assert keys_of(cached) == keys_of(cached) == all_keys()
    recorded = ds.lmdb_cached(str(tmp_path / "samples.lmdb"))
    assert keys_of(recorded) == keys_of(recorded) == all_keys()
    assert (tmp_path / "samples.lmdb").is_dir()
    assert ds.xdecode(txt=lambda b: b.decode()) is not ds


def test_compose_leaves_the_original_alone(urls: list[str]) -> None:
    ds = wds.WebDataset(urls, shardshuffle=False)
    n = len(ds.pipeline)
    batched = ds.batched(5)
    assert len(ds.pipeline) == n and len(batched.pipeline) == n + 1
    assert type(batched) is type(ds)


def test_fluid_wrapper() -> None:
    def run(lib: Any) -> list[list[int]]:
        samples = [{"__key__": str(i), "x": i} for i in range(10)]
        ds = lib.FluidWrapper(samples).map_dict(x=lambda v: v * 10).to_tuple("x").batched(4)
        return [b[0].tolist() for b in ds]

    assert run(wds) == run(webdataset)


# ---------------------------------------------------------------- record files via gopen


def test_record_files_bound_to_gopen(tmp_path: Path) -> None:
    import cbor2
    import msgpack
    records = [{"__key__": f"k{i}", "txt": f"value {i}".encode()} for i in range(5)]
    cbor_path, mp_path = tmp_path / "a.cbors", tmp_path / "a.msgpacks"
    with open(cbor_path, "wb") as f:
        for r in records:
            cbor2.dump(r, f)
    with open(mp_path, "wb") as f:
        for r in records:
            f.write(msgpack.packb(r))
    from wds_cloud import dataset as compat

    for fn, path in ((compat.cbors_to_samples, cbor_path), (compat.msgpacks_to_samples, mp_path)):
        samples = list(fn(iter([{"url": str(path)}])))
        assert [(s["__key__"], s["txt"]) for s in samples] == [
            (r["__key__"], r["txt"]) for r in records]
        assert all(s["__url__"] == str(path) for s in samples)
