"""No torch where torch is not needed: the CLI commands that hand no data to torch and the
layer-2 pipeline (``DataPipeline``, ``WebDataset``, shard lists, specs) run in fresh
interpreters twice: with ``torch`` blocked (an import finder that refuses it and remembers who
asked, so that a quiet ``except ImportError`` cannot hide an attempt), where they must give
their real results; and with torch installed, where it must not be in ``sys.modules`` at exit.

And with torch: a dataset built before ``import torch`` is a torch ``IterableDataset`` when
the DataLoader sees it (in DataLoader workers too, started with fork or spawn), and
``split_by_worker`` still splits its shards between the workers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import write_tar
from stores import default_sigint

NSHARDS, PER_SHARD = 4, 5
KEYS = [f"s{s}-{i}" for s in range(NSHARDS) for i in range(PER_SHARD)]

#: run first in every interpreter: blocks torch if ``BLOCK``, and says at exit what happened
PRELUDE = """\
import atexit, json, sys
asked = []

class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            asked.append(name)
            raise ImportError(f"torch is blocked in this test ({name})")
        return None

if BLOCK:
    sys.meta_path.insert(0, BlockTorch())
atexit.register(lambda: print("\\n@torch " + json.dumps(
    {"asked": asked, "loaded": "torch" in sys.modules}), file=sys.stderr))
"""

CLI = "import sys\nfrom wds_cloud.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _script(code: str, block: bool) -> str:
    return f"BLOCK = {block}\n{PRELUDE}\n{code}"


def _torch_use(stderr: str) -> dict[str, Any]:
    line = next(line for line in reversed(stderr.splitlines()) if line.startswith("@torch "))
    report: dict[str, Any] = json.loads(line.removeprefix("@torch "))
    return report


def _check(proc: subprocess.CompletedProcess[str], block: bool) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    use = _torch_use(proc.stderr)
    if block:
        assert use["asked"] == [], f"torch was asked for: {use['asked']}"
    else:
        assert not use["loaded"], "torch was imported"


def without_torch(code: str, *args: str, cwd: Path | None = None) -> str:
    """Run ``code`` with ``args`` with torch blocked, then with torch there but unused; the
    stdout of the blocked run. ``{run}`` in an argument becomes ``blocked``/``free``, for
    commands that write somewhere."""
    out = ""
    for block in (True, False):
        run = [a.replace("{run}", "blocked" if block else "free") for a in args]
        proc = subprocess.run([sys.executable, "-c", _script(code, block), *run], cwd=cwd,
                              capture_output=True, text=True, timeout=120)
        _check(proc, block)
        out = proc.stdout if block else out
    return out


def cli(*args: str, cwd: Path | None = None) -> Any:
    """``wds-cloud -q ARGS --json`` without torch (see :func:`without_torch`): its document."""
    return json.loads(without_torch(CLI, "-q", *args, "--json", cwd=cwd))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 shards of 5 samples (txt, cls, json), a spec mixing them, and a tree of files."""
    root = tmp_path_factory.mktemp("notorch")
    for s in range(NSHARDS):
        write_tar(root / f"d-{s}.tar", [
            (f"s{s}-{i}", {"txt": f"text {s} {i}".encode(), "cls": str(10 * s + i).encode(),
                           "json": json.dumps({"n": i}).encode()}) for i in range(PER_SHARD)])
    (root / "mix.yaml").write_text(yaml.safe_dump({"seed": 3, "datasets": [
        {"name": "a", "shards": f"{root}/d-{{0..1}}.tar", "weight": 1},
        {"name": "b", "shards": f"{root}/d-{{2..3}}.tar", "weight": 2}]}))
    (root / "files").mkdir()
    for i in range(5):
        (root / "files" / f"f{i}.txt").write_text(f"file {i}")
        (root / "files" / f"f{i}.cls").write_text(str(i))
    (root / "upper.py").write_text("def up(sample):\n"
                                   "    return {'txt': sample['txt'].upper()}\n")
    return root


def _urls(data: Path) -> str:
    return f"{data}/d-{{0..{NSHARDS - 1}}}.tar"


# -- the CLI -------------------------------------------------------------------------------

def test_ls(data: Path) -> None:
    doc = cli("ls", _urls(data))
    assert [s["url"] for s in doc["shards"]] == [f"{data}/d-{s}.tar" for s in range(NSHARDS)]
    assert [s["size"] for s in doc["shards"]] == [
        (data / f"d-{s}.tar").stat().st_size for s in range(NSHARDS)]


