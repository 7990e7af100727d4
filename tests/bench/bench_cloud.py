# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: the cloud openers against baselines measured in the same run, on local servers.

    python tests/bench/bench_cloud.py [--quick] [--only http,s3,gs,readahead]

1. ``http``: one big shard from nginx through our HTTP opener, against ``curl -s URL`` of the
   same object from the same nginx (target ≥ 0.9×).
2. ``s3``: one big shard from ``rclone serve s3`` (hashing with CRC32, so that its own MD5s do
   not dominate: ``LocalS3Server(etag_hash="crc32")``) through ``s3://``, read as the tar reader
   reads a stream (``read`` of its piece size), against ``curl --aws-sigv4`` of the same object
   from the same server (target ≥ 0.9×). Our CPU per GB is split between fsspec's event loop
   thread (the HTTP client: one per process, shared by all its streams) and the reading thread.
3. ``gs``: one big object from fake-gcs-server (in memory) through ``gs://``, read as the tar
   reader reads, against ``curl`` of the same JSON API media download (the URL gcsfs asks
   for; the emulator wants no credentials) from the same server (target ≥ 0.9×).
4. ``readahead``: 64 shards of 4 MB behind a proxy that delays each response's first byte by
   50 ms, read by ``WebDataset`` with read-ahead on and off, against the same proxy without
   latency (target ≥ 0.8×), with the limit that the first shard's 50 ms, which nothing can
   hide, sets in an epoch this short (no-latency time / (that time + 50 ms)). Then what the
   default (pre-reading ``WDS_READAHEAD_BYTES`` while the reader's own reads show that it
   pays: see ``wds_cloud.io.pace``) gives over only opening ahead (``WDS_READAHEAD_BYTES=0``),
   on 16 shards of 16 MiB (more than the kernel buffers ahead on a connection): on a link
   whose every connection is slow (50 ms to the first byte, then 50 MB/s each, as a cloud
   store's single stream), where pre-reading pays, and on the same proxy with no limit, where
   it would not; not with ``--quick`` (no target).

Each ratio is of medians of interleaved runs (baseline, ours, baseline, ours, ...; 7 by
default), after one untimed run of each; CPU is user + system seconds of this process (ours)
or of the child (curl). It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for stores and shardgen

# nothing may leave the machine: no cloud-metadata probes (stores.NO_METADATA_ENV)
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
# gcsfs's default gs class asks the emulator for its bucket type over gRPC and waits 60 s
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from stores.gcs import GcsServer
from stores.nginx import NginxServer
from stores.proxy import FaultProxy

import wds_cloud as wds
from wds_cloud.settings import Settings
from wds_cloud.tar import CHUNK_SIZE
from wds_cloud.testing.locals3 import LocalS3Server

MB = 10**6
GB = 10**9
_BUF = bytearray(4 * 2**20)


@dataclass(frozen=True)
class Timing:
    """Medians over the runs of one contender: wall seconds, CPU seconds, and the CPU seconds
    of fsspec's event loop thread (0 where it does not take part)."""

    seconds: float
    cpu: float
    loop_cpu: float = 0.0


def _cpu() -> float:
    """User + system seconds of this process and of its reaped children (curl)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _loop_cpu() -> float:
    """CPU seconds of fsspec's I/O thread so far (asked on that thread)."""
    from fsspec.asyn import get_loop

    answer: Future[float] = Future()
    get_loop().call_soon_threadsafe(lambda: answer.set_result(time.thread_time()))
    return answer.result(timeout=10)


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int, *,
                loop: bool = False) -> dict[str, Timing]:
    """Each of ``runs`` once untimed, then ``repeats`` rounds of each in turn; their medians.
    ``loop``: also time fsspec's event loop thread."""
    for run in runs.values():
        run()
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            loop_before = _loop_cpu() if loop else 0.0
            cpu_before, start = _cpu(), time.perf_counter()
            run()
            wall, cpu = time.perf_counter() - start, _cpu() - cpu_before
            samples[name].append((wall, cpu, _loop_cpu() - loop_before if loop else 0.0))
    return {name: Timing(*(statistics.median(s[i] for s in rows) for i in range(3)))
            for name, rows in samples.items()}


def drain(stream: Any) -> int:
    total = 0
    with contextlib.closing(stream):
        while n := stream.readinto(_BUF):
            total += n
    return total


