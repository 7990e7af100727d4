"""``wds-cloud ls``: shards with sizes and a total, from brace patterns (missing shards listed
and exit 2), local and bucket globs, a spec (grouped by source), on disk and the real S3
server; text and ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import write_tar
from stores.base import Store

from wds_cloud.cli import main
from wds_cloud.settings import human_size


def shards(root: Path, name: str, count: int, per_shard: int = 3) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    return [Path(write_tar(root / f"{name}-{s:06d}.tar",
                           [(f"{name}{s}-{i}", {"txt": b"x" * (100 * s + i), "cls": b"1"})
                            for i in range(per_shard)])) for s in range(count)]


def ls(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["ls", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def ls_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = ls(capsys, *args, "--json")
    return code, json.loads(out)


def test_brace_pattern_with_missing_shards(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    paths = shards(tmp_path, "train", 3)
    pattern = f"{tmp_path}/train-{{000000..000004}}.tar"
    code, out, err = ls(capsys, pattern)
    assert code == 2
    lines = out.splitlines()
    for path, line in zip(paths, lines, strict=False):
        assert line.split() == [*human_size(path.stat().st_size).split(), str(path)]
    assert lines[3].split() == ["missing", f"{tmp_path}/train-000003.tar"]
    total = sum(p.stat().st_size for p in paths)
    assert lines[-1] == (f"total: 5 shards, {human_size(total)} ({total:,} bytes); 2 missing")
    assert err == (f"wds-cloud ls: error: 2 of 5 shards not found: {tmp_path}/train-000003.tar, "
                   f"{tmp_path}/train-000004.tar\n")
    code, doc = ls_json(capsys, pattern)
    assert code == 2
    assert [(r["url"], r["size"], r["missing"]) for r in doc["shards"]] == [
        *((str(p), p.stat().st_size, False) for p in paths),
        (f"{tmp_path}/train-000003.tar", None, True), (f"{tmp_path}/train-000004.tar", None, True)]
    assert doc["total"] == {"shards": 5, "bytes": total, "size": human_size(total),
                            "missing": 2, "unknown": 0}
    assert doc["sources"] == []


def test_local_glob_and_exact_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    paths = shards(tmp_path / "shards", "train", 3)
    shards(tmp_path / "shards", "valid", 1)
    code, out, err = ls(capsys, f"{tmp_path}/shards/train-*.tar", "--bytes")
    assert code == 0 and err == ""
    assert out.splitlines() == [
        *(f"{p.stat().st_size:,}  {p}" for p in paths),
        f"total: 3 shards, {sum(p.stat().st_size for p in paths):,} bytes"]


def test_relative_glob_as_a_subprocess(tmp_path: Path) -> None:
    """What used to fail with "no such file": a quoted glob relative to the working dir."""
    paths = shards(tmp_path / "shards", "train", 2)
    out = subprocess.run([sys.executable, "-m", "wds_cloud.cli", "ls", "shards/train-*.tar",
                          "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [r["url"] for r in doc["shards"]] == [f"shards/{p.name}" for p in paths]
    out = subprocess.run([sys.executable, "-m", "wds_cloud.cli", "ls", "shards/nothing-*.tar"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "'shards/nothing-*.tar'" in out.stderr
    assert "Traceback" not in out.stderr


def test_spec_grouped_by_source(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a = shards(tmp_path / "a", "a", 2)
    b = shards(tmp_path / "b", "b", 3)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [
        {"name": "first", "shards": f"{tmp_path}/a/a-{{000000..000001}}.tar"},
        {"name": "second", "shards": f"{tmp_path}/b/*.tar", "weight": 3}]}))
    code, out, _ = ls(capsys, str(spec))
    assert code == 0
    size_a, size_b = (sum(p.stat().st_size for p in group) for group in (a, b))
    lines = out.splitlines()
    assert lines[0] == f"source 'first': 2 shards, {human_size(size_a)} ({size_a:,} bytes)"
    assert lines[1].endswith(f"  {a[0]}") and lines[1].startswith("  ")
    assert lines[3] == f"source 'second': 3 shards, {human_size(size_b)} ({size_b:,} bytes)"
    assert lines[-1].startswith(f"total: 5 shards, {human_size(size_a + size_b)}")
    code, doc = ls_json(capsys, str(spec))
    assert [(s["name"], s["shards"], s["bytes"]) for s in doc["sources"]] == [
        ("first", 2, size_a), ("second", 3, size_b)]
    assert [r["source"] for r in doc["shards"]] == ["first"] * 2 + ["second"] * 3


def test_on_s3(capsys: pytest.CaptureFixture[str], tmp_path: Path,
               store_factory: Callable[[str], Store]) -> None:
    store = store_factory("s3")
    paths = shards(tmp_path, "train", 4)
    for p in paths:
        store.put(f"data/{p.name}", p.read_bytes())
    store.put("data/other.tar", b"x" * 10)
    options = store.storage_options["s3"]
    flags = ["-o", f"s3.endpoint_url={options['endpoint_url']}", "-o", f"s3.key={options['key']}",
             "-o", f"s3.secret={options['secret']}",
             "-o", f"s3.config_kwargs={json.dumps(options.get('config_kwargs', {}))}"]
    code, doc = ls_json(capsys, store.url("data/train-*.tar"), *flags)
    assert code == 0
    assert [(r["url"], r["size"]) for r in doc["shards"]] == [
        (store.url(f"data/{p.name}"), p.stat().st_size) for p in paths]
    code, out, err = ls(capsys, store.url("data/train-{000002..000005}.tar"),
                        "--storage-options", json.dumps(store.storage_options))
    assert code == 2 and out.splitlines()[0].endswith(store.url("data/train-000002.tar"))
    assert out.splitlines()[2].split() == ["missing", store.url("data/train-000004.tar")]
    assert "2 of 4 shards not found" in err and store.url("data/train-000005.tar") in err
    spec = tmp_path / "s3.yaml"
    spec.write_text(yaml.safe_dump({"prefix": store.url("data/"),
                                    "storage_options": store.storage_options,
                                    "datasets": [{"name": "t", "shards": "train-*.tar"},
                                                 {"name": "o", "shards": "other.tar"}]}))
    code, doc = ls_json(capsys, str(spec))
    assert code == 0 and [(s["name"], s["shards"]) for s in doc["sources"]] == [("t", 4),
                                                                                ("o", 1)]
    assert doc["total"]["bytes"] == sum(p.stat().st_size for p in paths) + 10
    code, out, err = ls(capsys, "s3://*", *flags)  # s3fs does not glob across buckets
    assert code == 2 and "listing s3://* failed: ValueError: Cannot traverse all of S3" in err


def test_on_http(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                 store_factory: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """http(s) shards are looked up by asking nginx for their first byte: sizes, missing
    shards, an empty one; a refusal or no answer (after the retries) is an error naming the
    URL."""
    monkeypatch.setenv("WDS_RETRIES", "1")
    monkeypatch.setenv("WDS_RETRY_BACKOFF", "0.01")
    store = store_factory("http")
    paths = shards(tmp_path, "train", 3)
    for p in paths:
        store.put(p.name, p.read_bytes())
    store.put("empty.tar", b"")
    code, doc = ls_json(capsys, store.url("train-{000000..000004}.tar"))
    assert code == 2
    assert [(r["url"], r["size"], r["missing"]) for r in doc["shards"]] == [
        *((store.url(p.name), p.stat().st_size, False) for p in paths),
        (store.url("train-000003.tar"), None, True), (store.url("train-000004.tar"), None, True)]
    assert doc["total"]["unknown"] == 0
    code, doc = ls_json(capsys, store.url("empty.tar"))
    assert code == 0 and [(r["size"], r["missing"]) for r in doc["shards"]] == [(0, False)]
    denied = store.url("x").rsplit("/", 2)[0] + "/private/train.tar"  # nginx answers 403
    code, out, err = ls(capsys, denied)
    assert code == 2 and out == "" and "access denied looking up" in err and denied in err
    code, out, err = ls(capsys, "http://127.0.0.1:9/train.tar")
    assert code == 2 and "cannot look up http://127.0.0.1:9/train.tar: connection refused" \
        in err


def test_through_aistore(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                         store_factory: Callable[[str], Store],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``gs://`` URLs proxied by AIStore (``AIS_ENDPOINT``, ``USE_AIS_FOR``) are looked up
    where they are read: the gateway redirects each request to its target."""
    store = store_factory("ais")
    paths = shards(tmp_path, "train", 2)
    for p in paths:
        store.put(p.name, p.read_bytes())
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    code, doc = ls_json(capsys, store.url("train-{000000..000002}.tar"))
    assert code == 2
    assert [(r["url"], r["size"], r["missing"]) for r in doc["shards"]] == [
        *((store.url(p.name), p.stat().st_size, False) for p in paths),
        (store.url("train-000002.tar"), None, True)]
