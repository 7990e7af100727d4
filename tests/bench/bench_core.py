# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: wds_cloud's tar reading against webdataset 1.0.2, measured in the same run.

    python tests/bench/bench_core.py [--samples N] [--quick]

Writes shards to a temporary directory (tiny members: 3 per sample of about 100-300 bytes; and
100 KB members), warms the page cache, then prints one line per measurement::

    name: wds_cloud X/s, webdataset Y/s, ratio Z× (target ≥ T×)

and a summary. It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import random
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


def rate(factory: Factory, urls: list[str], measure: Callable[[Any], int], repeat: int) -> float:
    """Best units/s over ``repeat`` passes (units counted by ``measure(sample)``)."""
    best = 0.0
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        units = sum(measure(sample) for sample in factory(urls))
        best = max(best, units / (time.perf_counter() - start))
    return best


def touch(sample: dict[str, Any]) -> int:
    """Count a sample, looking at every value (so lazy decoding would be paid for)."""
    return 1 if all(v is not touch for v in sample.values()) else 0


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


def report(name: str, ours: float, theirs: float, unit: str, target: float) -> float:
    ratio = ours / theirs if theirs else float("inf")
    print(f"{name}: wds_cloud {ours:,.0f} {unit}, webdataset {theirs:,.0f} {unit}, "
          f"ratio {ratio:.2f}× (target ≥ {target}×)", flush=True)
    return ratio


def measure(label: str, libs: dict[str, Factory], urls: list[str], count: Callable[[Any], int],
            repeat: int, unit: str, target: float, scale: float = 1.0) -> float | None:
    """One report line; None (and a line saying why) when it cannot be measured."""
    try:
        for factory in libs.values():  # warm-up: imports, first-use caches
            for _ in zip(range(50), factory(urls[:1]), strict=False):
                pass
        ours = rate(libs["wds_cloud"], urls, count, repeat) / scale
        theirs = rate(libs["webdataset"], urls, count, repeat) / scale
    except (ImportError, AttributeError) as exc:
        print(f"{label}: skipped: not available ({exc})", flush=True)
        return None
    except Exception as exc:  # a report, not a test: say what failed and go on
        print(f"{label}: failed: {exc!r}", flush=True)
        return None
    return report(label, ours, theirs, unit, target)


def size(sample: dict[str, Any]) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000, help="tiny samples in all")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    tiny_n = 6_000 if args.quick else args.samples
    big_n = 200 if args.quick else 3_000
    repeat = 1 if args.quick else 2
    warnings.simplefilter("ignore")
    results: list[tuple[str, float | None, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench_core-") as tmp:
        t0 = time.perf_counter()
        tiny = write_shards(tmp, "tiny", tiny_n, 4, tiny_members)
        big = write_shards(tmp, "big", big_n, 3, big_members)
        print(f"# {tiny_n} tiny samples (3 members) in 4 shards, {big_n} samples of 100 KB in "
              f"3 shards, written in {time.perf_counter() - t0:.1f} s", flush=True)
        warm(tiny + big)
        for label, libs, urls, count, unit, target, scale in (
            ("raw samples/s (tiny members)", pipelines(False), tiny, touch, "samples/s", 8.0, 1),
            ("decoded samples/s (tiny, default decoder)", pipelines(True), tiny, touch,
             "samples/s", 5.0, 1),
            ("raw MB/s (100 KB members)", pipelines(False), big, size, "MB/s", 1.5, 1e6),
        ):
            ratio = measure(label, libs, urls, count, repeat, unit, target, scale)
            results.append((label, ratio, target))
        memory(tmp, pipelines(False), big_n)
    print("# summary")
    for label, ratio, target in results:
        if ratio is None:
            print(f"#   {label}: not measured")
        else:
            verdict = "ok" if ratio >= target else "BELOW TARGET"
            print(f"#   {label}: {ratio:.2f}× (target ≥ {target}×) {verdict}")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
