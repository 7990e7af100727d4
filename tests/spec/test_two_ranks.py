"""A three-source spec over the real S3 and GCS test servers, read by two ranks under
``torchrun --nproc_per_node=2`` (gloo, CPU) with 2 DataLoader workers each: equal steps,
different streams, shares within 2 points of the realized ones over 20,000 samples (also as
``loader.stats()`` sums them over the ranks), and streams that are a function of the seed."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shardgen import three_source_spec
from stores.base import Store
from zygote import Zygote

from wds_cloud.spec import DatasetSpec

WORKER = Path(__file__).with_name("two_ranks_worker.py")
EPOCHS, BATCH, PER_WORKER = 2, 50, 50  # per rank: 2 epochs x 2 workers x 50 batches x 50


def _members(name: str, shard: int, i: int) -> dict[str, bytes]:
    return {"txt": f"{name}".encode()}


@pytest.fixture
def spec_file(store_factory: Callable[[str], Store], tmp_path: Path) -> Path:
    return three_source_spec(store_factory("s3"), store_factory("gs"), tmp_path, "mix",
                             seed=0, sizes=((10, 500), (10, 300), (5, 200)), members=_members)


def _torchrun(zygote: Zygote, spec: Path, out: Path, seed: int, mode: str = ""
              ) -> list[dict[str, Any]]:
    """torchrun's launcher and its ranks, forked from the zygote (``--no-python``: torchrun
    starts ``zygote.python()``, which runs the rank script in a child of the zygote)."""
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--no-python", *zygote.python(), "-u", str(WORKER), str(spec), str(out), str(seed),
           str(EPOCHS), str(BATCH), str(PER_WORKER), mode]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = zygote.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_two_ranks_equal_steps_shares_and_reproducible_streams(spec_file: Path, tmp_path: Path,
                                                               zygote: Zygote) -> None:
    ranks = _torchrun(zygote, spec_file, tmp_path / "run1", seed=42)
    steps = [[e["steps"] for e in r["epochs"]] for r in ranks]
    assert steps[0] == steps[1] == [2 * PER_WORKER] * EPOCHS  # DDP would not hang
    streams = [[tuple(x) for e in r["epochs"] for x in e["stream"]] for r in ranks]
    assert streams[0] != streams[1]
    assert len(set(streams[0]) & set(streams[1])) < len(streams[0])  # not one stream twice

    spec = DatasetSpec.from_yaml(spec_file)
    total = 0
    observed: Counter[str] = Counter()
    expected: Counter[str] = Counter()
    for r in ranks:
        for e in r["epochs"]:
            n = len(e["stream"])
            total += n
            observed.update(source for _, source in e["stream"])
            for name, p in spec.probabilities(e["epoch"], 42).items():
                expected[name] += n * p
    assert total >= 20_000
    for name in ("a", "b", "c"):
        assert abs(observed[name] - expected[name]) / total < 0.02, (observed, expected)
    # each key belongs to its source
    assert all(key.startswith(source) for s in streams for key, source in s)
    # what the job saw, per source, summed over both ranks and their workers
    stats = ranks[0]["stats"]
    assert stats == ranks[1]["stats"] and stats["ranks"] == 2 and stats["samples"] == total
    for name in ("a", "b", "c"):
        seen = stats["sources"][name]
        assert seen["samples"] == observed[name]
        assert abs(seen["share"] - expected[name] / total) < 0.02
        assert seen["requests"] >= seen["shards"] > 0 and seen["bytes_read"] > 0
    assert sum(s["requests"] for s in stats["sources"].values()) == stats["io"]["requests"]

    # stopped mid-epoch, resumed by a new torchrun: both ranks go on with the same stream (so a
    # new job with the same seed gives the same streams up to the stop, and after it)
    stopped = _torchrun(zygote, spec_file, tmp_path / "run2", seed=42, mode="stop:37")
    resumed = _torchrun(zygote, spec_file, tmp_path / "run2", seed=42, mode="resume")
    for r in range(2):
        head = [tuple(x) for e in stopped[r]["epochs"] for x in e["stream"]]
        tail = [tuple(x) for e in resumed[r]["epochs"] for x in e["stream"]]
        assert head + tail == streams[r], f"rank {r}"
        # the same 37 batches with seed 43 are another stream
        other = [tuple(x) for batch in stopped[r]["other_seed"] for x in batch]
        assert len(other) == len(head) and other != head, f"rank {r}"