def read_pieces(stream: Any, piece: int = CHUNK_SIZE) -> int:
    """Read ``stream`` to its end as the tar reader does: ``read`` of its piece size."""
    total = 0
    with contextlib.closing(stream):
        while data := stream.read(piece):
            total += len(data)
    return total


def report(name: str, ours: Timing, base: Timing, nbytes: int, base_name: str,
           target: float, *, cpu: bool = True) -> None:
    ratio = base.seconds / ours.seconds
    print(f"{name}: wds_cloud {nbytes / ours.seconds / MB:,.0f} MB/s, {base_name} "
          f"{nbytes / base.seconds / MB:,.0f} MB/s, ratio {ratio:.2f}× (target ≥ {target}×)",
          flush=True)
    if cpu:
        split = (f" (event loop {ours.loop_cpu * GB / nbytes:.2f}, reader "
                 f"{(ours.cpu - ours.loop_cpu) * GB / nbytes:.2f})" if ours.loop_cpu else "")
        print(f"    CPU per GB: wds_cloud {ours.cpu * GB / nbytes:.2f} s{split}, {base_name} "
              f"{base.cpu * GB / nbytes:.2f} s", flush=True)


def write_object(path: Path, size: int) -> None:
    """``size`` random bytes at ``path``, on disk before anything is timed (the kernel's
    write-back of a fresh file would otherwise run during the first runs)."""
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        os.fsync(f.fileno())


def _curl(*args: str) -> Callable[[], int]:
    return lambda: subprocess.run(["curl", "-sS", "--fail", "-o", "/dev/null", *args],
                                  check=True).returncode


def bench_http(root: Path, size: int, repeats: int) -> None:
    write_object(root / "big.bin", size)
    with NginxServer(root) as nginx:
        url = nginx.url_for("big.bin")
        times = interleaved({"curl": _curl(url), "ours": lambda: drain(wds.gopen(url))},
                            repeats, loop=True)
        report(f"http {size // MB} MB from nginx (median of {repeats})", times["ours"],
               times["curl"], size, "curl", 0.9)


def bench_s3(root: Path, size: int, repeats: int) -> None:
    (root / "bench").mkdir(exist_ok=True)
    write_object(root / "bench" / "big.bin", size)
    with LocalS3Server(root, key="bench", secret="bench-secret", etag_hash="crc32") as server:
        options = {"s3": server.storage_options}
        signed = _curl("--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "bench:bench-secret",
                       f"{server.endpoint_url}/bench/big.bin")
        ours = lambda: read_pieces(wds.gopen("s3://bench/big.bin",  # noqa: E731
                                             storage_options=options))
        times = interleaved({"curl": signed, "ours": ours}, repeats, loop=True)
    report(f"s3 {size // MB} MB from rclone --local-hashes crc32, read({CHUNK_SIZE >> 20} MiB) "
           f"(median of {repeats})", times["ours"], times["curl"], size, "curl --aws-sigv4", 0.9)


def bench_gs(size: int, repeats: int) -> None:
    with GcsServer() as server:
        store = server.new_store()
        store.put("big.bin", os.urandom(size))
        options = store.storage_options
        media = (f"{server.url}/download/storage/v1/b/{store.bucket}/o/big.bin?alt=media")
        ours = lambda: read_pieces(wds.gopen(store.url("big.bin"),  # noqa: E731
                                             storage_options=options))
        times = interleaved({"curl": _curl(media), "ours": ours}, repeats, loop=True)
    report(f"gs {size // MB} MB from fake-gcs-server, read({CHUNK_SIZE >> 20} MiB) "
           f"(median of {repeats})", times["ours"], times["curl"], size, "curl", 0.9)


