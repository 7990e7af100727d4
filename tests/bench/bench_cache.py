# ruff: noqa: RUF001, RUF002  (the report prints the multiplication sign on purpose)
"""Benchmark: reading a dataset through the shard cache, against baselines measured in the same run.

    python tests/bench/bench_cache.py [--quick] [--shards N] [--shard-mib M] [--repeats R]
                                      [--profile]

nginx serves N tar shards (full: 32 × 16 MiB; ``--quick``: 8 × 4 MiB) of 1 MiB samples; each
epoch reads every sample with ``wds.WebDataset(urls, shardshuffle=False)`` (read-ahead at its
default) and counts the bytes:

(a) uncached streaming over HTTP from nginx (loopback: the CPU, not the link, is the limit);
(b) the first epoch through an empty cache (``cache_dir=`` a fresh directory for every run);
(c) a warm epoch through a cache that holds every shard (all hits);
(d) the same files read from local disk (nginx's root);
(w) no reading at all: the same number of bytes written to new files in the caches' directory,
    their blocks allocated first, then 1 MiB ``os.pwrite`` at a time, in one thread (as a fill
    writes): what writing every byte costs here, the part of (b) that no design of the cache
    can avoid;
(r), (t): no pipeline at all: each shard fetched from nginx with one ``http.client`` GET and
    read 1 MiB at a time; (t) also writes each piece to a new file as (w) does and adds it to a
    CRC-32, in the same thread. (t)/(r) is what writing every byte costs a bare loop here;
(v), (u): no Python at all: one ``curl`` fetching every shard over one connection, to
    ``/dev/null`` (v) or each to a new file (u): what writing every byte costs a native
    downloader here (curl writes 16 KiB at a time; the time and CPU are curl's);
(as), (bs): (a) and (b) through a link shaped to 1 Gbit/s (125 MB/s) shared by all
    connections: the tests' fault proxy (tests/stores/faultproxy.py, ``rate``) in front of
    nginx, as a desktop user's download would be.

Printed, each the median of several interleaved repetitions (a, b, c, d, w, r, t, v, u, as,
bs, then backwards: bs, as, u, ..., a, and so on), so that drift in the machine's speed hits
all alike and no mode always runs right after the same one, with its target: (b)/(a),
the first epoch through the cache against uncached streaming (≥ 0.9×), beside (t)/(r), the
same cost for a bare loop, and (u)/(v) for curl; (c)/(d), a warm epoch against local disk
(≥ 0.9×); (bs)/(as), the first epoch on the shaped link (≥ 0.97×); and the CPU seconds per GB
of this process (all threads, (b)'s writes included) in (b) against (a) (≤ 1.3×), beside
(a)+(w): reading and writing the same bytes apart, about the least a cache that writes every
byte can take here, and (t) against (r).

The page cache cannot be dropped here: the shards served by nginx (a, b, d) and the cached
copies (c) are in the page cache, so (c) and (d) compare the same kind of read. Writing new
files takes pages the kernel has to find: on a virtual machine whose free memory goes back to
its host, that costs far more (the first touch of each page) than on a server, which (w) shows.
An epoch is timed until its last sample; the cache's downloads of the epoch are waited for,
untimed, before the next run (they are done by then: the reading threads write them).

``--profile`` runs one more (b) epoch under cProfile and prints where the consuming thread
spends its time, its CPU time against the whole process's (the rest is background threads:
read-ahead, which also writes what it pre-reads, and fsspec's I/O loop), and when the last
entry was published.

It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for stores

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # nothing may leave the machine
os.environ.setdefault("NO_GCE_CHECK", "true")

from stores.nginx import NginxServer
from stores.proxy import FaultProxy

import wds_cloud as wds
from wds_cloud.cache import wait_downloads
from wds_cloud.cache.layout import crc32, preallocate

MB = 10**6
MEMBER = 2**20
LINK = 125 * MB  # bytes per second: 1 Gbit/s, shared by all connections through the proxy
# the order of each interleaved repetition
MODES = ("a", "b", "c", "d", "w", "r", "t", "v", "u", "as", "bs")


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


def write_files(where: Path, count: int, size: int) -> int:
    """Write ``count`` new files of ``size`` bytes under ``where`` as a fill does (1 MiB
    ``os.pwrite`` at a time, in this thread); the bytes written."""
    where.mkdir()
    piece = memoryview(os.urandom(MEMBER))
    for i in range(count):
        fd = os.open(where / f"w-{i:04d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            preallocate(fd, size)  # as a fill does
            for at in range(0, size, MEMBER):
                os.pwrite(fd, piece[: size - at], at)
        finally:
            os.close(fd)
    return count * size


def bare_loop(urls: list[str], where: Path | None = None) -> int:
    """(r): GET each URL with ``http.client`` and read it 1 MiB at a time, nothing parsed; (t),
    with ``where``: each piece also written to a new file there (blocks allocated first, then
    ``os.pwrite``) and added to a CRC-32, as a fill does. The bytes read."""
    checksum = crc32()
    if where is not None:
        where.mkdir()
    total = 0
    for i, url in enumerate(urls):
        parts = urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port)
        try:
            connection.request("GET", parts.path)
            response = connection.getresponse()
            size = int(response.getheader("Content-Length") or 0)
            fd = (-1 if where is None else
                  os.open(where / f"t-{i:04d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            try:
                if fd >= 0:
                    preallocate(fd, size)
                at, crc = 0, 0
                while piece := response.read(MEMBER):
                    if fd >= 0:
                        os.pwrite(fd, piece, at)
                        crc = checksum(piece, crc)
                    at += len(piece)
            finally:
                if fd >= 0:
                    os.close(fd)
        finally:
            connection.close()
        total += at
    return total


def curl_all(urls: list[str], where: Path | None = None) -> int:
    """(v): one ``curl`` GETs every URL over one connection into ``/dev/null``; (u), with
    ``where``: each into a new file there. The bytes it got."""
    outputs = ["/dev/null"] * len(urls) if where is None else [
        str(where / f"u-{i:04d}") for i in range(len(urls))]
    if where is not None:
        where.mkdir()
    args = [arg for out, url in zip(outputs, urls, strict=True) for arg in ("-o", out, url)]
    done = subprocess.run(["curl", "-sS", "--fail", "-w", "%{size_download}\\n", *args],
                          check=True, capture_output=True, text=True)
    return sum(int(line) for line in done.stdout.split())


def fills_done(timeout: float = 120.0) -> None:
    """Wait for the cache's downloads of this process to publish."""
    if not wait_downloads(timeout):
        raise RuntimeError("the cache's downloads did not finish")


