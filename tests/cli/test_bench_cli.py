"""``wds-cloud bench``: the text and ``--json`` reports agree with the shards read (local, on the
real S3 server, through DataLoader workers, from a spec), ``--limit``/``--seconds``, the
baseline and its ratio, ``--plot`` PNGs and the missing-matplotlib message."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import write_tar
from stores import default_sigint

from wds_cloud.cli import bench, main

SHARDS, PER_SHARD = 4, 25


def _members(shard: int, i: int) -> dict[str, bytes]:
    return {"txt": f"{shard} {i} ".encode() * (50 + i), "cls": str(i % 10).encode()}


def _payload(members: dict[str, bytes]) -> int:
    return sum(len(v) for v in members.values())


def _tar(members: dict[str, bytes]) -> int:
    return sum(512 + -(-len(v) // 512) * 512 for v in members.values())


def _write(folder: Path, name: str = "s", shards: int = SHARDS) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        write_tar(folder / f"{name}-{s:03d}.tar",
                  [(f"{name}{s}-{i:04d}", _members(s, i)) for i in range(PER_SHARD)])
    return f"{folder}/{name}-{{000..{shards - 1:03d}}}.tar"


def _totals(shards: int = SHARDS) -> tuple[int, int, int]:
    samples = [_members(s, i) for s in range(shards) for i in range(PER_SHARD)]
    return len(samples), sum(map(_payload, samples)), sum(map(_tar, samples))


def _bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["-q", "bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = _bench(capsys, *args, "--json")
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def _check_complete(report: dict[str, Any], shards: int = SHARDS) -> None:
    """Every sample of every shard, counted once, and numbers that agree with each other."""
    samples, payload, tar = _totals(shards)
    t = report["throughput"]
    assert (t["samples"], t["bytes"], t["tar_bytes"]) == (samples, payload, tar)
    assert report["stopped"] == "end"
    assert t["samples_per_s"] == pytest.approx(samples / t["seconds"])
    assert t["mb_per_s"] == pytest.approx(payload / t["seconds"] / 1e6)
    assert 0 < report["first_sample_seconds"] < 60
    latency = report["shard_open_latency"]
    assert latency["shards"] == shards == len(latency["seconds"]) == len(report["shards"])
    assert 0 <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert sum(s["tar_bytes"] for s in report["shards"]) == tar
    assert all(s["reads"] == 1 for s in report["shards"])
    line = report["timeline"]
    assert (sum(line["samples"]), sum(line["bytes"])) == (samples, payload)
    base = report["baseline"]
    assert base["bytes"] == tar and base["opens"] == shards and base["seconds"] >= 0
    assert report["ratio"] == pytest.approx(base["seconds"] / t["seconds"])
    assert report["ratio"] > 0


def test_local_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _bench(capsys, _write(tmp_path))
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(":")[0].split(" after")[0] for line in lines] == [
        "throughput", "first sample", "shard open latency", "baseline", "ratio"]
    assert lines[0].startswith("throughput: ") and "samples/s" in lines[0]
    assert f"({SHARDS * PER_SHARD} samples, " in lines[0] and "in-process" in lines[0]
    assert lines[2].startswith("shard open latency: p50 ") and f"({SHARDS} shards;" in lines[2]
    assert "x of a plain sequential read of the same bytes (" in lines[4]


def test_local_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(capsys, _write(tmp_path))
    _check_complete(report)
    assert report["workers"] == 0 and report["decode"] is False and report["plot"] is None


def test_decode_counts_the_raw_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _check_complete(_report(capsys, _write(tmp_path), "--decode"))


def test_limit_and_its_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    limit = PER_SHARD + 5  # the second shard read in part
    report = _report(capsys, _write(tmp_path), "--limit", str(limit))
    t = report["throughput"]
    assert (report["stopped"], t["samples"]) == ("limit", limit)
    assert [s["url"].rsplit("/", 1)[1] for s in report["shards"]] == ["s-000.tar", "s-001.tar"]
    assert report["baseline"]["bytes"] == t["tar_bytes"] == sum(
        _tar(_members(s, i)) for s in range(2) for i in range(PER_SHARD) if s * PER_SHARD + i
        < limit)


def test_no_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _bench(capsys, _write(tmp_path), "--no-baseline")
    assert code == 0
    assert "baseline: skipped (--no-baseline)" in out and "ratio:" not in out
    report = _report(capsys, _write(tmp_path), "--no-baseline")
    assert report["baseline"] is None and report["ratio"] is None


def test_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(capsys, _write(tmp_path), "--workers", "2")
    _check_complete(report)
    assert report["workers"] == 2
    code, out, _ = _bench(capsys, _write(tmp_path, "t", shards=1), "--workers", "2")
    assert code == 0 and "(1 shard;" in out and "2 workers" in out  # an idle worker is fine


def test_s3(s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = s3_server.new_store()
    _write(tmp_path)
    for s in range(SHARDS):
        store.put(f"data/s-{s:03d}.tar", (tmp_path / f"s-{s:03d}.tar").read_bytes())
    options = json.dumps(store.storage_options)
    report = _report(capsys, store.url("data/s-*.tar"), "--storage-options", options)
    _check_complete(report)
    assert all(s["url"].startswith("s3://") for s in report["shards"])


def _spec(tmp_path: Path) -> Path:
    a, b = _write(tmp_path / "a", "a", 2), _write(tmp_path / "b", "b", 3)
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump({"seed": 7, "datasets": [
        {"name": "a", "shards": a, "weight": 1}, {"name": "b", "shards": b, "weight": 2}]}))
    return path


def test_spec_with_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(capsys, str(_spec(tmp_path)), "--limit", "120")
    t = report["throughput"]
    assert (report["stopped"], t["samples"]) == ("limit", 120)
    urls = {s["url"] for s in report["shards"]}
    assert any("/a/" in u for u in urls) and any("/b/" in u for u in urls)
    assert report["shard_open_latency"]["shards"] == sum(s["reads"] for s in report["shards"])
    assert report["baseline"]["bytes"] >= t["tar_bytes"] > 0
    assert report["ratio"] > 0


def test_spec_stops_by_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "SPEC_SECONDS", 0.5)
    code = main(["bench", str(_spec(tmp_path)), "--json", "--no-baseline"])
    out, err = capsys.readouterr()
    assert code == 0 and "endless mix: reading for 0.5 s" in err
    assert json.loads(out)["stopped"] == "seconds"
    report = _report(capsys, str(_spec(tmp_path)), "--seconds", "0.3", "--no-baseline")
    assert report["stopped"] == "seconds" and report["throughput"]["samples"] > 0


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    png = tmp_path / "out.png"
    code, out, err = _bench(capsys, _write(tmp_path), "--plot", str(png))
    assert code == 0, err
    assert out.splitlines()[-1] == f"plot: {png}"
    assert _png_size(png) == (1200, 800)
    with Image.open(png) as image:
        image.verify()
    report = _report(capsys, _write(tmp_path), "--plot", str(png), "--no-baseline")
    assert report["plot"] == str(png) and _png_size(png) == (1200, 800)


def test_plot_without_matplotlib(tmp_path: Path) -> None:
    shim = ("import sys; sys.modules['matplotlib'] = None; from wds_cloud.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    png = tmp_path / "out.png"
    done = subprocess.run([sys.executable, "-c", shim, "bench", _write(tmp_path), "--plot",
                           str(png)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'wds-cloud[plot]'" in done.stderr and "matplotlib" in done.stderr
    assert done.stdout == "" and not png.exists()  # refused before reading anything


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _bench(capsys, str(tmp_path / "missing.tar"))
    assert code == 2 and "missing.tar" in err
    write_tar(tmp_path / "empty.tar", [])
    code, _, err = _bench(capsys, str(tmp_path / "empty.tar"))
    assert code == 1 and "no samples" in err
    code, _, err = _bench(capsys, str(_spec(tmp_path)), _write(tmp_path / "c"))
    assert code == 2 and "one spec, or URLs" in err
    code, _, err = _bench(capsys, _write(tmp_path / "d"), "--seconds", "0")
    assert code == 2 and "--seconds" in err


@pytest.mark.parametrize("workers", [0, 2])
def test_interrupted_before_the_first_sample_says_so_and_exits_130(
        tmp_path: Path, workers: int) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the first shard is
    still being asked for: "interrupted", exit 130 (not "error: no samples"), and no
    traceback, from the command nor from a DataLoader worker being forked."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # accepts, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        server.settimeout(120)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/s-{{000..003}}.tar"
        proc = subprocess.Popen(
            [sys.executable, "-m", "wds_cloud.cli", "bench", url, "--workers", str(workers),
             "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            start_new_session=True, preexec_fn=default_sigint)
        try:
            conn, _ = server.accept()  # the first GET is sent: the reading has started
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            conn.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, err
    assert out == "" and "no samples" not in err
    assert f"wds-cloud bench: interrupted before the first sample of {url}\n" in err
    assert "Traceback" not in err and "Exception ignored" not in err, err
