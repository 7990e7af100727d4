# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: wds_cloud's tar reading against webdataset 1.0.2, measured in the same run.

    python tests/bench/bench_core.py [--samples N] [--rounds R] [--quick]

Writes shards to a temporary directory (tiny members: 3 per sample of about 100-300 bytes;
100 KB members; 4 MB members), warms the page cache, then prints one line per measurement::

    name: wds_cloud X/s, webdataset Y/s, ratio Z× (target ≥ T×)

each rate the median of R rounds that take the libraries in turn. For large members the line
also gives two limits: a plain Python loop of ``f.read(4 MB)`` over the same files (one copy
from the page cache into ``bytes``, which is what the reader does too), and the bare reads
that any reader handing out each member as its own ``bytes`` makes (``read(member)``, then
the padding and next header), without parsing: the best ratio a reader can show; and the same
per sample, in µs, beside the target's and this benchmark's own cost of counting a sample
(inside every rate): the room the target leaves for parsing and grouping. Then:

- a warm epoch of the 100 KB samples through the shard cache (``cache_local=True``: every
  shard a hit), in GB/s against LitData's warm epoch of the same samples on this machine
  (6.8-9.2 GB/s, as zero-copy views; LitData is not installed here, so that is a constant);
- peak traced allocation on one shard and a 4× larger one (flat: streaming);
- the peak RSS of a process without torch iterating 1 and 8 local shards of 75 MB.

and a summary. It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import gc
import glob
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import webdataset

import wds_cloud

Factory = Callable[[list[str]], Iterable[Any]]


