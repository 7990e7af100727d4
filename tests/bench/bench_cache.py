# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: reading a dataset through the shard cache, against baselines measured in the same run.

    python tests/bench/bench_cache.py [--quick] [--shards N] [--shard-mib M] [--repeats R]
                                      [--profile]

nginx serves N tar shards (full: 32 × 16 MiB; ``--quick``: 8 × 4 MiB) of 1 MiB samples; each
epoch reads every sample with ``wds.WebDataset(urls, shardshuffle=False)`` (read-ahead at its
default) and counts the bytes:

(a) uncached streaming over HTTP from nginx;
(b) the first epoch through an empty cache (``cache_dir=`` a fresh directory for every run);
(c) a warm epoch through a cache that holds every shard (all hits);
(d) the same files read from local disk (nginx's root).

Printed: (b)/(a), the first epoch through the cache against uncached streaming (target ≥ 0.9×),
and (c)/(d), a warm epoch against local disk (target ≥ 0.9×), each the median of several
interleaved repetitions (a, b, c, d, a, b, ...), so that drift in the machine's speed hits all
alike. The page cache cannot be dropped here: the shards served by nginx (a, b, d) and the
cached copies (c) are in the page cache, so (c) and (d) compare the same kind of read. An epoch
is timed until its last sample; in (b) the last downloads may still be publishing their entry
then, which the benchmark waits for, untimed, before the next run. Also printed: the CPU
seconds this process spent per GB in each mode (all threads, (b)'s downloads included), which
says what the cache costs when the CPU, not the network, is the limit (as on loopback).

``--profile`` runs one more (b) epoch under cProfile and prints where the consuming thread
spends its time, its CPU time against the whole process's (the rest is background threads:
the cache's downloads, read-ahead, fsspec's I/O loop), and when the last entry was published.

It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for stores

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # nothing may leave the machine
os.environ.setdefault("NO_GCE_CHECK", "true")

from stores.nginx import NginxServer

import wds_cloud as wds
from wds_cloud.cache import wait_downloads

MB = 10**6
MEMBER = 2**20


def make_shards(root: Path, count: int, size: int) -> list[str]:
    """``count`` shards of ``size`` bytes (samples of one 1 MiB member) under ``root``."""
    names = []
    payload = os.urandom(MEMBER)
    for i in range(count):
        name = f"cache-bench-{i:04d}.tar"
        with wds.TarWriter(str(root / name)) as sink:
            for k in range(size // MEMBER):
                # distinct bytes per sample, cheaply: a rotation of one random block
                cut = (i * 7919 + k * 104729) % MEMBER
                sink.write({"__key__": f"s{i:04d}-{k:04d}",
                            "bin": payload[cut:] + payload[:cut]})
        names.append(name)
    return names


def epoch(urls: list[str], cache_dir: str | None = None) -> int:
    """Read every sample; the payload bytes."""
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False, cache_dir=cache_dir)
    return sum(len(sample["bin"]) for sample in dataset)


def fills_done(timeout: float = 120.0) -> None:
    """Wait for the cache's downloads of this process to publish."""
    if not wait_downloads(timeout):
        raise RuntimeError("the cache's downloads did not finish")


def cpu_seconds() -> float:
    """CPU time (user + system) of this process so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(run: Callable[[], int], expect: int, cpu: list[float]) -> float:
    """Seconds until ``run()`` returned; its CPU seconds, background downloads included, are
    appended to ``cpu``."""
    cpu_start, start = cpu_seconds(), time.perf_counter()
    got = run()
    elapsed = time.perf_counter() - start
    fills_done()
    cpu.append(cpu_seconds() - cpu_start)
    if got != expect:
        raise RuntimeError(f"read {got} bytes, expected {expect}")
    return elapsed


def report(label: str, ours: list[float], base: list[float], total: int, base_label: str,
           target: float) -> None:
    mine, theirs = statistics.median(ours), statistics.median(base)
    print(f"{label}: {total / mine / MB:,.0f} MB/s vs {base_label} {total / theirs / MB:,.0f} "
          f"MB/s, ratio {theirs / mine:.2f}× (target ≥ {target}×; median of {len(ours)}; "
          f"runs {_spread(ours, total)} vs {_spread(base, total)} MB/s)", flush=True)


def _spread(times: list[float], total: int) -> str:
    return "/".join(f"{total / t / MB:,.0f}" for t in times)


def profile_first_epoch(urls: list[str], scratch: Path, total: int) -> None:
    """One (b) epoch under cProfile (the consuming thread), with CPU and wall times."""
    cache_dir = scratch / "profiled"
    profiler = cProfile.Profile()
    cpu_start, thread_start, start = cpu_seconds(), time.thread_time(), time.perf_counter()
    profiler.enable()
    got = epoch(urls, str(cache_dir))
    profiler.disable()
    consumed, thread_cpu = time.perf_counter() - start, time.thread_time() - thread_start
    fills_done()
    published, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    shutil.rmtree(cache_dir)
    gb = got / 1e9
    print(f"\nprofile of one first epoch through the cache ({got / MB:,.0f} MB): samples "
          f"consumed after {consumed:.2f} s, last entry published after {published:.2f} s; CPU "
          f"{cpu / gb:.2f} s/GB in all, {thread_cpu / gb:.2f} s/GB in the consuming thread, "
          f"{(cpu - thread_cpu) / gb:.2f} s/GB in background threads", flush=True)
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(12)
    if got != total:
        print(f"(read {got} bytes, expected {total})")


def run(root: Path, count: int, size: int, repeats: int, profile: bool) -> None:
    served = root / "served"
    served.mkdir()
    names = make_shards(served, count, size)
    total = count * (size // MEMBER) * MEMBER
    scratch = root / "caches"
    scratch.mkdir()
    with NginxServer(served) as nginx:
        remote = [nginx.url_for(name) for name in names]
        local = [str(served / name) for name in names]
        warm = str(scratch / "warm")
        epoch(remote, warm)  # fills the warm cache (and puts every file in the page cache)
        fills_done()
        epoch(local)
        times: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
        cpu: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
        for r in range(repeats):
            times["a"].append(timed(lambda: epoch(remote), total, cpu["a"]))
            fresh = str(scratch / f"first-{r}")
            times["b"].append(timed(lambda: epoch(remote, fresh), total,  # noqa: B023
                                    cpu["b"]))
            shutil.rmtree(fresh)
            times["c"].append(timed(lambda: epoch(remote, warm), total, cpu["c"]))
            times["d"].append(timed(lambda: epoch(local), total, cpu["d"]))
        requests = sum(1 for e in nginx.access_log()
                       if e.method == "GET" and "/cache-bench-" in e.uri)
        expected = count * (1 + 2 * repeats)  # the warm fill, and each (a) and (b) run
        gets = (f"nginx served {requests} shard GETs, one per shard for the warm fill and each "
                "(a) and (b) run: the warm epochs made none" if requests == expected else
                f"nginx served {requests} shard GETs, {expected} expected")
        label = f"{count} shards of {size / 2**20:g} MiB from nginx"
        print(f"{label}, {repeats} interleaved repetitions; (a) uncached streaming "
              f"{total / statistics.median(times['a']) / MB:,.0f} MB/s, (d) local disk "
              f"{total / statistics.median(times['d']) / MB:,.0f} MB/s (files in page cache); "
              f"{gets}", flush=True)
        report("(b)/(a) first epoch through the cache vs uncached streaming", times["b"],
               times["a"], total, "uncached", 0.9)
        report("(c)/(d) warm epoch (all hits) vs local disk, both in page cache", times["c"],
               times["d"], total, "local disk", 0.9)
        gb = total / 1e9
        print("CPU seconds of this process per GB read (median [runs]; all threads, the "
              "cache's downloads included): " + ", ".join(
                  f"({k}) {statistics.median(v) / gb:.2f} [{'/'.join(f'{c / gb:.2f}' for c in v)}]"
                  for k, v in cpu.items()), flush=True)
        if profile:
            profile_first_epoch(remote, scratch, total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 small shards, 3 repetitions")
    parser.add_argument("--shards", type=int, help="number of shards (default 32; quick 8)")
    parser.add_argument("--shard-mib", type=int, help="MiB per shard (default 16; quick 4)")
    parser.add_argument("--repeats", type=int, help="interleaved repetitions (default 5; quick 3)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more first epoch through the cache")
    args = parser.parse_args()
    count = args.shards or (8 if args.quick else 32)
    size = (args.shard_mib or (4 if args.quick else 16)) * 2**20
    repeats = args.repeats or (3 if args.quick else 5)
    for name in ("WDS_CACHE", "WDS_CACHE_SIZE", "WDS_CACHE_LOCAL", "WDS_CACHE_REVALIDATE"):
        os.environ.pop(name, None)  # (a) and (d) must not go through a cache of the caller's
    with tempfile.TemporaryDirectory(prefix="wds-bench-cache-") as tmp:
        run(Path(tmp), count, size, repeats, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
