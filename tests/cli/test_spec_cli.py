"""``wds-cloud spec check``: rows (shards, bytes, shares, per-epoch numbers), warnings,
``--simulate``, ``--json`` and the exit codes, on local shards and the real S3 server."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import write_tar
from stores.base import Store

from wds_cloud.cli import main
from wds_cloud.listing import Listings, shard_sizes
from wds_cloud.router import Router
from wds_cloud.settings import Settings, human_size
from wds_cloud.spec import load_spec
from wds_cloud.spec.build import source_draws

DOCS_EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "webdataset-docs.yaml"


def _samples(name: str, shard: int, n: int) -> list[tuple[str, dict[str, bytes]]]:
    return [(f"{name}-{shard:03d}-{i:04d}", {"txt": f"{name} {shard} {i}".encode() * 20,
                                            "cls": b"1"}) for i in range(n)]


def _local(root: Path, name: str, shards: int, per_shard: int) -> str:
    (root / name).mkdir()
    for s in range(shards):
        write_tar(root / name / f"{s:03d}.tar", _samples(name, s, per_shard))
    return f"{root}/{name}/{{000..{shards - 1:03d}}}.tar"


def _write(tmp_path: Path, spec: dict[str, Any], name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["-q", "spec", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = _check(capsys, *args, "--json")
    return code, json.loads(out)


def _row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in report["sources"] if r["name"] == name)


@pytest.fixture
def local_spec(tmp_path: Path) -> dict[str, Any]:
    return {"seed": 11, "datasets": [
        {"name": "a", "shards": _local(tmp_path, "a", 4, 50), "weight": 0.5},
        {"name": "b", "shards": f"{tmp_path}/b/*.tar", "weight": 0.3, "scale": [0.5, 1.5]},
        {"name": "c", "shards": _local(tmp_path, "c", 1, 20), "weight": 0.005},
    ]}


@pytest.fixture
def local_path(tmp_path: Path, local_spec: dict[str, Any]) -> str:
    _local(tmp_path, "b", 2, 30)
    return _write(tmp_path, local_spec)


def test_rows_of_local_sources(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               local_path: str) -> None:
    code, report = _report(capsys, local_path, "--world-size", "2", "--workers", "2",
                           "--batch-size", "8", "--epoch-batches", "25")
    assert code == 0, report["errors"]
    spec = load_spec(local_path)
    bounds, realized = spec.probability_bounds(), spec.probabilities(0, 11)
    total = 2 * 25 * 8
    for name, shards, per_shard in (("a", 4, 50), ("b", 2, 30), ("c", 1, 20)):
        row = _row(report, name)
        files = sorted((tmp_path / name).glob("*.tar"))
        assert row["shards"] == shards and row["missing"] == [] and row["error"] is None
        assert row["bytes"] == sum(f.stat().st_size for f in files)
        assert row["samples"] == shards * per_shard  # equal shards: the estimate is exact
        assert row["samples_in_shard_read"] == per_shard
        p = row["probability"]
        assert (p["min"], p["expected"], p["max"]) == pytest.approx(bounds[name])
        assert p["epoch0"] == pytest.approx(realized[name])
        expected = bounds[name][1] * total
        assert row["expected_samples"] == pytest.approx(expected)
        assert row["passes"] == pytest.approx(expected / (shards * per_shard))
        index = [source.name for source in spec.sources].index(name)
        drawn = [source_draws(spec, seed=11, epoch=0, slot=slot, n=total // 4).count(index)
                 for slot in range(4)]  # epoch 0's own draws; local shards: none opened ahead
        assert row["gets"] == sum(math.ceil(n / per_shard) for n in drawn)
        assert row["bytes_read"] == round(row["gets"] * row["bytes"] / shards)
    assert _row(report, "a")["probability"]["expected"] == pytest.approx(0.5 / 0.805)
    assert _row(report, "b")["scale"] == [0.5, 1.5]
    assert report["seed"] == 11 and report["shape"]["slots"] == 4
    assert report["spec"]["datasets"][1]["shards"].endswith("/b/*.tar")
    warnings = "\n".join(report["warnings"])
    assert "a: read 1.2 times per epoch (about 248 samples expected from about 200" in warnings
    assert "b: read 2.5 times per epoch" in warnings  # 0.373 * 400 samples of 60 in b
    assert "b: 2 shards for 4 slots (2 ranks x 2 workers)" in warnings
    assert "c: 1 shard for 4 slots" in warnings and "a: 4 shard" not in warnings
    assert "c: expected share 0.62% is under 1%" in warnings
    assert report["simulation"] is None


def test_the_table(capsys: pytest.CaptureFixture[str], tmp_path: Path, local_path: str) -> None:
    code, out, err = _check(capsys, local_path, "--batch-size", "10", "--epoch-batches", "3")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"spec: {local_path}: 3 sources, weighted mix (endless)"
    assert lines[1] == "dialect: webdataset"
    del lines[1]
    assert lines[1] == "seed: 11 (the spec)"
    assert lines[2].startswith("epoch: 1 rank x 1 worker = 1 slot; 3 batches x 10")
    header = lines[4]
    assert header.split()[:4] == ["source", "shards", "size", "samples~"]
    rows = {line.split()[0]: line for line in lines[5:8]}
    assert rows["a"].split()[1:2] == ["4"] and "62.11%" in rows["a"]  # 0.5 / 0.805
    size = human_size(sum(f.stat().st_size for f in (tmp_path / "b").glob("*.tar")))
    assert rows["b"].split()[:5] == ["b", "2", *size.split(), "60"]
    assert "0.5-1.5" in rows["b"]
    # aligned: each column ends (numbers) where its header ends
    end = header.index("samples~") + len("samples~")
    assert all(len(r) > end and r[end - 1] != " " and r[end] == " " for r in rows.values())
    assert any(line.startswith("warning: c: expected share") for line in lines)


def test_simulate_draws_the_realized_shares(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch,
                                            local_path: str) -> None:
    code, report = _report(capsys, local_path, "--world-size", "2", "--workers", "3",
                           "--simulate", "5000", "--seed", "3", "--no-list")
    assert code == 0
    sim = report["simulation"]
    assert (sim["slots"], sim["samples_per_slot"], sim["samples"], sim["seed"]) == (
        6, 5000, 30000, 3)
    realized = load_spec(local_path).probabilities(0, 3)
    assert realized["b"] != pytest.approx(load_spec(local_path).probabilities(0, 4)["b"])
    for s in sim["sources"]:
        assert s["realized"] == pytest.approx(realized[s["name"]])
        assert abs(s["observed"] - s["realized"]) < 0.01, s
    assert sum(s["count"] for s in sim["sources"]) == 30000
    code, out, _ = _check(capsys, local_path, "--simulate", "1000", "--no-list")
    assert "simulation: 1,000 draws per slot x 1 slot = 1,000 (epoch 0, seed 11" in out
    monkeypatch.setenv("WDS_SEED", "9")  # argument > WDS_SEED > the spec's seed
    code, out, _ = _check(capsys, local_path, "--simulate", "1000", "--no-list")
    assert "seed: 9 (WDS_SEED)" in out and "(epoch 0, seed 9;" in out
    assert "largest difference:" in out


def test_docs_example_shares_without_io(capsys: pytest.CaptureFixture[str]) -> None:
    """The webdataset docs' example (gs:// shards, unreachable here) with --no-list: shares
    from the spec alone; brace patterns counted."""
    code, report = _report(capsys, str(DOCS_EXAMPLE), "--no-list")
    assert code == 0, report["errors"]
    spec = load_spec(DOCS_EXAMPLE)
    assert len(report["sources"]) == 5
    raw = [s.weight * (s.scale[0] + s.scale[1]) / 2 for s in spec.sources]
    for source, row, r in zip(spec.sources, report["sources"], raw, strict=True):
        assert row["probability"]["expected"] == pytest.approx(r / sum(raw))
        assert row["shards"] == (None if source.has_glob else len(source.urls))
        assert row["bytes"] is None and row["listed"] is False
    assert sum(raw) == pytest.approx(4.65)
    assert report["sources"][0]["probability"]["expected"] == pytest.approx(0.3 / 4.65)
    code, out, _ = _check(capsys, str(DOCS_EXAMPLE), "--no-list")
    assert code == 0 and "6.45%" in out and "not listed (--no-list)" in out


def test_invalid_spec_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _write(tmp_path, {"datasets": [{"shards": "a-{0..1}.tar", "wieght": 1}]})
    code, out, err = _check(capsys, path)
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith("wds-cloud spec check: invalid spec: ")
    assert f"{path}: datasets[0].wieght" in err and "did you mean 'weight'" in err
    code, _, err = _check(capsys, str(tmp_path / "absent.yaml"))  # missing: as shards are
    assert code == 2 and "absent.yaml" in err and "cannot read" in err


def test_pipe_refused_unless_allowed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shard = write_tar(tmp_path / "p.tar", _samples("p", 0, 7))
    path = _write(tmp_path, {"datasets": [{"name": "p", "shards": f"pipe:cat {shard}"}]})
    code, _, err = _check(capsys, path)
    assert code == 1 and "pipe:" in err and "--allow-pipe" in err
    code, report = _report(capsys, path, "--allow-pipe")
    row = _row(report, "p")
    assert code == 0 and row["shards"] == 1 and row["bytes"] is None
    assert row["samples"] == 7  # size unknown: the shard read times the shards
    assert any("shard sizes are unknown for pipe:" in w for w in report["warnings"])


def test_missing_and_unmatched_shards_exit_2(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    pattern = _local(tmp_path, "a", 2, 5).replace("001}", "004}")  # 000..004: 3 missing
    path = _write(tmp_path, {"datasets": [
        {"name": "a", "shards": pattern, "weight": 1},
        {"name": "g", "shards": f"{tmp_path}/nothing-*.tar", "weight": 1}]})
    code, out, err = _check(capsys, path)
    assert code == 2 and "Traceback" not in err
    assert f"source 'a' ({path}: datasets[0], '{pattern}'): 3 of 5 shards not found: " in err
    assert f"{tmp_path}/a/002.tar" in err and "and 0 more" not in err
    assert f"{path}: datasets[1] ('g'): no shard matches '{tmp_path}/nothing-*.tar'" in err
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("a ", "g "))}
    assert rows["a"].split()[1:4] == ["2", "of", "5"] and "50.00%" in rows["g"]
    code, report = _report(capsys, path)
    assert code == 2 and len(report["errors"]) == 2
    assert _row(report, "a")["missing"] == [f"{tmp_path}/a/{i:03d}.tar" for i in (2, 3, 4)]


def test_counted_spec_shows_shards_per_epoch(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    path = _write(tmp_path, {"datasets": [
        {"name": "r", "shards": _local(tmp_path, "r", 2, 10), "resample": 6},
        {"name": "c", "shards": _local(tmp_path, "c", 4, 5), "choose": 2}]})
    code, report = _report(capsys, path, "--workers", "3", "--world-size", "4",
                           "--simulate", "10")
    assert code == 0
    r, c = _row(report, "r"), _row(report, "c")
    assert r["probability"] is None and (r["shards_per_epoch"], c["shards_per_epoch"]) == (6, 2)
    assert (r["expected_samples"], r["passes"], r["gets"]) == (60, 3.0, 6)
    assert (c["expected_samples"], c["passes"], c["gets"]) == (10, 0.5, 2)
    assert report["simulation"] is None
    warnings = "\n".join(report["warnings"])
    assert "r: read 3.0 times per epoch" in warnings
    assert "an epoch has 8 shards for 12 slots" in warnings and "nothing to simulate" in warnings
    code, out, _ = _check(capsys, path)
    assert "per-epoch shard lists (every shard once, or resample/choose)" in out
    assert "resample 6" in out and "choose 2" in out


@pytest.fixture
def s3_spec(store_factory: Callable[[str], Store], tmp_path: Path) -> tuple[str, Store]:
    store = store_factory("s3")
    for name, shards, per_shard in (("big", 5, 40), ("few", 2, 8), ("globbed", 3, 12)):
        for s in range(shards):
            local = write_tar(tmp_path / f"{name}{s}.tar", _samples(name, s, per_shard))
            store.put(f"train/{name}-{s:06d}.tar", Path(local).read_bytes())
    spec = {"prefix": store.url("train/"), "seed": 1,
            "storage_options": store.storage_options,
            "datasets": [{"shards": "big-{000000..000004}.tar", "weight": 2},
                         {"shards": "few-{000000..000001}.tar"},
                         {"name": "globbed", "shards": "globbed-*.tar", "scale": [0.5, 1.0]}]}
    return _write(tmp_path, spec), store


def test_sources_on_s3(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                       s3_spec: tuple[str, Store]) -> None:
    path, store = s3_spec
    code, report = _report(capsys, path, "--batch-size", "4", "--epoch-batches", "10")
    assert code == 0, report["errors"]
    for name, shards, per_shard in (("big", 5, 40), ("few", 2, 8), ("globbed", 3, 12)):
        row = _row(report, name)
        size = sum((tmp_path / f"{name}{s}.tar").stat().st_size for s in range(shards))
        assert (row["shards"], row["bytes"], row["samples"]) == (shards, size,
                                                                 shards * per_shard), row
        assert row["shard_read"].startswith(store.url(f"train/{name}-"))
    assert _row(report, "big")["probability"]["expected"] == pytest.approx(2 / 3.75)


@pytest.mark.parametrize("batches", [3, 10])
def test_the_gets_estimate_is_what_a_run_makes_on_s3(
        capsys: pytest.CaptureFixture[str], s3_spec: tuple[str, Store], batches: int) -> None:
    """``spec check``'s GET requests for an epoch are within 10% of what reading that many
    samples of the spec with default settings made at the S3 server (the shards read, one GET
    each, and per stream the one opened ahead when the epoch stops)."""
    import itertools

    import wds_cloud as wds

    path, _ = s3_spec
    code, report = _report(capsys, path, "--batch-size", "100", "--epoch-batches", str(batches))
    assert code == 0, report["errors"]
    predicted = sum(row["gets"] for row in report["sources"])
    wds.reset_io_stats()
    dataset = wds.WebDataset(path)
    for _ in itertools.islice(dataset, 100 * batches):
        pass
    dataset.close()
    made = wds.io_stats()
    assert made["gets"] == made["shards"] and made["gets_per_shard"] == 1.0
    assert abs(made["gets"] - predicted) <= 0.1 * predicted, (made, predicted)


def test_sources_on_http(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                         store_factory: Callable[[str], Store]) -> None:
    """nginx's shards are weighed by their sizes, the smallest is read, and a missing one is
    seen without reading any."""
    store = store_factory("http")
    sizes = []
    for s, per_shard in enumerate((30, 10)):
        local = Path(write_tar(tmp_path / f"w{s}.tar", _samples("w", s, per_shard)))
        store.put(f"w-{s:03d}.tar", local.read_bytes())
        sizes.append(local.stat().st_size)
    path = _write(tmp_path, {"datasets": [
        {"name": "w", "shards": store.url("w-{000..001}.tar")},
        {"name": "gap", "shards": store.url("w-{000..002}.tar")}]})
    code, report = _report(capsys, path)
    assert code == 2 and len(report["errors"]) == 1 and "gap" in report["errors"][0]
    row = _row(report, "w")
    assert (row["shards"], row["bytes"], row["shard_read"]) == (2, sum(sizes),
                                                                store.url("w-001.tar"))
    assert _row(report, "gap")["missing"] == [store.url("w-002.tar")]


def test_unreachable_store_prints_the_shares_then_exits_2(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, s3_spec: tuple[str, Store],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = s3_spec
    # a refused connection is retried as the policy says: one retry, 10 ms apart (the default
    # policy's 8 retries with backoff up to 10 s waited ~30 s here and showed nothing more)
    monkeypatch.setenv("WDS_RETRIES", "1")
    monkeypatch.setenv("WDS_RETRY_BACKOFF", "0.01")
    spec = yaml.safe_load(Path(path).read_text())
    spec["storage_options"]["s3"]["endpoint_url"] = "http://127.0.0.1:9"  # nothing listens
    path = _write(tmp_path, spec, "unreachable.yaml")
    code, out, err = _check(capsys, path)
    assert code == 2 and "Traceback" not in err
    assert "53.33%" in out  # big: 2 / 3.75
    assert f"source 'big' ({path}: datasets[0], 's3://" in err and "big-{000000..000004}" in err


def test_as_a_subprocess(tmp_path: Path, local_path: str) -> None:
    out = subprocess.run([sys.executable, "-m", "wds_cloud.cli", "spec", "check", local_path,
                          "--simulate", "100"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"spec: {local_path}: 3 sources, weighted mix")
    assert "simulation: 100 draws per slot" in out.stdout and out.stderr == ""
    bad = _write(tmp_path, {"datasets": []}, "empty.yaml")
    out = subprocess.run([sys.executable, "-m", "wds_cloud.cli", "spec", "check", bad],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1 and "invalid spec" in out.stderr and "Traceback" not in out.stderr


def test_shard_sizes_on_s3(store_factory: Callable[[str], Store]) -> None:
    """The lookup behind the rows: HEADs for a few URLs, one listing per directory for more
    (kept in ``listings`` across calls), missing objects and buckets left out."""
    store = store_factory("s3")
    for k in range(5):
        store.put(f"d/s{k}.tar", b"x" * (100 + k))
    router = Router(Settings(), store.storage_options)
    few = [store.url("d/s0.tar"), store.url("d/s9.tar")]
    assert shard_sizes(few, router=router) == {few[0]: 100}
    many = [store.url(f"d/s{k}.tar") for k in range(6)]
    listings: Listings = {}
    assert shard_sizes(many, router=router, listings=listings) == {
        url: 100 + k for k, url in enumerate(many[:5])}
    store.put("d/s5.tar", b"new")
    assert shard_sizes(many, router=router, listings=listings) == {
        url: 100 + k for k, url in enumerate(many[:5])}  # the listing kept
    deadline = time.monotonic() + 30  # listed afresh (rclone keeps its own for 1 s)
    while shard_sizes(many, router=router).get(many[5]) != 3:
        assert time.monotonic() < deadline, "s5.tar never listed"
        time.sleep(0.2)
    assert shard_sizes(many, router=router, listings=listings).get(many[5]) is None
    gone = [f"s3://no-such-bucket-here/s{k}.tar" for k in range(5)]
    assert shard_sizes(gone, router=router) == {}


def test_check_shows_a_schedules_shares_at_a_few_positions_and_plots_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "sched.yaml"
    spec.write_text(yaml.safe_dump({"seed": 1, "datasets": [
        {"name": "web", "shards": "a-{0..3}.tar",
         "weight": {"schedule": "linear", "points": {0: 1.0, 10000: 0.0}}},
        {"name": "code", "shards": "b-{0..3}.tar", "weight": 1.0}]}))
    plot = tmp_path / "shares.png"
    assert main(["spec", "check", str(spec), "--no-list", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "weight schedules: shares at samples" in out
    web = next(line for line in out.splitlines() if line.startswith("web ") and "%" in line
               and "linear" not in line)
    assert web.split()[1:] == ["50.00%", "44.44%", "37.50%", "28.57%", "16.67%", "0.00%"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["spec", "check", str(spec), "--no-list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schedule"]["positions"] == [0, 2000, 4000, 6000, 8000, 10000]
    assert doc["sources"][0]["schedule"]["schedule"] == "linear"


@pytest.mark.parametrize("name", ["missing.yaml", "missing.json#train", "missing", "train.yml.bak"])
def test_a_spec_file_that_does_not_exist_exits_2(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path, name: str) -> None:
    """As the README says (2: "or the spec file missing"), whatever its name ends with: a
    missing file is not an invalid spec (1)."""
    path = str(tmp_path / name)
    code, out, err = _check(capsys, path)
    assert code == 2 and out == ""
    assert err == (f"wds-cloud spec check: {path.split('#')[0]}: cannot read the spec: no such "
                   "file" + ("" if path.endswith((".yaml", "#train")) else
                             " (a spec is a .yaml/.yml/.json file)") + "\n")
    (tmp_path / "notes.txt").write_text("datasets: []\n")  # there, but not a spec: invalid
    code, _, err = _check(capsys, str(tmp_path / "notes.txt"))
    assert code == 1 and "invalid spec: cannot load a dataset spec from" in err


def test_an_extension_no_member_has_is_a_warning_with_the_closest(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``extensions: txt clss`` kept only ``txt``, silently: the shard read has no ``clss``
    member; the warning names the source, its key, the extension and the one it may mean."""
    pattern = _local(tmp_path, "a", 2, 5)
    path = _write(tmp_path, {"datasets": [{"name": "a", "shards": pattern,
                                           "extensions": "txt clss"},
                                          {"name": "b", "shards": _local(tmp_path, "b", 1, 3),
                                           "extensions": ["cls"]}]})
    code, out, err = _check(capsys, path)
    assert code == 0 and err == ""
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: a: {path}: datasets[0].extensions: 'clss' matches no member of the 5 samples "
        f"of {tmp_path}/a/000.tar (extensions there: cls, txt): none is kept for it; did you "
        "mean 'cls'?"]
    code, report = _report(capsys, path)
    assert code == 0 and report["warnings"] == [warnings[0].removeprefix("warning: ")]
