"""Exact mid-epoch resume: a run stopped after k batches and restored in a new process goes on
with exactly the batches of the uninterrupted run (three-source spec on the S3 and GCS test
servers, two DataLoader workers, a shuffle buffer of 1,000)."""

from __future__ import annotations

import json
import logging
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import put_source, three_source_spec, write_tar
from stores.base import Store
from zygote import Zygote

import wds_cloud as wds
from wds_cloud.tar import DIRECT_MIN

WORKER = Path(__file__).with_name("resume_worker.py")
BATCHES = 60  # per epoch (resume_worker.py)


def _members(name: str, shard: int, i: int) -> dict[str, bytes]:
    return {"txt": f"{name} {shard} {i}".encode(), "cls": str(i).encode()}


def _put_source(store: Store, tmp: Path, name: str, shards: int, per_shard: int) -> str:
    return put_source(store, tmp, "resume", name, shards, per_shard, _members)


@pytest.fixture
def spec_file(store_factory: Callable[[str], Store], tmp_path: Path) -> Path:
    return three_source_spec(store_factory("s3"), store_factory("gs"), tmp_path, "resume",
                             seed=7, sizes=((6, 300), (4, 200), (3, 150)), members=_members)


def _run(zygote: Zygote, spec: Path, loader: str, mode: str, tmp: Path,
         stops: list[int] | None = None) -> dict[str, Any]:
    """``resume_worker.py`` in a new process (forked from the zygote): the full run and one run
    per stop point, or one run per stop point resumed."""
    ks = ",".join(map(str, stops or [0]))
    out, state = tmp / f"{loader}-{mode}.json", tmp / f"{loader}.state"
    log = tmp / f"{loader}-{mode}.log"
    with log.open("w") as stderr:  # a file, not a pipe: a killed job leaves no reader waiting
        done = zygote.run([sys.executable, str(WORKER), str(spec), loader, mode, str(out),
                           str(state), ks], stdout=stderr, stderr=stderr, timeout=300)
    assert done.returncode == 0, log.read_text()[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["webloader", "stateful"])
def test_a_restored_run_goes_on_with_the_batches_of_the_uninterrupted_one(
        spec_file: Path, tmp_path: Path, loader: str, zygote: Zygote) -> None:
    # early, mid-shard in the buffer's growth, right at and right after an epoch's end; the
    # states are saved in one process (killed after the last), after its uninterrupted run
    # (a loader of its own), and restored in another
    ks = [3, 37, BATCHES, BATCHES + 1] if loader == "webloader" else [37, BATCHES + 1]
    stopped = _run(zygote, spec_file, loader, "stop", tmp_path, ks)
    full = stopped["full"]["stream"]
    assert len(full) == 2 * BATCHES
    assert len({key for keys, _ in full for key in keys}) > 1000
    resumed = _run(zygote, spec_file, loader, "resume", tmp_path, ks)
    for k in ks:
        assert stopped[str(k)]["stream"] == full[:k]
        assert stopped[str(k)]["stream"] + resumed[str(k)]["stream"] == full, (
            f"resumed after {k} batches")
        print(f"{loader}: state after {k} batches: {stopped[str(k)]['state_bytes']} bytes")


def test_the_state_is_small_and_holds_no_sample_bytes(spec_file: Path) -> None:
    def make() -> wds.WebDataset:
        return wds.WebDataset(str(spec_file)).shuffle(1000).to_tuple("__key__", "txt").batched(16)

    dataset = make()
    it = iter(dataset)
    texts: list[bytes] = []
    for _ in range(80):  # 1,280 samples out: the buffer is full
        texts += next(it)[1]
    state = dataset.state_dict()
    size = len(pickle.dumps(state))
    print(f"state: {size} bytes for 1,000 buffered samples")
    assert size <= 4096 + 64 * 1000
    assert not any(t in pickle.dumps(state) for t in texts[-200:])
    assert all(isinstance(v, (int, str)) for v in state.values())
    restored = make()
    restored.load_state_dict(state)
    again = iter(restored)
    assert [next(again) for _ in range(20)] == [next(it) for _ in range(20)]


def _plain_shards(store: Store, tmp: Path) -> str:
    return _put_source(store, tmp, "p", 6, 40)


