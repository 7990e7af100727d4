# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: the cloud openers against baselines measured in the same run, on local servers.

    python tests/bench/bench_cloud.py [--quick] [--only http,s3,readahead]

1. ``http``: one big shard from nginx through our HTTP opener, against ``curl -s URL > /dev/null``
   from the same nginx (target ≥ 0.9×).
2. ``s3``: the same object from ``rclone serve s3`` through ``s3://``, against the best plain
   s3fs read of it (``cat_file``, and ``open().read()`` in several block sizes; target ≥ 0.9×).
3. ``readahead``: 64 shards of 4 MB behind a proxy that delays each response's first byte by
   50 ms, read by ``WebDataset`` with read-ahead on and off, against the same proxy without
   latency (target ≥ 0.8×).

Each measurement is the best of a few runs. It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for stores and shardgen

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # nothing may leave the machine
os.environ.setdefault("NO_GCE_CHECK", "true")

from stores.nginx import NginxServer
from stores.proxy import FaultProxy

import wds_cloud as wds
from wds_cloud.settings import Settings
from wds_cloud.testing.locals3 import LocalS3Server

MB = 10**6
_BUF = bytearray(4 * 2**20)


def best(run: Callable[[], int], repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``run`` (which returns the bytes it read)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def drain(stream: Any) -> int:
    total = 0
    with contextlib.closing(stream):
        while n := stream.readinto(_BUF):
            total += n
    return total


def report(name: str, ours: float, base: float, nbytes: int, base_name: str,
           target: float) -> None:
    ratio = base / ours
    print(f"{name}: wds_cloud {nbytes / ours / MB:,.0f} MB/s, {base_name} "
          f"{nbytes / base / MB:,.0f} MB/s, ratio {ratio:.2f}× (target ≥ {target}×)",
          flush=True)


def bench_http(root: Path, size: int, repeats: int) -> None:
    blob = root / "big.bin"
    blob.write_bytes(os.urandom(size))
    with NginxServer(root) as nginx:
        url = nginx.url_for("big.bin")
        curl = best(lambda: subprocess.run(["curl", "-s", "-o", "/dev/null", url],
                                           check=True).returncode, repeats)
        ours = best(lambda: drain(wds.gopen(url)), repeats)
        report(f"http {size // MB} MB from nginx", ours, curl, size, "curl", 0.9)


def bench_s3(root: Path, size: int, repeats: int) -> None:
    bucket = root / "bench"
    bucket.mkdir(exist_ok=True)
    (bucket / "big.bin").write_bytes(os.urandom(size))
    # rclone hashes (MD5) every read that starts at byte 0, which a single streaming GET always
    # does and block reads do once: measured as served by default, and without that hashing
    for label, extra in (("", ()), (", rclone --local-hashes crc32", ("--local-hashes", "crc32"))):
        _bench_s3_server(root, size, repeats, label, extra)


def _bench_s3_server(root: Path, size: int, repeats: int, label: str,
                     extra: tuple[str, ...]) -> None:
    import fsspec

    with LocalS3Server(root, key="bench", secret="bench-secret", extra_args=extra) as server:
        options = server.storage_options
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        plain: dict[str, Callable[[], int]] = {
            "cat_file": lambda: len(fs.cat_file("bench/big.bin")),
        }
        for block in (5 * 2**20, 32 * 2**20, 128 * 2**20):
            def read_blocks(block: int = block) -> int:
                with fs.open("bench/big.bin", block_size=block, cache_type="none") as f:
                    return drain(f)
            plain[f"open(block_size={block >> 20} MiB)"] = read_blocks
        times = {name: best(run, repeats) for name, run in plain.items()}
        best_name = min(times, key=times.__getitem__)
        stream = lambda: drain(wds.gopen("s3://bench/big.bin",  # noqa: E731
                                         storage_options={"s3": options}))
        ours = best(stream, repeats)
        report(f"s3 {size // MB} MB from rclone{label}", ours, times[best_name], size,
               f"best plain s3fs ({best_name})", 0.9)


def _shards(root: Path, count: int, size: int) -> list[str]:
    per_member = 2**20
    names = []
    for i in range(count):
        name = f"ra-{i:04d}.tar"
        with wds.TarWriter(str(root / name)) as sink:
            for k in range(size // per_member):
                sink.write({"__key__": f"s{i:04d}-{k}", "bin": os.urandom(per_member)})
        names.append(name)
    return names


@contextlib.contextmanager
def _readahead(depth: int) -> Iterator[None]:
    before = os.environ.get("WDS_READAHEAD")
    os.environ["WDS_READAHEAD"] = str(depth)
    try:
        yield
    finally:
        if before is None:
            del os.environ["WDS_READAHEAD"]
        else:
            os.environ["WDS_READAHEAD"] = before


def bench_readahead(root: Path, count: int, repeats: int, depth: int) -> None:
    shard_size = 4 * 2**20
    names = _shards(root, count, shard_size)
    total = count * shard_size

    def epoch(urls: list[str]) -> int:
        dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        return sum(len(sample["bin"]) for sample in dataset)

    with NginxServer(root) as nginx, FaultProxy(nginx.url) as proxy:
        urls = [f"{proxy.url}/{name}" for name in names]

        def timed(latency: float, readahead: int) -> float:
            proxy.configure(latency=latency)
            with _readahead(readahead):
                start = time.perf_counter()
                epoch(urls)
                return time.perf_counter() - start

        slow = timed(0.05, 0)
        # interleaved, so that drift in the machine's speed hits both alike; medians
        fast, ahead = [], []
        for _ in range(repeats):
            fast.append(timed(0.0, depth))
            ahead.append(timed(0.05, depth))
    fast_s, ahead_s = statistics.median(fast), statistics.median(ahead)
    label = f"{count} shards of 4 MB, 50 ms first-byte latency"
    print(f"readahead off, {label}: {total / slow / MB:,.0f} MB/s, ratio {fast_s / slow:.2f}× "
          "of the no-latency run", flush=True)
    report(f"readahead {depth}, {label} (median of {repeats})", ahead_s, fast_s, total,
           "no latency", 0.8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller objects, fewer repeats")
    parser.add_argument("--only", default="http,s3,readahead")
    parser.add_argument("--depth", type=int, default=Settings().readahead,
                        help="shards read ahead (default: the WDS_READAHEAD default)")
    args = parser.parse_args()
    size = (64 if args.quick else 256) * 2**20
    repeats = 2 if args.quick else 3
    chosen = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="wds-bench-cloud-") as tmp:
        for name, run in (("http", lambda d: bench_http(d, size, repeats)),
                          ("s3", lambda d: bench_s3(d, size, repeats)),
                          ("readahead", lambda d: bench_readahead(d, 16 if args.quick else 64,
                                                                  repeats + 2, args.depth))):
            if name in chosen:
                directory = Path(tmp) / name
                directory.mkdir()
                run(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
