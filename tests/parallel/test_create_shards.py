"""``wds_cloud.create_shards`` and its steps: samples grouped as readers group them, shard
boundaries planned from sizes, the same bytes on every executor, atomic and retried writes."""

from __future__ import annotations

import hashlib
import os
import tarfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import wds_cloud as wds
from wds_cloud.errors import ConfigError, ShardTaskError
from wds_cloud.parallel import (
    ShardPlan,
    open_executor,
    plan_shards,
    run_tasks,
    scan_directory,
    write_shards,
)


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _digests(paths: list[str]) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


def _images(root: Path, n: int = 30) -> Path:
    """``n`` samples of three files of varied sizes, some in subdirectories."""
    files = {}
    for i in range(n):
        stem = f"{'sub/' if i % 3 == 0 else ''}img{i:03d}"
        files[f"{stem}.jpg"] = bytes([i]) * (100 + 97 * i)
        files[f"{stem}.cls"] = str(i % 5).encode()
        files[f"{stem}.meta.json"] = b'{"i": %d}' % i
    return _tree(root, files)


def test_samples_are_grouped_as_readers_group_them(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", {
        "a.jpg": b"A", "a.txt": b"a", "a.s/b.jpg": b"B",  # a.s/ sorts between a's members
        "dir.v2/x.y.z": b"X", "x.TXT": b"x", "sub/a.jpg": b"SA",
        ".hidden.txt": b"h", "sub/.DS_Store": b"d", ".git/c.txt": b"g",
        "README": b"r", "sub/Makefile": b"m", "__meta__/k.txt": b"k", "__pycache__/m.pyc": b"p",
    })
    scan = scan_directory(src)
    assert [(s.key, [f[0] for f in s.files]) for s in scan.samples] == [
        ("a", ["jpg", "txt"]), ("a.s/b", ["jpg"]), ("dir.v2/x", ["y.z"]), ("sub/a", ["jpg"]),
        ("x", ["TXT"])]
    assert scan.skipped == {"hidden": [".git/", ".hidden.txt", "sub/.DS_Store"],
                            "no_extension": ["README", "sub/Makefile"],
                            "reserved": ["__meta__/k.txt", "__pycache__/m.pyc"]}
    report = wds.create_shards(src, str(tmp_path / "out-%02d.tar"))
    assert report.samples == 5 and report.skipped == scan.skipped
    read = list(wds.WebDataset(str(tmp_path / "out-00.tar"), shardshuffle=False))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in read] == [
        ("a", ["jpg", "txt"]), ("a.s/b", ["jpg"]), ("dir.v2/x", ["y.z"]), ("sub/a", ["jpg"]),
        ("x", ["txt"])]
    assert read[0]["jpg"] == b"A" and read[2]["y.z"] == b"X"
    with tarfile.open(tmp_path / "out-00.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a.jpg", "a.txt", "a.s/b.jpg", "dir.v2/x.y.z",
                                         "sub/a.jpg", "x.TXT"]
    assert {(m.mtime, m.uid, m.gid) for m in members} == {(0, 0, 0)}