def write_shards(directory: str, prefix: str, nsamples: int, nshards: int,
                 member: Callable[[random.Random, int], list[tuple[str, bytes]]]) -> list[str]:
    """``nshards`` tar files holding ``nsamples`` samples in all; returns their paths."""
    rng = random.Random(len(prefix) + nsamples)
    urls = []
    per_shard = -(-nsamples // nshards)
    for shard in range(nshards):
        path = os.path.join(directory, f"{prefix}-{shard:04d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(shard * per_shard, min(nsamples, (shard + 1) * per_shard)):
                for name, data in member(rng, i):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), 1_700_000_000
                    tf.addfile(info, io.BytesIO(data))
        urls.append(path)
    return urls


def tiny_members(rng: random.Random, i: int) -> list[tuple[str, bytes]]:
    text = "".join(rng.choices("abcdefghij klmnopqrstuvwxyz", k=rng.randint(100, 300)))
    meta = json.dumps({"id": i, "caption": text[: rng.randint(60, 250)]})
    return [(f"{i:08d}.txt", text.encode()), (f"{i:08d}.cls", str(i % 1000).encode()),
            (f"{i:08d}.json", meta.encode())]


def big_members(rng: random.Random, i: int) -> list[tuple[str, bytes]]:
    return [(f"{i:08d}.bin", rng.randbytes(100_000))]


def huge_members(rng: random.Random, i: int) -> list[tuple[str, bytes]]:
    return [(f"{i:08d}.bin", rng.randbytes(4 << 20))]


def pipelines(decode: bool) -> dict[str, Factory]:
    """How each library reads ``urls``: a DataPipeline of SimpleShardList, tarfile_to_samples
    and (if ``decode``) the default decoder."""
    def ours(urls: list[str]) -> Iterable[Any]:
        try:
            stages: list[Any] = [wds_cloud.SimpleShardList(urls), wds_cloud.tarfile_to_samples()]
            if decode:
                stages.append(wds_cloud.decode())
            return wds_cloud.DataPipeline(*stages)
        except (ImportError, AttributeError):  # pipeline pieces not there: the bare reader
            if decode:
                raise
            from wds_cloud.tar import samples as tario
            return tario.tarfile_samples([{"url": u} for u in urls],
                                         open_stream=lambda u: open(u, "rb"))

    def theirs(urls: list[str]) -> Iterable[Any]:
        stages: list[Any] = [webdataset.SimpleShardList(urls), webdataset.tarfile_to_samples()]
        if decode:
            stages.append(webdataset.decode())
        return webdataset.DataPipeline(*stages)

    return {"wds_cloud": ours, "webdataset": theirs}


def one_pass(factory: Factory, urls: list[str], measure: Callable[[Any], int]) -> float:
    """Units/s of one pass over ``urls`` (units counted by ``measure(sample)``)."""
    gc.collect()
    start = time.perf_counter()
    units = sum(measure(sample) for sample in factory(urls))
    return units / (time.perf_counter() - start)


def plain_read(urls: list[str], measure: Any = None) -> float:
    """Bytes/s of a plain Python loop of ``f.read(4 MB)`` over the files: the limit of reading
    them into ``bytes`` (one copy from the page cache)."""
    gc.collect()
    start, total = time.perf_counter(), 0
    for url in urls:
        with open(url, "rb") as f:
            while data := f.read(4 << 20):
                total += len(data)
    return total / (time.perf_counter() - start)


def member_reads(urls: list[str], member: int) -> float:
    """Bytes/s of reading shards of ``member``-byte members the way a reader that hands out
    each member as its own ``bytes`` must at least: ``read(member)``, then the padding and
    the next header, in a bare loop (the floor of such a reader; no parsing)."""
    gc.collect()
    tail = -member % 512 + 512
    start, total = time.perf_counter(), 0
    for url in urls:
        with open(url, "rb") as f:
            read = f.read
            read(512)
            while len(read(member)) == member:
                total += member
                read(tail)
    return total / (time.perf_counter() - start)


def counting_us(factory: Factory, urls: list[str], count: Callable[[Any], int]) -> float:
    """µs per sample that ``count`` takes (part of each rate measured, not of the reader)."""
    samples = [sample for _, sample in zip(range(200), factory(urls[:1]), strict=False)]
    start = time.perf_counter()
    for _ in range(50):
        sum(count(sample) for sample in samples)
    return (time.perf_counter() - start) / (50 * len(samples)) * 1e6


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """The median rate of each run over ``rounds`` rounds that take them in turn (the order
    rotating each round), so that drift in the machine's speed hits all alike."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(runs[name]())
    return {name: statistics.median(values) for name, values in rates.items()}


def touch(sample: dict[str, Any]) -> int:
    """Count a sample, looking at every value (so lazy decoding would be paid for)."""
    return 1 if all(v is not touch for v in sample.values()) else 0


def size(sample: dict[str, Any]) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def peak_bytes(factory: Factory, urls: list[str]) -> int:
    """Peak traced Python allocation while iterating ``urls`` (samples are dropped at once)."""
    gc.collect()
    tracemalloc.start()
    for _ in factory(urls):
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def warm(urls: list[str]) -> None:
    for url in urls:
        with open(url, "rb") as f:
            while f.read(1 << 22):
                pass


Result = tuple[str, float | None, float, str]  # label, value (None: not measured), target, unit


def compare(label: str, libs: dict[str, Factory], urls: list[str], count: Callable[[Any], int],
            rounds: int, unit: str, target: float, scale: float = 1.0,
            member: int = 0) -> Result:
    """One report line: wds_cloud against webdataset (and, for ``member``-byte members, the
    plain-read limits)."""
    try:
        for factory in libs.values():  # warm-up: imports, first-use caches
            for _ in zip(range(50), factory(urls[:1]), strict=False):
                pass
        runs = {name: (lambda f=f: one_pass(f, urls, count)) for name, f in libs.items()}
        if member:
            runs["plain read"] = lambda: plain_read(urls)
            runs["member reads"] = lambda: member_reads(urls, member)
        rates = interleaved(runs, rounds)
    except Exception as exc:  # a report, not a test: say what failed and go on
        print(f"{label}: failed: {exc!r}", flush=True)
        return label, None, target, "×"
    ours, theirs = rates["wds_cloud"] / scale, rates["webdataset"] / scale
    ratio = ours / theirs
    line = (f"{label}: wds_cloud {ours:,.0f} {unit}, webdataset {theirs:,.0f} {unit}, "
            f"ratio {ratio:.2f}× (target ≥ {target}×)")
    if member:
        plain, bare = rates["plain read"] / scale, rates["member reads"] / scale
        line += (f"; limits: plain f.read(4 MB) {plain:,.0f} {unit} (wds_cloud at "
                 f"{ours / plain:.2f}× it), bare read(member)+read(header) {bare:,.0f} {unit} "
                 f"(= {bare / theirs:.2f}× webdataset; wds_cloud at {ours / bare:.2f}× it)")
        us = member / scale * 1e6  # per sample, from a rate in units/s
        goal = us / theirs / target
        line += (f"; per sample: bare reads {us / bare:.1f} µs, the target {goal:.1f} µs, "
                 f"wds_cloud {us / ours:.1f} µs, of which this benchmark's own counting "
                 f"{counting_us(libs['wds_cloud'], urls, count):.1f} µs")
    print(line, flush=True)
    return label, ratio, target, "×"


def warm_cache(tmp: str, urls: list[str], rounds: int, target_gbs: float,
               member: int = 100_000) -> Result:
    """A warm epoch through the shard cache (every shard a hit) against the plain read of
    the cached files and the bare member reads of them (the floor of a reader handing out
    ``bytes``): the cache's read path should cost nothing over the reader's."""
    import wds_cloud.cache

    label = "warm cache epoch (100 KB samples)"
    cache_dir = os.path.join(tmp, "cache")
    dataset = wds_cloud.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir,
                                   cache_local=True)
    try:
        for _ in dataset:  # the first epoch fills the cache
            pass
        wds_cloud.cache.wait_downloads(60)
        cached = sorted(glob.glob(os.path.join(cache_dir, "**", "*.tar"), recursive=True))
        warm(cached)
        rates = interleaved({"cache": lambda: one_pass(lambda _: dataset, urls, size),
                             "plain": lambda: plain_read(cached),
                             "bare": lambda: member_reads(cached, member)}, rounds)
    except Exception as exc:
        print(f"{label}: failed: {exc!r}", flush=True)
        return label, None, target_gbs, " GB/s"
    gbs = rates["cache"] / 1e9
    print(f"{label}: wds_cloud {gbs:.2f} GB/s (target ≥ {target_gbs} GB/s, LitData's warm "
          f"epoch of the same samples on this machine, as views); limits: plain f.read(4 MB) "
          f"of the cached files {rates['plain'] / 1e9:.2f} GB/s, bare read(member)+"
          f"read(header) of them {rates['bare'] / 1e9:.2f} GB/s (wds_cloud at "
          f"{rates['cache'] / rates['bare']:.2f}× it)", flush=True)
    return label, gbs, target_gbs, " GB/s"


# VmHWM, not ru_maxrss: that one keeps the parent's peak across fork and exec
_RSS_SCRIPT = """
import sys
sys.modules["torch"] = None  # as for a user without torch: it cannot be imported
import wds_cloud
total = sum(len(s["bin"]) for s in wds_cloud.WebDataset(sys.argv[1:], shardshuffle=False))
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(peak * 1024, total)
"""


def rss(tmp: str, shard_mb: int) -> None:
    """Peak RSS of a process iterating 1 and 8 local shards of ``shard_mb`` MB (100 KB
    samples) without torch: read-ahead does not pre-read local files, so it stays flat."""
    per_shard = shard_mb * 10
    shards = write_shards(tmp, f"rss{shard_mb}", 8 * per_shard, 8, big_members)
    peaks = {}
    for count in (1, 8):
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, *shards[:count]],
                             capture_output=True, text=True, check=False)
        if out.returncode:
            print(f"peak RSS: failed: {out.stderr.strip()[-300:]}", flush=True)
            return
        peaks[count] = int(out.stdout.split()[0]) / 1e6
    print(f"peak RSS (no torch): {peaks[1]:.1f} MB for 1 shard of {shard_mb} MB, "
          f"{peaks[8]:.1f} MB for 8 (target ≤ 50 MB, flat)", flush=True)


def memory(tmp: str, libs: dict[str, Factory], big_n: int) -> None:
    """Peak allocation on one shard and on a 4× larger one: flat means streaming."""
    small = write_shards(tmp, "mem1x", max(big_n // 6, 50), 1, big_members)
    large = write_shards(tmp, "mem4x", 4 * max(big_n // 6, 50), 1, big_members)
    for lib in ("wds_cloud", "webdataset"):
        try:
            one = peak_bytes(libs[lib], small) / 1e6
            four = peak_bytes(libs[lib], large) / 1e6
        except Exception as exc:
            print(f"peak memory ({lib}): failed: {exc!r}", flush=True)
            continue
        print(f"peak memory ({lib}): {one:.1f} MB for a shard, {four:.1f} MB for one 4× larger, "
              f"growth {four / one:.2f}× (target ≤ 1.5×: flat)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000, help="tiny samples in all")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    tiny_n = 6_000 if args.quick else args.samples
    big_n = 200 if args.quick else 3_000
    huge_n = 12 if args.quick else 120
    rounds = 1 if args.quick else args.rounds
    warnings.simplefilter("ignore")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench_core-") as tmp:
        t0 = time.perf_counter()
        tiny = write_shards(tmp, "tiny", tiny_n, 4, tiny_members)
        big = write_shards(tmp, "big", big_n, 3, big_members)
        huge = write_shards(tmp, "huge", huge_n, 3, huge_members)
        print(f"# {tiny_n} tiny samples (3 members) in 4 shards, {big_n} samples of 100 KB and "
              f"{huge_n} of 4 MB in 3 shards each, written in {time.perf_counter() - t0:.1f} s; "
              f"medians of {rounds} interleaved rounds", flush=True)
        warm(tiny + big + huge)
        for label, libs, urls, count, unit, target, scale, member in (
            ("raw samples/s (tiny members)", pipelines(False), tiny, touch, "samples/s", 15.0,
             1, 0),
            ("decoded samples/s (tiny, default decoder)", pipelines(True), tiny, touch,
             "samples/s", 5.0, 1, 0),
            ("raw MB/s (100 KB members)", pipelines(False), big, size, "MB/s", 5.0, 1e6,
             100_000),
            ("raw MB/s (4 MB members)", pipelines(False), huge, size, "MB/s", 7.0, 1e6, 4 << 20),
        ):
            results.append(compare(label, libs, urls, count, rounds, unit, target, scale, member))
        results.append(warm_cache(tmp, big, rounds, 6.8))
        memory(tmp, pipelines(False), big_n)
        rss(tmp, 8 if args.quick else 75)
    print("# summary")
    for label, value, target, unit in results:
        if value is None:
            print(f"#   {label}: not measured")
        else:
            verdict = "ok" if value >= target else "BELOW TARGET"
            print(f"#   {label}: {value:.2f}{unit} (target ≥ {target}{unit}) {verdict}")
    stats = wds_cloud.io_stats()  # what this process read from stores
    print(f"# GETs per shard: {stats['gets_per_shard']:.2f} ({stats['gets']} GETs for "
          f"{stats['shards']} shards opened at a store by this process)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
