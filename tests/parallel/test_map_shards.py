"""``wds_cloud.map_shards``: per-shard transforms on Dask (one LocalCluster for the module),
process and thread pools; retries visible in the report, shards that keep failing named at
the end with no output, every other shard complete."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import shardfns
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError, ShardTaskError
from wds_cloud.parallel import open_executor

N_SHARDS, PER_SHARD = 8, 6


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A LocalCluster of 2 single-threaded worker processes on 127.0.0.1."""
    with open_executor("dask", workers=2) as client:
        yield client


def _shards(root: Path, n: int = N_SHARDS, per_shard: int = PER_SHARD) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(n):
        write_tar(root / f"in-{s:03d}.tar", [
            (f"s{s}-{i:04d}", {"txt": f"shard {s} sample {i}".encode(), "cls": str(i).encode(),
                               "json": b'{"i": %d}' % i}) for i in range(per_shard)])
    return str(root / f"in-{{000..{n - 1:03d}}}.tar")


def _read(url: str) -> list[dict[str, Any]]:
    return list(wds.WebDataset(url, shardshuffle=False))


def _check_shouted(out: Path, shards: list[int]) -> None:
    for s in shards:
        samples = _read(str(out / f"out-{s:03d}.tar"))
        assert [x["__key__"] for x in samples] == [f"s{s}-{i:04d}" for i in range(PER_SHARD)]
        assert samples[2]["txt"] == f"SHARD {s} SAMPLE 2".encode() and samples[2]["cls"] == b"2"
        assert "json" not in samples[2]