def test_fields_differing_in_case_are_refused(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", {"a.JPG": b"1", "a.jpg": b"2", "b.jpg": b"3"})
    with pytest.raises(ConfigError, match=r"a\.JPG and a\.jpg.*rename one"):
        scan_directory(src)


def test_a_missing_or_empty_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        wds.create_shards(tmp_path / "nope", str(tmp_path / "o-%d.tar"))
    _tree(tmp_path / "empty", {".hidden.txt": b"x", "README": b"r"})
    with pytest.raises(ConfigError, match=r"no files to pack.*1 hidden, 1 without an extension"):
        wds.create_shards(tmp_path / "empty", str(tmp_path / "o-%d.tar"))


def test_planned_sizes_are_the_sizes_written(tmp_path: Path) -> None:
    src = _images(tmp_path / "src")
    long_name = "n" * 150  # a name past 100 bytes takes extra header blocks
    _tree(src, {f"{long_name}.bin": b"L" * 5000, "huge.bin": b"H" * 50_000})
    scan = scan_directory(src)
    plans = plan_shards(scan.samples, str(tmp_path / "out/s-%03d.tar"), maxcount=7,
                        maxsize=40_000)
    report = write_shards(plans)
    assert report.ok and report.samples == 32
    for plan, shard in zip(plans, report.shards, strict=True):
        assert os.path.getsize(plan.url) == plan.size == shard.size
        assert len(plan.samples) <= 7
        assert plan.size <= 40_000 or len(plan.samples) == 1
    huge = [p for p in plans if any(s.key == "huge" for s in p.samples)]
    assert len(huge) == 1 and len(huge[0].samples) == 1  # bigger than maxsize: on its own
    assert sum(len(p.samples) for p in plans) == 32


def test_the_same_bytes_on_every_executor(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 40)
    results = {}
    executors: dict[str, Any] = {"inline": None, "threads": ThreadPoolExecutor(4),
                                 "processes": ProcessPoolExecutor(2)}
    for name, executor in executors.items():
        report = wds.create_shards(src, str(tmp_path / name / "p-%06d.tar"), maxcount=6,
                                   executor=executor)
        results[name] = _digests([s.output for s in report.shards])
        if executor is not None:
            executor.shutdown()
    assert len(results["inline"]) == 7
    assert results["threads"] == results["inline"] == results["processes"]


def test_a_pattern_without_a_field(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 4)
    report = wds.create_shards(src, str(tmp_path / "all.tar"))
    assert [s.output for s in report.shards] == [str(tmp_path / "all.tar")]
    with pytest.raises(ConfigError, match=r"must have one %d-style field.*2 shards"):
        wds.create_shards(src, str(tmp_path / "all.tar"), maxcount=2)
    with pytest.raises(ConfigError, match="same name"):
        plan_shards(scan_directory(src).samples, str(tmp_path / "x-%.0s.tar"), maxcount=1)
    report = wds.create_shards(src, str(tmp_path / "s" / "x-%d.tar"), maxcount=2,
                               maxsize="1MB", start=5)
    assert [os.path.basename(s.output) for s in report.shards] == ["x-5.tar", "x-6.tar"]


def test_compressed_shards_are_reproducible(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 6)
    one = wds.create_shards(src, str(tmp_path / "a" / "p-%d.tar.gz"), maxcount=3)
    two = wds.create_shards(src, str(tmp_path / "b" / "p-%d.tar.gz"), maxcount=3,
                            executor=ThreadPoolExecutor(2))
    assert _digests([s.output for s in one.shards]) == _digests([s.output for s in two.shards])
    assert [s["__key__"] for s in wds.WebDataset(str(tmp_path / "a/p-{0..1}.tar.gz"),
                                                 shardshuffle=False)][:2] == ["img001", "img002"]


def test_a_failed_shard_is_retried_then_reported_and_leaves_nothing(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 9)
    plans = plan_shards(scan_directory(src).samples, str(tmp_path / "out/p-%d.tar"),
                        maxcount=3)
    with open(plans[1].samples[1].files[0][1], "ab") as f:
        f.write(b"grown")  # every attempt at shard 1 fails, after its first sample
    with pytest.raises(ShardTaskError) as info:
        write_shards(plans, executor=ThreadPoolExecutor(2), retries=1).raise_for_failures()
    report = info.value.report
    assert list(info.value.failed) == [plans[1].url]
    assert "changed while the shards were written" in info.value.failed[plans[1].url]
    assert report.shards[1].attempts == 2 and [s.ok for s in report.shards] == [True, False,
                                                                               True]
    assert sorted(os.listdir(tmp_path / "out")) == ["p-0.tar", "p-2.tar"]  # no temp file left
    assert "1 of 3 shards failed after 2 attempts" in str(info.value)


def test_run_tasks_retries_and_keeps_order() -> None:
    seen: list[str] = []

    def flaky(job: list[int]) -> int:
        job[0] += 1
        if job[0] < 3:
            raise OSError(f"attempt {job[0]}")
        return job[0]

    jobs: list[tuple[str, Any]] = [(f"t{i}", [0 if i == 1 else 2]) for i in range(4)]
    outcomes = run_tasks(flaky, jobs, executor=ThreadPoolExecutor(3), retries=2,
                         on_outcome=lambda o: seen.append(o.name))
    assert [o.name for o in outcomes] == ["t0", "t1", "t2", "t3"] and sorted(seen) == [
        "t0", "t1", "t2", "t3"]
    assert outcomes[1].attempts == 3 and [e.partition(" (at")[0] for e in outcomes[1].errors] \
        == ["OSError: attempt 1", "OSError: attempt 2"]
    assert outcomes[1].errors[0].endswith(", in flaky)")  # where the caller's code raised
    assert not outcomes[1].failed and outcomes[1].value == 3
    jobs = [("t", [0])]
    outcome, = run_tasks(flaky, jobs, retries=1)
    assert outcome.failed and outcome.attempts == 2 and outcome.value is None


def test_an_unknown_executor_is_refused(tmp_path: Path) -> None:
    plan = ShardPlan(0, str(tmp_path / "x.tar"), (), 10240)
    with pytest.raises(ConfigError, match=r"executor=.*not understood"):
        write_shards([plan], executor="dask")
    with pytest.raises(ConfigError, match="unknown executor"), open_executor("spark"):
        pass


def test_errors_another_attempt_cannot_fix_are_not_retried() -> None:
    def missing(job: str) -> None:
        raise wds.ShardNotFoundError(f"no such file: {job!r}", url=job)

    outcome, = run_tasks(missing, [("a", "a.tar")], executor=ThreadPoolExecutor(1), retries=3)
    assert outcome.failed and outcome.attempts == 1


def test_a_directory_is_not_a_pattern(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 2)
    with pytest.raises(ConfigError, match=r"names a directory.*out/shard-%06d\.tar"):
        wds.create_shards(src, f"{tmp_path}/out/")