def test_inspect(data: Path) -> None:
    summary = cli("inspect", _urls(data), "--all")["summary"]
    assert summary["samples"] == NSHARDS * PER_SHARD
    assert {e: x["samples"] for e, x in summary["extensions"].items()} == {
        "txt": 20, "cls": 20, "json": 20, "*": 20}
    assert cli("inspect", _urls(data), "-n", "1")["summary"]["inspected"] == 1


def test_head(data: Path) -> None:
    samples = cli("head", _urls(data), "-n", "2")["samples"]
    assert [(s["key"], s["members"]["txt"]) for s in samples] == [
        ("s0-0", "text 0 0"), ("s0-1", "text 0 1")]
    mixed = cli("head", str(data / "mix.yaml"), "-n", "3")["samples"]
    assert len(mixed) == 3 and {s["source"] for s in mixed} <= {"a", "b"}


def test_bench_without_workers(data: Path) -> None:
    doc = cli("bench", _urls(data), "--no-baseline")
    assert doc["workers"] == 0 and doc["stopped"] == "end"
    assert doc["throughput"]["samples"] == NSHARDS * PER_SHARD
    spec = cli("bench", str(data / "mix.yaml"), "--no-baseline", "--limit", "30", "--decode")
    assert spec["throughput"]["samples"] == 30


def test_spec_check(data: Path) -> None:
    doc = cli("spec", "check", str(data / "mix.yaml"))
    assert [(s["name"], s["shards"], s["samples_in_shard_read"]) for s in doc["sources"]] == [
        ("a", 2, PER_SHARD), ("b", 2, PER_SHARD)]


def test_cache(data: Path, tmp_path: Path) -> None:
    fill = ("import sys, wds_cloud as wds\n"
            "ds = wds.WebDataset(sys.argv[1], shardshuffle=False, cache_dir=sys.argv[2], "
            "cache_local=True)\n"
            "print(sum(1 for _ in ds))\n")
    assert without_torch(fill, _urls(data), str(tmp_path)).strip() == "20"
    entries = cli("cache", "ls", "--dir", str(tmp_path))["entries"]
    assert sorted(e["url"] for e in entries) == [f"{data}/d-{s}.tar" for s in range(NSHARDS)]
    assert cli("cache", "verify", "--dir", str(tmp_path))["problems"] == []
    assert cli("cache", "du", "--dir", str(tmp_path))["entries"] == NSHARDS


def test_create_and_map_shards(data: Path, tmp_path: Path) -> None:
    made = cli("create", str(data / "files"), "--output", f"{tmp_path}/{{run}}/p-%03d.tar",
               "--maxcount", "2")
    assert made["ok"] and made["samples"] == 5 and len(made["shards"]) == 3
    mapped = cli("map-shards", "upper:up", f"{tmp_path}/blocked/p-{{000..002}}.tar",
                 "--output", f"{tmp_path}/mapped-{{run}}/", "--workers", "1", cwd=data)
    assert mapped["ok"] and [s["samples"] for s in mapped["shards"]] == [2, 2, 1]
    head = cli("head", f"{tmp_path}/mapped-blocked/p-000.tar", "-n", "1")["samples"]
    assert head[0]["members"]["txt"] == "FILE 0"


@pytest.mark.parametrize("block", [True, False])
def test_serve_s3(tmp_path: Path, block: bool) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", _script(CLI, block), "serve-s3", str(tmp_path), "--port", "0",
         "--bucket", "shards"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    try:
        assert server.stdout is not None
        lines = []
        for line in server.stdout:
            lines.append(line)
            if line.startswith("serving until"):
                break
        assert lines[0].startswith("S3 server (rclone) at http://127.0.0.1:"), lines
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    _check(subprocess.CompletedProcess(server.args, server.returncode, "", stderr), block)


# -- the layer-2 pipeline ------------------------------------------------------------------

PIPELINES = """\
import itertools, json, os, sys
import wds_cloud as wds

urls, spec = sys.argv[1], sys.argv[2]
got = {}
plain = wds.DataPipeline(
    wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples(),
    wds.shuffle(8), wds.decode(), wds.to_tuple("__key__", "cls"), wds.batched(6))
batches = list(plain)
got["plain"] = [k for keys, _ in batches for k in keys]
got["plain_cls"] = sorted(int(c) for _, classes in batches for c in classes)
ds = (wds.WebDataset(urls, shardshuffle=4, seed=1).shuffle(5).decode()
      .to_tuple("__key__", "txt", "cls").batched(3))
got["webdataset"] = [[k, t, c] for keys, texts, classes in ds
                     for k, t, c in zip(keys, texts, classes.tolist())]
got["resampled"] = [s["__key__"] for s in wds.WebDataset(urls, resampled=True, seed=1)
                    .with_epoch(7)]
got["resampled_shards"] = [d["url"] for d in itertools.islice(
    wds.ResampledShards(urls, seed=1, deterministic=True), 6)]
got["spec"] = [s["__key__"] for s in itertools.islice(wds.WebDataset(spec, seed=2), 12)]
got["multishard"] = [d["__source__"] for d in itertools.islice(wds.MultiShardSample(spec), 6)]
os.environ.update(WORKER="1", NUM_WORKERS="2")  # the second of two workers, without torch
got["worker_1_of_2"] = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False)]
print(json.dumps(got))
"""


