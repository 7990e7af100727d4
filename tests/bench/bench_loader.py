# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: what DataLoader workers cost. ``WebLoader`` against torch's ``DataLoader`` over
webdataset 1.0.2's ``WebDataset`` on the same shards, and workers against one process.

    python tests/bench/bench_loader.py [--samples N] [--rounds R] [--quick]

Writes local tar shards of tiny samples (3 members of about 100-300 bytes: where the cost per
item shows most), warms the page cache, then prints one line per measurement, each rate the
median of R interleaved rounds (the order rotating), the first item of each pass excluded
(starting the workers):

* single samples, 2 workers: ``WebLoader(WebDataset(urls), batch_size=None, num_workers=2)``
  (resumable: each worker's state travels with its items) against
  ``DataLoader(webdataset.WebDataset(urls), batch_size=None, num_workers=2)``; target ≥ 0.9×;
* batches in the workers: ``WebDataset(urls).map(sum of the bytes).batched(64)`` through a
  ``WebLoader`` with 2 workers against the same dataset iterated in this process; target ≥ 1.6×
  (on 2 cores; it needs the cores to be free: see the load printed; with the kernel's
  ``sched_autogroup`` on, as printed, the processes of one session share one CPU share, so
  while others' sessions keep the cores busy, workers add no CPU and the ratio stays near
  1× whatever they cost);
* a WebLoader saved mid-epoch and restored (shuffled, 2 workers): checked equal to the
  uninterrupted run, with the time ``state_dict()`` took and the size of the state.

Workers hand their items to the main process: small CPU tensors in a batch (numbers
collated) travel inside its pickle (``wds_cloud.shipping.INLINE_TENSOR_BYTES``), not each
through shared memory and a file descriptor of its own as torch sends them (about 2 ms each).

It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import webdataset

import wds_cloud


def write_shards(directory: str, nsamples: int, nshards: int) -> list[str]:
    rng = random.Random(nsamples)
    urls = []
    per_shard = -(-nsamples // nshards)
    for shard in range(nshards):
        path = os.path.join(directory, f"tiny-{shard:04d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(shard * per_shard, min(nsamples, (shard + 1) * per_shard)):
                text = "".join(rng.choices("abcdefghij klmnopqrstuvwxyz",
                                           k=rng.randint(100, 300)))
                meta = json.dumps({"id": i, "caption": text[: rng.randint(60, 250)]})
                for name, data in ((f"{i:08d}.txt", text.encode()),
                                   (f"{i:08d}.cls", str(i % 1000).encode()),
                                   (f"{i:08d}.json", meta.encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), 1_700_000_000
                    tf.addfile(info, io.BytesIO(data))
        urls.append(path)
    return urls


def sum_bytes(sample: dict[str, Any]) -> int:
    """A little work per sample: add up the bytes of its members."""
    return sum(sum(v) for k, v in sample.items() if isinstance(v, bytes))


def rate(make: Callable[[], Iterable[Any]], units: Callable[[Any], int]) -> float:
    """Units/s of one pass, from its first item (the workers' start is not measured)."""
    it = iter(make())
    next(it)
    start, n = time.perf_counter(), 0
    for item in it:
        n += units(item)
    return n / (time.perf_counter() - start)


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(runs[name]())
    return rates


def autogroup() -> str:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return "on" if f.read().strip() == "1" else "off"
    except OSError:
        return "unknown"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(label: str, rates: dict[str, list[float]], ours: str, base: str, target: float,
           unit: str) -> tuple[str, float, float]:
    a, b = statistics.median(rates[ours]), statistics.median(rates[base])
    runs = "; ".join(f"{name} {'/'.join(f'{r:,.0f}' for r in values)}"
                     for name, values in rates.items())
    print(f"{label}: {ours} {a:,.0f} {unit}, {base} {b:,.0f} {unit}, ratio {a / b:.2f}× "
          f"(target ≥ {target}×) [{runs}] ({load()})", flush=True)
    return label, a / b, target


def single_samples(urls: list[str], rounds: int) -> tuple[str, float, float]:
    from torch.utils.data import DataLoader

    def ours() -> Iterable[Any]:
        dataset = wds_cloud.WebDataset(urls, shardshuffle=False)
        return wds_cloud.WebLoader(dataset, batch_size=None, num_workers=2)

    def theirs() -> Iterable[Any]:
        dataset = webdataset.WebDataset(urls, shardshuffle=False)
        return DataLoader(dataset, batch_size=None, num_workers=2)

    def one(_: Any) -> int:
        return 1

    rates = interleaved({"WebLoader": lambda: rate(ours, one),
                         "webdataset+DataLoader": lambda: rate(theirs, one)}, rounds)
    return report("single samples, 2 workers (batch_size=None)", rates, "WebLoader",
                  "webdataset+DataLoader", 0.9, "samples/s")


def batched_dataset(urls: list[str]) -> Any:
    return wds_cloud.WebDataset(urls, shardshuffle=False).map(sum_bytes).batched(64)


def batches_in_workers(urls: list[str], rounds: int) -> tuple[str, float, float]:
    def workers(**kw: Any) -> Callable[[], Iterable[Any]]:
        return lambda: wds_cloud.WebLoader(batched_dataset(urls), batch_size=None,
                                           num_workers=2, **kw)

    def size(batch: Any) -> int:
        return len(batch)

    rates = interleaved({"2 workers": lambda: rate(workers(), size),
                         "one process": lambda: rate(lambda: batched_dataset(urls), size),
                         "2 workers, prefetch_factor=2": lambda: rate(workers(
                             prefetch_factor=2), size)},
                        rounds)
    result = report("batches of 64 in the workers (map: sum of the bytes)", rates, "2 workers",
                    "one process", 1.6, "samples/s")
    # a WebLoader raises its workers' items in flight for small items; torch's 2 leaves a
    # worker waiting for its next index while the main process takes the other's items
    held = statistics.median(rates["2 workers, prefetch_factor=2"])
    print(f"  the same held at torch's prefetch_factor=2: {held:,.0f} samples/s, "
          f"{held / statistics.median(rates['one process']):.2f}× one process", flush=True)
    return result


def resumed_exactly(urls: list[str]) -> None:
    """A WebLoader saved after some items and restored gives the rest of the uninterrupted run
    (a check printed with the numbers: speed must not cost exactness)."""
    def loader() -> Any:
        dataset = wds_cloud.WebDataset(urls, shardshuffle=True, seed=3).shuffle(100)
        return wds_cloud.WebLoader(dataset, batch_size=None, num_workers=2)

    whole = [s["__key__"] for s in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(len(whole) // 3)]
    start = time.perf_counter()
    state = first.state_dict()
    took = time.perf_counter() - start
    del it
    second = loader()
    second.load_state_dict(state)
    rest = [s["__key__"] for s in second]
    ok = head + rest == whole
    print(f"resume mid-epoch through WebLoader (2 workers, shuffle(100)): "
          f"{'exact' if ok else 'NOT EXACT'} ({len(head)} + {len(rest)} of {len(whole)}); "
          f"state_dict() took {took * 1e3:.2f} ms, {len(json.dumps(state))} bytes as JSON",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000, help="tiny samples in all")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds = 20_000, 1
    warnings.simplefilter("ignore")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_loader-") as tmp:
        urls = write_shards(tmp, args.samples, 8)
        for url in urls:
            with open(url, "rb") as f:
                while f.read(1 << 22):
                    pass
        print(f"# {args.samples:,} tiny samples (3 members) in {len(urls)} local shards; "
              f"medians of {args.rounds} interleaved rounds; {os.cpu_count()} cores, "
              f"sched_autogroup {autogroup()}; {load()}", flush=True)
        results.append(single_samples(urls, args.rounds))
        results.append(batches_in_workers(urls, args.rounds))
        resumed_exactly(urls[:2] if args.quick else urls[:4])
    print("# summary")
    for label, value, target in results:
        print(f"#   {label}: {value:.2f}× (target ≥ {target}×) "
              f"{'ok' if value >= target else 'BELOW TARGET'}")
    stats = wds_cloud.io_stats()
    print(f"# GETs per shard: {stats['gets_per_shard']:.2f} ({stats['gets']} GETs for "
          f"{stats['shards']} shards opened at a store in this process: local shards need "
          "none)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