def _shards(root: Path, count: int, size: int, prefix: str = "ra") -> list[str]:
    per_member = 2**20
    names = []
    for i in range(count):
        name = f"{prefix}-{i:04d}.tar"
        with wds.TarWriter(str(root / name)) as sink:
            for k in range(size // per_member):
                sink.write({"__key__": f"s{i:04d}-{k}", "bin": os.urandom(per_member)})
        names.append(name)
    return names


@contextlib.contextmanager
def _readahead(depth: int, nbytes: int | None = None) -> Iterator[None]:
    """``WDS_READAHEAD=depth`` (and ``WDS_READAHEAD_BYTES=nbytes`` if given) meanwhile."""
    wanted = {"WDS_READAHEAD": str(depth)}
    if nbytes is not None:
        wanted["WDS_READAHEAD_BYTES"] = str(nbytes)
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def bench_readahead(root: Path, count: int, repeats: int, depth: int) -> None:
    shard_size = 4 * 2**20
    names = _shards(root, count, shard_size)
    total = count * shard_size
    # more than a socket buffers ahead; with --quick's 4 (or 8) the two ways read alike here
    big_count, big_size = count // 4, 16 * 2**20
    big = _shards(root, big_count, big_size, prefix="big") if big_count >= 16 else []

    def epoch(urls: list[str]) -> int:
        dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        return sum(len(sample["bin"]) for sample in dataset)

    with NginxServer(root) as nginx, FaultProxy(nginx.url) as proxy:

        def run(latency: float, readahead: int, nbytes: int | None = None,
                conn_rate: int = 0, which: list[str] = names) -> int:
            proxy.configure(latency=latency, conn_rate=conn_rate)
            with _readahead(readahead, nbytes):
                return epoch([f"{proxy.url}/{name}" for name in which])

        start = time.perf_counter()
        run(0.05, 0)  # once: ~50 ms a shard, only to show what read-ahead saves
        slow = time.perf_counter() - start
        times = interleaved({"fast": lambda: run(0.0, depth), "ahead": lambda: run(0.05, depth)},
                            repeats)
        label = f"{count} shards of 4 MB, 50 ms first-byte latency"
        print(f"readahead off, {label}: {total / slow / MB:,.0f} MB/s, ratio "
              f"{times['fast'].seconds / slow:.2f}× of the no-latency run", flush=True)
        report(f"readahead {depth}, {label} (median of {repeats})", times["ahead"],
               times["fast"], total, "no latency", 0.8, cpu=False)
        fast = times["fast"].seconds
        limit, ratio = fast / (fast + 0.05), fast / times["ahead"].seconds
        print(f"    limit: the first shard's 50 ms cannot be hidden, so an epoch of "
              f"{fast:.2f} s without latency reaches at most {limit:.2f}×; wds_cloud at "
              f"{ratio / limit:.2f}× of it", flush=True)
        for link, latency, conn_rate in (("50 ms, then 50 MB/s per connection", 0.05, 50 * MB),
                                         ("no limit", 0.0, 0)) if big else ():
            both = interleaved({"open": partial(run, latency, depth, 0, conn_rate, big),
                                "pre": partial(run, latency, depth, None, conn_rate, big)},
                               repeats)
            pre, opened, nbytes = both["pre"], both["open"], big_count * big_size
            print(f"default (pre-reading while it pays) vs opening ahead only, {big_count} "
                  f"shards of 16 MiB, {link} "
                  f"(median of {repeats}): {nbytes / pre.seconds / MB:,.0f} vs "
                  f"{nbytes / opened.seconds / MB:,.0f} MB/s, ratio "
                  f"{opened.seconds / pre.seconds:.2f}×; CPU per GB {pre.cpu * GB / nbytes:.2f} "
                  f"vs {opened.cpu * GB / nbytes:.2f} s (no target)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller objects, fewer repeats")
    parser.add_argument("--only", default="http,s3,gs,readahead")
    parser.add_argument("--depth", type=int, default=Settings().readahead,
                        help="shards read ahead (default: the WDS_READAHEAD default)")
    args = parser.parse_args()
    size = (64 if args.quick else 512) * 2**20
    repeats = 3 if args.quick else 7
    chosen = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="wds-bench-cloud-") as tmp:
        for name, run in (("http", lambda d: bench_http(d, size, repeats)),
                          ("s3", lambda d: bench_s3(d, size, repeats)),
                          ("gs", lambda d: bench_gs(size, repeats)),
                          ("readahead", lambda d: bench_readahead(d, 16 if args.quick else 64,
                                                                  repeats, args.depth))):
            if name in chosen:
                directory = Path(tmp) / name
                directory.mkdir()
                run(directory)
    stats = wds.io_stats()  # what this process read from stores
    print(f"# GETs per shard: {stats['gets_per_shard']:.2f} ({stats['gets']} GETs for "
          f"{stats['shards']} shards opened at a store by this process)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
