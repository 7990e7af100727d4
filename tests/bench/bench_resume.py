# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: the cost of a restore. Time to the first batch after ``load_state_dict`` against
time to the first batch of a fresh run, same data, same run.

    python tests/bench/bench_resume.py [--rounds N] [--quick]

Starts the embedded S3 server (rclone) on 127.0.0.1, writes a three-source spec's shards to
it, and reads ``WebDataset(spec).shuffle(1000).batched(16)`` in this process: a state is taken
after 300 batches (the buffer full, each source mid-shard); then, alternating, a fresh
dataset's first batch and a restored dataset's first batch (which refetches the 1,000
buffered samples with one ranged read per shard and reopens each source at its offset).
Prints the medians and the ratio restore / fresh; the goal is at most 2×. A report, not a
test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import wds_cloud as wds
from wds_cloud.testing.locals3 import LocalS3Server


def first_batch(make: Any, state: dict[str, Any] | None) -> float:
    start = time.perf_counter()
    dataset = make()
    if state is not None:
        dataset.load_state_dict(state)
    next(iter(dataset))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as root:
        os.makedirs(os.path.join(root, "bench"))
        with LocalS3Server(root) as server:
            options = {"s3": server.storage_options}
            for name in "abc":
                with wds.ShardWriter(f"s3://bench/{name}/{name}-%04d.tar", maxcount=2000,
                                     storage_options=options) as sink:
                    for i in range(8000):
                        sink.write({"__key__": f"{name}{i:06d}", "txt": os.urandom(200),
                                    "cls": b"1"})
            spec = {"seed": 1, "storage_options": options, "datasets": [
                {"name": n, "shards": f"s3://bench/{n}/{n}-{{0000..0003}}.tar", "weight": w}
                for n, w in (("a", 0.5), ("b", 0.3), ("c", 0.2))]}

            def make() -> Any:
                return wds.WebDataset(spec).shuffle(1000).batched(16)

            dataset = make()
            it = iter(dataset)
            for _ in range(300):
                next(it)
            state = dataset.state_dict()
            fresh, restored = [], []
            for _ in range(rounds):
                fresh.append(first_batch(make, None))
                restored.append(first_batch(make, state))
    f, r = statistics.median(fresh), statistics.median(restored)
    print(f"time to the first batch (S3 on 127.0.0.1, 3 sources, shuffle buffer 1,000, "
          f"median of {rounds}): fresh {f * 1e3:.0f} ms, after restore {r * 1e3:.0f} ms, "
          f"ratio {r / f:.2f}× (goal ≤ 2×) [fresh {'/'.join(f'{x * 1e3:.0f}' for x in fresh)}"
          f"; restore {'/'.join(f'{x * 1e3:.0f}' for x in restored)} ms]")
    stats = wds.io_stats()  # what this process read from stores
    print(f"# GETs per shard: {stats['gets_per_shard']:.2f} ({stats['gets']} GETs for "
          f"{stats['shards']} shards opened at a store by this process)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