def test_pipelines(data: Path) -> None:
    got = json.loads(without_torch(PIPELINES, _urls(data), str(data / "mix.yaml")))
    assert sorted(got["plain"]) == KEYS
    assert got["plain_cls"] == sorted(10 * s + i for s in range(NSHARDS) for i in range(PER_SHARD))
    assert sorted(k for k, _, _ in got["webdataset"]) == KEYS
    assert all(t == f"text {k[1]} {k[3]}" and c == 10 * int(k[1]) + int(k[3])
               for k, t, c in got["webdataset"])
    assert len(got["resampled"]) == 7 and set(got["resampled"]) <= set(KEYS)
    assert len(got["resampled_shards"]) == 6
    assert set(got["resampled_shards"]) <= {f"{data}/d-{s}.tar" for s in range(NSHARDS)}
    assert len(got["spec"]) == 12 and set(got["spec"]) <= set(KEYS)
    assert len(got["multishard"]) == 6 and set(got["multishard"]) <= {"a", "b"}
    assert got["worker_1_of_2"] == [k for k in KEYS if k[1] in "13"]


# -- with torch ----------------------------------------------------------------------------

BUILT_BEFORE_TORCH = """\
import json, sys
import wds_cloud as wds

ds = wds.WebDataset(sys.argv[1], shardshuffle=False).to_tuple("__key__")
assert "torch" not in sys.modules
import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _DatasetKind

assert isinstance(ds, IterableDataset)
loader = DataLoader(ds, batch_size=None, num_workers=2)
assert loader._dataset_kind == _DatasetKind.Iterable
keys = [key for (key,) in loader]
in_process = [key for (key,) in DataLoader(ds, batch_size=None)]
import webdataset
theirs = sorted(n for n in dir(webdataset) if isinstance(getattr(webdataset, n), type)
                and issubclass(getattr(webdataset, n), IterableDataset))
ours = sorted(n for n in wds._TORCH_DATASETS if issubclass(getattr(wds, n), IterableDataset))
print(json.dumps({"keys": keys, "in_process": in_process, "theirs": theirs, "ours": ours}))
"""


def test_a_dataset_built_before_torch_in_a_dataloader(data: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", BUILT_BEFORE_TORCH, _urls(data)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    # split_by_worker splits: each shard is read by one worker (else every key twice)
    assert sorted(got["keys"]) == KEYS
    assert got["keys"] != KEYS  # the two workers' samples interleave
    assert got["in_process"] == KEYS
    assert set(got["theirs"]) <= set(got["ours"])
    assert sorted(got["ours"]) == sorted(json.loads(_torch_datasets()))


def _torch_datasets() -> str:
    import wds_cloud

    return json.dumps(sorted(wds_cloud._TORCH_DATASETS))


SPAWNED = """\
import json, sys
import wds_cloud as wds

shards = wds.SimpleShardList(sys.argv[1])  # only looked up and built: no pipeline yet
import torch
from torch.utils.data import DataLoader, IterableDataset

assert isinstance(shards, IterableDataset)
urls = [d["url"] for d in DataLoader(shards, batch_size=None)]
ds = wds.WebDataset(sys.argv[1], shardshuffle=False).to_tuple("__key__")
loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn",
                    worker_init_fn=__import__("workercheck").is_iterable_dataset)
print(json.dumps({"urls": urls, "keys": [key for (key,) in loader]}))
"""

WORKER_CHECK = """\
import torch.utils.data as data


def is_iterable_dataset(worker_id):
    dataset = data.get_worker_info().dataset
    assert isinstance(dataset, data.IterableDataset), type(dataset).__mro__
"""


def test_a_dataset_in_spawned_workers_and_a_shard_list_alone(data: Path,
                                                              tmp_path: Path) -> None:
    (tmp_path / "workercheck.py").write_text(WORKER_CHECK)
    proc = subprocess.run([sys.executable, "-c", SPAWNED, _urls(data)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["urls"] == [f"{data}/d-{s}.tar" for s in range(NSHARDS)]
    assert sorted(got["keys"]) == KEYS