def test_a_shard_failing_once_is_retried_on_dask(dask_client: Any, tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in")
    seen: list[str] = []
    fn = functools.partial(shardfns.fail_once, str(tmp_path), "in-005.tar")
    report = wds.map_shards(fn, inputs, str(tmp_path / "out" / "out-%03d.tar"),
                            executor=dask_client, on_shard=lambda s: seen.append(s.output))
    assert report.ok and len(report.shards) == N_SHARDS and len(seen) == N_SHARDS
    victim = str(tmp_path / "in" / "in-005.tar")
    assert list(report.retried) == [victim]
    assert "RuntimeError: first attempt at in-005.tar fails" in report.retried[victim][0]
    assert report.shards[5].attempts == 2 and report.shards[4].attempts == 1
    assert (tmp_path / "failed-in-005.tar").read_text() != str(os.getpid())  # another process
    assert report.samples == N_SHARDS * PER_SHARD
    assert [s.samples_in for s in report.shards] == [PER_SHARD] * N_SHARDS
    _check_shouted(tmp_path / "out", list(range(N_SHARDS)))
    assert report.shards[0].size == os.path.getsize(tmp_path / "out" / "out-000.tar")


def test_a_shard_that_always_fails_is_named_and_leaves_no_output(
        dask_client: Any, tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in")
    out = tmp_path / "out"
    fn = functools.partial(shardfns.fail_midway, "in-003.tar")
    with pytest.raises(ShardTaskError) as info:
        wds.map_shards(fn, inputs, str(out / "out-%03d.tar"), executor=dask_client, retries=1)
    victim = str(tmp_path / "in" / "in-003.tar")
    assert list(info.value.failed) == [victim]
    assert info.value.failed[victim].startswith("ValueError: in-003.tar always fails (at "
                                                "shardfns.py:")
    assert "1 of 8 shards failed after 2 attempts" in str(info.value) and victim in str(
        info.value)
    report = info.value.report
    assert report.shards[3].attempts == 2 and not report.shards[3].ok
    assert sorted(os.listdir(out)) == [f"out-{s:03d}.tar" for s in range(N_SHARDS) if s != 3]
    _check_shouted(out, [s for s in range(N_SHARDS) if s != 3])


def test_decoded_fields_are_encoded_back_on_a_process_pool(tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in", 3)
    with ProcessPoolExecutor(2) as pool:
        report = wds.map_shards(shardfns.shout_decoded, inputs, str(tmp_path / "o-%d.tar"),
                                executor=pool, decode=True)
    assert report.ok and report.samples == 3 * PER_SHARD
    sample = _read(str(tmp_path / "o-1.tar"))[4]
    assert sample["txt"] == b"SHARD 1 SAMPLE 4" and sample["json"] == b'{"i": 4, "seen": true}'


def test_a_process_pool_refuses_a_lambda_before_running(tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in", 2)
    with ProcessPoolExecutor(1) as pool, pytest.raises(ConfigError, match="top level of a"):
        wds.map_shards(lambda s: s, inputs, str(tmp_path / "o-%d.tar"), executor=pool)
    assert not list(tmp_path.glob("o-*.tar"))


def test_many_or_no_samples_out_of_one_on_threads(tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in", 4)
    with ThreadPoolExecutor(3) as pool:
        report = wds.map_shards(shardfns.split_in_two, inputs,
                                lambda url: url.replace("/in/", "/out/"), executor=pool)
    assert [(s.samples_in, s.samples) for s in report.shards] == [(PER_SHARD, PER_SHARD)] * 4
    keys = [s["__key__"] for s in _read(str(tmp_path / "out" / "in-002.tar"))]
    assert keys == ["s2-0000-a", "s2-0000-b", "s2-0002-a", "s2-0002-b", "s2-0004-a",
                    "s2-0004-b"]


def test_a_whole_shard_function(tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in", 2)
    report = wds.map_shards(shardfns.keep_first_two, inputs, str(tmp_path / "o-{a,b}.tar"),
                            whole_shard=True)
    assert [s.samples for s in report.shards] == [2, 2]
    assert [s["json"] for s in _read(str(tmp_path / "o-b.tar"))] == [b'{"of": 6}'] * 2


@pytest.mark.parametrize(("outputs", "message"), [
    ("o-{a,b}.tar", "3 input shards but 2 outputs"),
    ("same.tar", "3 input shards but 1 output;"),
    (lambda url: "same.tar", "same output"),
    (lambda url: url, "is also an input"),
])
def test_outputs_are_checked_before_anything_runs(
        tmp_path: Path, outputs: str | Callable[[str], str], message: str) -> None:
    inputs = _shards(tmp_path / "in", 3)
    with pytest.raises(ConfigError, match=message):
        wds.map_shards(shardfns.shout, inputs, outputs)


def test_a_missing_local_input_stops_everything(tmp_path: Path) -> None:
    inputs = _shards(tmp_path / "in", 2)
    with pytest.raises(wds.ShardNotFoundError, match=r"in-002\.tar"):
        wds.map_shards(shardfns.shout, inputs.replace("001", "002"), str(tmp_path / "o-%d.tar"))
    assert not list(tmp_path.glob("o-*"))


def test_reading_and_writing_on_s3(s3_server: Any, tmp_path: Path) -> None:
    store = s3_server.new_store()
    local = _shards(tmp_path / "in", 3)
    for s in range(3):
        store.put(f"in/in-{s:03d}.tar", (tmp_path / "in" / f"in-{s:03d}.tar").read_bytes())
    with ThreadPoolExecutor(2) as pool:
        report = wds.map_shards(shardfns.shout, store.url("in/in-*.tar"),
                                store.url("out/o-%03d.tar"), executor=pool,
                                storage_options=store.storage_options)
    assert report.ok and [s.input for s in report.shards] == [
        store.url(f"in/in-{s:03d}.tar") for s in range(3)]
    here = wds.map_shards(shardfns.shout, local, str(tmp_path / "o-%03d.tar"))
    for s in range(3):  # the same bytes, wherever read and written
        assert store.get(f"out/o-{s:03d}.tar") == (tmp_path / f"o-{s:03d}.tar").read_bytes()
    assert here.samples == report.samples == 3 * PER_SHARD


def test_a_function_the_workers_cannot_load_fails_its_shards(
        dask_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its module is importable here only: each shard fails naming it (Dask would wait
    forever for a task whose arguments a worker cannot unpickle)."""
    (tmp_path / "only_here.py").write_text("def f(sample):\n    return sample\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here  # type: ignore[import-not-found]

    inputs = _shards(tmp_path / "in", 2)
    with pytest.raises(ShardTaskError) as info:
        wds.map_shards(only_here.f, inputs, str(tmp_path / "o-%d.tar"), executor=dask_client,
                       retries=0)
    assert len(info.value.failed) == 2
    assert all("No module named 'only_here'" in e for e in info.value.failed.values())
