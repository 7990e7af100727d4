"""``wds-cloud create`` and ``wds-cloud map-shards``: text and ``--json`` output, skipped files,
sizes with units, exit codes, byte-identical shards on every executor (one Dask LocalCluster
for the module, reached with --scheduler, and one the command starts), straight to S3."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.cli import main
from wds_cloud.parallel import open_executor


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """The address of a LocalCluster of 2 worker processes on 127.0.0.1."""
    with open_executor("dask", workers=2) as client:
        yield client.scheduler.address


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _source(root: Path) -> Path:
    """6 samples (one in sub/), 2 hidden entries and a file without an extension."""
    files = {f"s{i}.{ext}": f"{ext} {i}".encode() for i in range(5) for ext in ("txt", "cls")}
    files.update({"sub/t.txt": b"t", ".hidden.txt": b"h", "sub/.DS_Store": b"d", "README": b"r"})
    return _tree(root, files)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["-q", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _digests(paths: list[Path]) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_create_text_output_and_left_out_files(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    out = tmp_path / "out"
    code, stdout, err = _run(capsys, "create", str(src), "--output", f"{out}/p-%06d.tar",
                             "--maxcount", "2", "--maxsize", "1MB")
    assert code == 0, err
    assert re.fullmatch(rf"created 6 samples in 3 shards \(30\.0 KiB\) in \d+\.\d\d s: "
                        rf"{out}/p-000000\.tar \.\. {out}/p-000002\.tar\n", stdout), stdout
    assert "skipped 2 hidden files and directories: .hidden.txt, sub/.DS_Store" in err
    assert "warning: skipped 1 file without an extension (readers would drop it): README" in err
    keys = [s["__key__"] for s in wds.WebDataset(f"{out}/p-{{000000..000002}}.tar",
                                                 shardshuffle=False)]
    assert keys == ["s0", "s1", "s2", "s3", "s4", "sub/t"]
    code, stdout, err = _run(capsys, "create", str(src), "--output", f"{out}/p-%06d.tar")
    assert stdout.startswith("created 6 samples in 1 shard (20.0 KiB)")
    assert f"warning: {out}/p-000001.tar (and maybe more) is left from an earlier run" in err


def test_create_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    code, stdout, _ = _run(capsys, "create", str(src), "--output", f"{tmp_path}/j-%d.tar",
                           "--maxcount", "4", "--json", "--workers", "1")
    doc = json.loads(stdout)
    assert code == 0 and doc["ok"] and (doc["samples"], doc["size"]) == (6, 20480)
    assert [(s["output"], s["samples"], s["size"], s["attempts"]) for s in doc["shards"]] == [
        (f"{tmp_path}/j-0.tar", 4, 10240, 1), (f"{tmp_path}/j-1.tar", 2, 10240, 1)]
    assert doc["skipped"] == {"hidden": [".hidden.txt", "sub/.DS_Store"],
                              "no_extension": ["README"], "reserved": []}
    assert doc["failed"] == {} and doc["executor"] == "local"


def test_create_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    code, _, err = _run(capsys, "create", str(tmp_path / "nope"), "--output", "o-%d.tar")
    assert code == 2 and "nope' does not exist" in err
    code, _, err = _run(capsys, "create", str(src), "--output", f"{tmp_path}/all.tar",
                        "--maxcount", "5")
    assert code == 2 and "must have one %d-style field" in err and "(2 shards to write)" in err
    code, stdout, _ = _run(capsys, "create", str(src), "--output", f"{tmp_path}/all.tar")
    assert code == 0 and stdout.endswith(f": {tmp_path}/all.tar\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["create", str(src), "--output", "o-%d.tar", "--maxsize", "1XB"])
    assert exit_info.value.code == 2 and "cannot read '1XB' as a size" in capsys.readouterr().err


def test_a_shard_that_cannot_be_written_is_named(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    (tmp_path / "out" / "p-1.tar").mkdir(parents=True)  # in the way of shard 1
    code, stdout, err = _run(capsys, "create", str(src), "--output",
                             f"{tmp_path}/out/p-%d.tar", "--maxcount", "2", "--retries", "1")
    assert code == 1
    assert stdout.startswith("created 4 samples in 2 of 3 shards")
    assert re.search(rf"error: {tmp_path}/out/p-1\.tar failed after 2 attempts: .*is a "
                     "directory", err), err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["p-0.tar", "p-1.tar",
                                                                   "p-2.tar"]


def test_the_same_bytes_on_every_executor(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          scheduler: str) -> None:
    files = {f"d{i % 4}/f{i:03d}.{ext}": bytes([i, len(ext)]) * (50 * i + 7)
             for i in range(60) for ext in ("bin", "json", "seg.png")}
    src = _tree(tmp_path / "src", files)
    runs = {"one": ["--workers", "1"], "threads": ["--workers", "4"],
            "dask": ["--executor", "dask", "--workers", "2"],
            "scheduler": ["--scheduler", scheduler]}
    digests = {}
    for name, extra in runs.items():
        code, _, err = _run(capsys, "create", str(src), "--output",
                            f"{tmp_path}/{name}/p-%06d.tar", "--maxsize", "20kB", *extra)
        assert code == 0, err
        digests[name] = _digests(sorted((tmp_path / name).iterdir()))
    assert len(digests["one"]) > 5
    assert digests["threads"] == digests["one"] == digests["dask"] == digests["scheduler"]


def test_create_straight_to_s3(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               s3_server: Any) -> None:
    store = s3_server.new_store()
    src = _source(tmp_path / "src")
    code, stdout, err = _run(capsys, "create", str(src), "--output", store.url("d/p-%06d.tar"),
                             "--maxcount", "4", "--storage-options",
                             json.dumps(store.storage_options))
    assert code == 0, err
    assert stdout.endswith(f": {store.url('d/p-000000.tar')} .. {store.url('d/p-000001.tar')}\n")
    keys = [s["__key__"] for s in wds.WebDataset(store.url("d/p-{000000..000001}.tar"),
                                                 shardshuffle=False,
                                                 storage_options=store.storage_options)]
    assert keys == ["s0", "s1", "s2", "s3", "s4", "sub/t"]
    _run(capsys, "create", str(src), "--output", f"{tmp_path}/p-%06d.tar", "--maxcount", "4")
    assert store.get("d/p-000001.tar") == (tmp_path / "p-000001.tar").read_bytes()


# -- map-shards ---------------------------------------------------------------------------

_MODULE = '''
def shout(sample):
    if sample["__key__"] == "s2-0003":
        raise ValueError("no shouting in shard 2")
    return {"txt": sample["txt"].upper()}

def tag(sample):
    sample["json"]["tagged"] = True
    return sample
'''


def _inputs(root: Path, n: int = 4) -> str:
    root.mkdir(parents=True)
    for s in range(n):
        write_tar(root / f"in-{s:02d}.tar", [(f"s{s}-{i:04d}", {
            "txt": b"hi %d" % i, "json": b'{"i": %d}' % i}) for i in range(5)])
    return str(root / f"in-{{00..{n - 1:02d}}}.tar")


def test_map_shards_on_a_process_pool(tmp_path: Path) -> None:
    """As a user runs it: a module in the current directory, two worker processes, each
    output in a directory under its input's name; a shard that keeps failing is named."""
    (tmp_path / "myaug.py").write_text(_MODULE)
    inputs = _inputs(tmp_path / "in")
    proc = subprocess.run([sys.executable, "-m", "wds_cloud.cli", "map-shards", "myaug:shout",
                           inputs, "--output", "out/", "--workers", "2", "--retries", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert re.fullmatch(r"mapped 3 of 4 shards: 15 samples in, 15 out \(30\.0 KiB\) in "
                        r"\d+\.\d\d s: out/in-00\.tar \.\. out/in-03\.tar\n", proc.stdout)
    assert re.search(r"error: .*/in/in-02\.tar failed after 2 attempts: ValueError: no "
                     r"shouting in shard 2 \(at myaug\.py:4, in shout\)", proc.stderr)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "in-00.tar", "in-01.tar", "in-03.tar"]
    sample = next(iter(wds.WebDataset(str(tmp_path / "out/in-03.tar"), shardshuffle=False)))
    assert sample["txt"] == b"HI 0" and "json" not in sample


def test_map_shards_on_dask_json_and_decode(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, scheduler: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "taggers.py").write_text(_MODULE)  # not importable by the workers: sent
    inputs = _inputs(tmp_path / "in")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code, stdout, err = _run(capsys, "map-shards", "taggers:tag", inputs, "--output",
                             "out/t-%03d.tar", "--scheduler", scheduler, "--decode", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["ok"] and doc["executor"] == "dask" and doc["samples"] == 20
    assert [(s["input"], s["output"], s["samples_in"], s["samples"]) for s in doc["shards"]] \
        == [(f"{tmp_path}/in/in-{s:02d}.tar", f"out/t-{s:03d}.tar", 5, 5) for s in range(4)]
    sample = list(wds.WebDataset("out/t-001.tar", shardshuffle=False))[2]
    assert json.loads(sample["json"]) == {"i": 2, "tagged": True}


@pytest.mark.parametrize(("function", "message"), [
    ("nosuchmodule:f", "cannot import 'nosuchmodule'"),
    ("json:nosuch", "'json' has no 'nosuch'"),
    ("shout", "expected MODULE:FUNCTION"),
    ("aug.py:shout", "give the module's name"),
])
def test_map_shards_bad_function(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                 function: str, message: str) -> None:
    inputs = _inputs(tmp_path / "in", 1)
    code, _, err = _run(capsys, "map-shards", function, inputs, "--output", "o/")
    assert code == 2 and message in err, err


def test_dask_missing_names_the_extra(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    code = ("import sys\nsys.modules['distributed'] = None  # as if not installed\n"
            "from wds_cloud.cli import main\n"
            f"sys.exit(main(['create', {str(src)!r}, '--output', {str(tmp_path)!r} + "
            "'/p-%d.tar', '--executor', 'dask']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "pip install 'wds-cloud[dask]'" in proc.stderr and not list(tmp_path.glob("p-*"))
