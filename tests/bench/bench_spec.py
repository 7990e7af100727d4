# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: the cost of mixing. A three-source spec against reading one source, the same
shards, the same run.

    python tests/bench/bench_spec.py [--samples N] [--quick]

Writes three sources of tar shards with tiny samples (where per-sample overhead shows most) to
a temporary directory, warms the page cache, then measures samples/s of

* one source: ``WebDataset(all nine shards, resampled=True)``: no mixing;
* the mix: ``WebDataset(spec)`` over the same nine shards as three sources of three shards,
  weights 0.5 / 0.3 / 0.2,

in interleaved rounds (the order alternating), the first sample of each run excluded
(start-up), and prints the median of the rounds' ratios mix / single (each round's two runs
are next to each other in time, so a machine shared with others slows both alike), the
medians of the rates, and the load. The target is a cost of at most 10% (ratio ≥ 0.90×). It
is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import statistics
import tarfile
import tempfile
import time
from typing import Any

import wds_cloud


def write_source(directory: str, name: str, shards: int, per_shard: int) -> list[str]:
    urls = []
    for s in range(shards):
        path = os.path.join(directory, f"{name}-{s:03d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                for ext, data in (("txt", f"{name} {s} {i}".encode()), ("cls", b"7")):
                    info = tarfile.TarInfo(f"{name}{s:03d}-{i:06d}.{ext}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tf.addfile(info, io.BytesIO(data))
        urls.append(path)
    return urls


def rate(dataset: Any, n: int) -> float:
    it = iter(dataset)
    next(it)  # start-up (opening the first shards) is not what is measured
    start = time.perf_counter()
    for _ in itertools.islice(it, n):
        pass
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300_000, help="samples per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds = 40_000, 5
    per_shard = 5_000
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
        sources = {name: write_source(tmp, name, 3, per_shard) for name in "abc"}
        every = [u for urls in sources.values() for u in urls]
        for url in every:  # the page cache
            with open(url, "rb") as f:
                while f.read(1 << 20):
                    pass
        spec = {"seed": 1, "datasets": [
            {"name": name, "shards": urls, "weight": w}
            for (name, urls), w in zip(sources.items(), (0.5, 0.3, 0.2), strict=True)]}
        single, mixed = [], []
        for r in range(args.rounds):
            for which in ("single", "mix") if r % 2 == 0 else ("mix", "single"):
                if which == "single":
                    single.append(rate(wds_cloud.WebDataset(every, resampled=True, seed=1),
                                       args.samples))
                else:
                    mixed.append(rate(wds_cloud.WebDataset(spec), args.samples))
        ratio = statistics.median(m / s for m, s in zip(mixed, single, strict=True))
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"three-source mix vs one source ({len(every)} shards, {per_shard} tiny samples "
              f"each, {args.samples:,} samples per run, median of {args.rounds} interleaved "
              f"rounds): mix {statistics.median(mixed):,.0f}/s, single "
              f"{statistics.median(single):,.0f}/s, ratio {ratio:.2f}× "
              f"(target ≥ 0.90×: mixing costs at most 10%) "
              f"[runs mix {'/'.join(f'{r:,.0f}' for r in mixed)}; "
              f"single {'/'.join(f'{r:,.0f}' for r in single)}] (load average {load})")
    stats = wds_cloud.io_stats()
    print(f"# GETs per shard: {stats['gets_per_shard']:.2f} ({stats['gets']} GETs for "
          f"{stats['shards']} shards opened at a store: local shards need none)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