def _stream(loader: Any, epochs: int, stop: int | None = None) -> tuple[list[Any], Any]:
    out: list[Any] = []
    for _ in range(epochs):
        for keys, _urls in loader:
            out.append(list(keys))
            if stop is not None and len(out) == stop:
                return out, pickle.loads(pickle.dumps(loader.state_dict()))
    return out, None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["shardshuffle", "resampled"])
def test_plain_webdatasets_resume_exactly(store_factory: Callable[[str], Store],
                                          tmp_path: Path, kind: str) -> None:
    s3 = store_factory("s3")
    urls = _plain_shards(s3, tmp_path)

    def make() -> wds.WebLoader:
        if kind == "resampled":
            ds = wds.WebDataset(urls, resampled=True, seed=3, storage_options=s3.storage_options
                                ).shuffle(50).to_tuple("__key__", "__url__").batched(8)
            ds = ds.with_epoch(9)
        else:
            ds = wds.WebDataset(urls, shardshuffle=10, seed=3, storage_options=s3.storage_options
                                ).shuffle(50).to_tuple("__key__", "__url__").batched(8)
        return wds.WebLoader(ds, batch_size=None, num_workers=2)

    # two epochs; stopped early in the first, at its last batch, at the second's first batch
    # and near the end (each pass starts two workers: more stop points cost seconds of CPU)
    full, _ = _stream(make(), 2)
    assert len(full) >= 20
    for k in (1, len(full) // 2, len(full) // 2 + 1, len(full) - 2):
        first, state = _stream(make(), 2, stop=k)
        loader = make()
        loader.load_state_dict(state)
        rest, _ = _stream(loader, 2 - state["epoch"])
        assert first + rest == full, f"{kind}: resumed after {k} batches"


def test_states_that_do_not_fit_name_the_field(spec_file: Path, store_factory: Callable[
        [str], Store], tmp_path: Path) -> None:
    def make(seed: int | None = None, workers: int = 2, batch_size: Any = None,
             spec: Path = spec_file) -> wds.WebLoader:
        ds = (wds.WebDataset(str(spec), seed=seed).shuffle(100)
              .to_tuple("__key__", "__source__").batched(8).with_epoch(nbatches=10))
        return wds.WebLoader(ds, batch_size=batch_size, num_workers=workers)

    loader = make()
    _stream(loader, 1, stop=3)
    state = loader.state_dict()

    fewer = make(workers=1)  # another shape is honoured (tests/pipeline/test_reshape.py):
    fewer.load_state_dict(state)  # the rest of the rank's 10 batches, in one worker
    assert len(_stream(fewer, 1)[0]) == 10 - 3
    with pytest.raises(wds.ResumeError, match="seed") as info:
        make(seed=8).load_state_dict(state)
    assert info.value.field == "seed"
    other = tmp_path / "other.yaml"
    spec = yaml.safe_load(spec_file.read_text())
    spec["datasets"][0]["shards"] = spec["datasets"][0]["shards"].replace("{000..", "{001..")
    other.write_text(yaml.safe_dump(spec))
    changed = make(spec=other)  # a kept source's shards changed under it (a weight would not)
    with pytest.raises(wds.ResumeError, match=r"the shards of source 'a' changed") as info:
        changed.load_state_dict(state)  # refused at once, not in the workers
    assert info.value.field == "src.a.shards"
    # reseed: a WARNING, and the epoch goes on with fresh streams
    reseeded = make(spec=other)
    reseeded.load_state_dict(state, on_mismatch="reseed")
    assert len(_stream(reseeded, 1)[0]) >= 1


def test_a_changed_object_is_a_resume_error(store_factory: Callable[[str], Store],
                                            tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    s3 = store_factory("s3")
    urls = _put_source(s3, tmp_path, "v", 2, 60)

    def make() -> wds.WebDataset:
        return wds.WebDataset(urls, shardshuffle=False, storage_options=s3.storage_options
                              ).to_tuple("__key__", "txt").batched(5)

    dataset = make()
    it = iter(dataset)
    for _ in range(3):
        next(it)
    state = dataset.state_dict()
    assert state["src.0.version"]  # the ETag seen at open
    path = tmp_path / "new.tar"
    write_tar(path, [(f"new-{i:04d}", {"txt": b"changed"}) for i in range(60)])
    s3.put(state["src.0.url"].split("/", 3)[-1], path.read_bytes())
    restored = make()
    restored.load_state_dict(state)
    with pytest.raises(wds.ResumeError, match="changed") as info:
        next(iter(restored))
    assert info.value.field == "version"
    reseeded = make()
    reseeded.load_state_dict(state, on_mismatch="reseed")
    with caplog.at_level(logging.WARNING):
        _keys, texts = next(iter(reseeded))
    assert "changed since the state was saved" in caplog.text
    assert texts[0] == b"changed"  # the new object, read from its start


def test_a_restore_reads_no_finished_shard_and_starts_the_current_one_at_its_offset(
        store_factory: Callable[[str], Store], tmp_path: Path) -> None:
    s3 = store_factory("s3")
    urls = _put_source(s3, tmp_path, "g", 6, 40)  # 40 samples a shard

    def make() -> wds.WebDataset:
        return wds.WebDataset(urls, shardshuffle=False, storage_options=s3.storage_options
                              ).to_tuple("__key__").batched(5)

    dataset = make()
    it = iter(dataset)
    for _ in range(26):  # 130 samples: three shards done, the fourth 10 samples in
        next(it)
    state = dataset.state_dict()
    assert (state["src.0.started"], state["src.0.ordinal"]) == (4, 10)
    assert state["src.0.offset"] > 0
    expected = list(it)
    wds.reset_io_stats()
    restored = make()
    restored.load_state_dict(state)
    assert list(restored) == expected
    stats = wds.io_stats()
    assert stats["requests"] == 3, stats  # the current shard (ranged) and the two after it
    size = sum(len(s3.get(f"resume/g-{i:03d}.tar") or b"") for i in range(3, 6))
    assert stats["bytes_read"] < size - state["src.0.offset"] + 1024


def test_compressed_shards_resume_by_reading_the_shard_start_again(tmp_path: Path) -> None:
    with wds.ShardWriter(str(tmp_path / "z-%03d.tar.gz"), maxcount=30) as sink:
        for i in range(90):
            sink.write({"__key__": f"z{i:04d}", "txt": str(i).encode()})
    urls = str(tmp_path / "z-{000..002}.tar.gz")

    def make() -> wds.WebDataset:
        return wds.WebDataset(urls, shardshuffle=False).shuffle(20).to_tuple("__key__")

    dataset = make()
    it = iter(dataset)
    head = [next(it) for _ in range(45)]
    state = dataset.state_dict()
    assert state["src.0.offset"] == -1  # no byte offset into a compressed stream
    expected = list(it)
    restored = make()
    restored.load_state_dict(state)
    assert list(restored) == expected
    assert len(head) + len(expected) == 90


def test_another_world_size_is_named(spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def make() -> wds.WebDataset:
        return wds.WebDataset(str(spec_file)).to_tuple("__key__").batched(4)

    dataset = make()
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    restored = make()
    restored.load_state_dict(state)
    with pytest.raises(wds.ResumeError, match="world_size") as info:
        next(iter(restored))
    assert info.value.field == "world_size"


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_samples_of_large_members_resume_exactly(tmp_path: Path, suffix: str) -> None:
    """Large members are read one by one and a sample is handed on as soon as the next
    member's header shows a new key: the saved position must still be exact."""
    big = DIRECT_MIN + 100
    with wds.ShardWriter(str(tmp_path / f"l-%03d{suffix}"), maxcount=7) as sink:
        for i in range(21):
            sample = {"__key__": f"l{i:04d}", "bin": bytes([i]) * (big + i)}
            if i % 3:
                sample["cls"] = str(i).encode()  # a small member after the large one
            sink.write(sample)
    urls = str(tmp_path / f"l-{{000..002}}{suffix}")

    def make() -> wds.WebDataset:
        return wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "bin")

    full = list(make())
    assert [k for k, _ in full] == [f"l{i:04d}" for i in range(21)]
    for stop in (1, 6, 7, 10, 20):
        dataset = make()
        it = iter(dataset)
        head = [next(it) for _ in range(stop)]
        state = dataset.state_dict()
        restored = make()
        restored.load_state_dict(state)
        assert head + list(restored) == full, f"resumed after {stop} samples"
