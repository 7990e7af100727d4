"""A job that changes shape mid-epoch, under torchrun on the S3 test server: 2 ranks x 2
workers, killed mid-epoch; resumed on 1 rank x 3 workers with another batch size, killed again;
resumed on 3 ranks x 1 worker. A three-source spec with webdataset's semantics (every shard
once per epoch) through a shuffle buffer: the union of what every phase yielded in the epoch
is every sample exactly once. A weighted three-source spec (resampled): the shares hold within
2 points over 20,000 samples across the changes."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import put_source
from stores.base import Store
from zygote import Zygote

from wds_cloud.spec import DatasetSpec

WORKER = Path(__file__).with_name("reshape_worker.py")
#: (ranks, workers, batch, exact batches per rank or -1 for the epoch's end, mix batches)
PHASES = [(2, 2, 8, 12, 70), (1, 3, 6, 45, 140), (3, 1, 5, -1, 47)]
SIZES = {"a": (6, 100), "b": (4, 100), "c": (3, 100)}  # shards, samples per shard


def _members(name: str, shard: int, i: int) -> dict[str, bytes]:
    return {"txt": f"{name} {shard} {i}".encode()}


def _spec(store: Store, tmp: Path, name: str, weights: dict[str, float] | None) -> Path:
    datasets = []
    for source, (shards, per) in SIZES.items():
        entry: dict[str, Any] = {"name": source, "shards": put_source(
            store, tmp, f"reshape-{name}", source, shards, per, _members)}
        if weights:
            entry["weight"] = weights[source]
        datasets.append(entry)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"storage_options": store.storage_options,
                                    "datasets": datasets}))
    return path


def _phase(zygote: Zygote, exact: Path, mix: Path, out: Path, n: int, state: Path | None
           ) -> list[Any]:
    """One torchrun launch, its launcher and its ranks forked from the zygote (``--no-python``:
    torchrun starts ``zygote.python()``, which runs the rank script in a child of the zygote)."""
    ranks, workers, batch, exact_steps, mix_steps = PHASES[n]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={ranks}", "--no-python", *zygote.python(), "-u", str(WORKER),
           str(exact), str(mix), str(out), str(n), str(workers), str(batch), str(exact_steps),
           str(mix_steps)]
    cmd += [str(state)] if state else []
    done = zygote.run(cmd, capture_output=True, text=True, timeout=300,
                      env={**os.environ, "OMP_NUM_THREADS": "1"})
    killed = exact_steps >= 0  # the ranks kill themselves, as a preempted job
    assert (done.returncode != 0) == killed, done.stderr[-3000:]
    assert (out / f"{n}.state").exists(), done.stderr[-3000:]
    return [json.loads((out / f"{n}-rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
def test_a_job_killed_and_resumed_in_two_other_shapes_reads_the_epoch_exactly_once(
        store_factory: Callable[[str], Store], tmp_path: Path, zygote: Zygote) -> None:
    s3 = store_factory("s3")
    exact = _spec(s3, tmp_path, "exact", None)
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    mix = _spec(s3, tmp_path, "mix", weights)
    out = tmp_path / "out"
    out.mkdir()
    records = []
    for n in range(len(PHASES)):
        records.append(_phase(zygote, exact, mix, out, n, out / f"{n - 1}.state" if n else None))

    keys = Counter(key for phase in records for rank in phase for key, _ in rank["exact"])
    every = {f"{source}{s:02d}-{i:04d}" for source, (shards, per) in SIZES.items()
             for s in range(shards) for i in range(per)}
    assert set(keys) == every
    assert max(keys.values()) == 1, [k for k, v in keys.items() if v > 1][:5]
    for phase, (ranks, _, batch, steps, _) in zip(records, PHASES, strict=True):
        if steps >= 0:  # each rank took the steps asked for: equal steps
            assert [len(rank["exact"]) for rank in phase] == [steps * batch] * ranks

    drawn = [source for phase in records for rank in phase for _, source in rank["mix"]]
    assert len(drawn) >= 20_000
    shares = DatasetSpec.from_yaml(mix).probabilities(0, 4)
    for name in weights:
        assert abs(drawn.count(name) / len(drawn) - shares[name]) < 0.02, Counter(drawn)
    # and every mix sample is of its source
    assert all(key.startswith(source) for phase in records for rank in phase
               for key, source in rank["mix"])