def cpu_seconds() -> float:
    """CPU time (user + system) of this process so far, all threads, and of its children that
    ended (curl)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


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
    with NginxServer(served) as nginx, FaultProxy(nginx.url, rate=LINK) as proxy:
        remote = [nginx.url_for(name) for name in names]
        shaped = [f"{proxy.url}/{name}" for name in names]
        local = [str(served / name) for name in names]
        warm = str(scratch / "warm")
        epoch(remote, warm)  # fills the warm cache (and puts every file in the page cache)
        fills_done()
        epoch(local)
        epoch(shaped)  # the proxy's connections to nginx are open
        fresh = iter(str(scratch / f"fresh-{i}") for i in range(5 * repeats))
        served_bytes = sum((served / name).stat().st_size for name in names)  # (r), (t) read
        runs: dict[str, Callable[[], int]] = {
            "a": lambda: epoch(remote), "b": lambda: epoch(remote, next(fresh)),
            "c": lambda: epoch(remote, warm), "d": lambda: epoch(local),
            "w": lambda: write_files(Path(next(fresh)), count, size),
            "r": lambda: bare_loop(remote), "t": lambda: bare_loop(remote, Path(next(fresh))),
            "v": lambda: curl_all(remote), "u": lambda: curl_all(remote, Path(next(fresh))),
            "as": lambda: epoch(shaped), "bs": lambda: epoch(shaped, next(fresh)),
        }
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
        for repetition in range(repeats):
            # forwards, then backwards: no mode always follows the same one (reading right
            # after another run's writes and deletions is slower here: (c) by ~5%)
            for mode in MODES if repetition % 2 == 0 else MODES[::-1]:
                expect = served_bytes if mode in ("r", "t", "v", "u") else total
                times[mode].append(timed(runs[mode], expect, cpu[mode]))
                for made in scratch.glob("fresh-*"):
                    shutil.rmtree(made)
        print_results(nginx, count, size, repeats, times, cpu, total)
        if profile:
            profile_first_epoch(remote, scratch, total)


def print_results(nginx: NginxServer, count: int, size: int, repeats: int,
                  times: dict[str, list[float]], cpu: dict[str, list[float]],
                  total: int) -> None:
    requests = sum(1 for e in nginx.access_log() if e.method == "GET" and "/cache-bench-" in e.uri)
    # the warm fill, the shaped warm-up, then each (a), (b), (r), (t), (v), (u), (as) and (bs)
    expected = count * (2 + 8 * repeats)
    gets = (f"nginx served {requests} shard GETs, one per shard for the warm fill, the shaped "
            "warm-up and each (a), (b), (r), (t), (v), (u), (as) and (bs) run: the warm epochs "
            "made none"
            if requests == expected else f"nginx served {requests} shard GETs, {expected} "
            "expected")
    rate = {mode: total / statistics.median(t) / MB for mode, t in times.items()}
    print(f"{count} shards of {size / 2**20:g} MiB from nginx, {repeats} interleaved "
          f"repetitions; (a) uncached streaming {rate['a']:,.0f} MB/s, (d) local disk "
          f"{rate['d']:,.0f} MB/s (files in page cache), (w) writing as many bytes to new files "
          f"{rate['w']:,.0f} MB/s, (as) uncached on the shaped link {rate['as']:,.0f} MB/s "
          f"(link {LINK / MB:,.0f} MB/s); {gets}", flush=True)
    report("(b)/(a) first epoch through the cache vs uncached streaming", times["b"],
           times["a"], total, "uncached", 0.9)
    report("(c)/(d) warm epoch (all hits) vs local disk, both in page cache", times["c"],
           times["d"], total, "local disk", 0.9)
    report("(bs)/(as) first epoch through the cache vs uncached, on a shaped 1 Gbit/s link",
           times["bs"], times["as"], total, "uncached", 0.97)
    bare, teed = statistics.median(times["r"]), statistics.median(times["t"])
    print(f"(t)/(r) a bare loop of GETs read 1 MiB at a time, writing every piece to a new file "
          f"vs not: {total / teed / MB:,.0f} MB/s vs {total / bare / MB:,.0f} MB/s, ratio "
          f"{bare / teed:.2f}× (no target: what writing every byte costs in the reading thread "
          f"on this machine; runs {_spread(times['t'], total)} vs {_spread(times['r'], total)} "
          f"MB/s; rates count the payload, as above)", flush=True)
    saved, dropped = statistics.median(times["u"]), statistics.median(times["v"])
    print(f"(u)/(v) curl saving each shard to a new file vs to /dev/null: "
          f"{total / saved / MB:,.0f} MB/s vs {total / dropped / MB:,.0f} MB/s, ratio "
          f"{dropped / saved:.2f}× (no target: what writing every byte costs a native "
          f"downloader here; runs {_spread(times['u'], total)} vs {_spread(times['v'], total)} "
          "MB/s)", flush=True)
    gb = total / 1e9
    per_gb = {mode: statistics.median(v) / gb for mode, v in cpu.items()}
    floor = per_gb["a"] + per_gb["w"]
    print(f"(b)/(a) CPU seconds per GB, the first epoch through the cache vs uncached: "
          f"{per_gb['b']:.2f} vs {per_gb['a']:.2f}, ratio {per_gb['b'] / per_gb['a']:.2f}× "
          f"(target ≤ 1.3×; median of {repeats}); writing alone (w) takes {per_gb['w']:.2f} "
          f"s/GB here, so reading and writing apart, (a)+(w), take {floor:.2f} s/GB, "
          f"{floor / per_gb['a']:.2f}× (how warm the pages a write gets are varies); the bare "
          f"loop: {per_gb['t']:.2f} vs {per_gb['r']:.2f}, {per_gb['t'] / per_gb['r']:.2f}×; "
          f"curl: {per_gb['u']:.2f} vs {per_gb['v']:.2f}, {per_gb['u'] / per_gb['v']:.2f}×",
          flush=True)
    print("CPU seconds of this process per GB (median [runs]; all threads, the cache's "
          "writes included; curl's for (u) and (v)): " + ", ".join(
              f"({k}) {per_gb[k]:.2f} [{'/'.join(f'{c / gb:.2f}' for c in v)}]"
              for k, v in cpu.items()), flush=True)


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
    stats = wds.io_stats()  # what this process read from stores
    print(f"# GETs per shard: {stats['gets_per_shard']:.2f} ({stats['gets']} GETs for "
          f"{stats['shards']} shards opened at a store by this process)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
