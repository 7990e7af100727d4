# ruff: noqa: RUF001  (the report prints the multiplication sign on purpose)
"""Benchmark: wds_cloud against LitData and Mosaic streaming on the same samples, in one run.

    python tests/bench/bench_peers.py [--quick] [--rounds R] [--workloads images,tokens]

Two workloads, each written in the three formats (webdataset tar shards; LitData ``optimize``
chunks; Mosaic ``MDSWriter`` shards, all about 16 MB, ``bytes`` columns) into the directory a
local S3 server (``rclone serve s3``, :class:`wds_cloud.testing.LocalS3Server`) serves:

- ``images``: 7,680 samples (48 shards; ``--quick``: 6) of a ~100 KB ``.jpg`` + ``.json`` +
  ``.cls``;
- ``tokens``: 80,000 samples (2 shards of 40,000; ``--quick``: 1 of 10,000) of a 4 KB
  ``.tokens`` (raw bytes) + ~100 B ``.json``.

Each round runs every loader in a fresh process of its own (the peers in their own venv,
``.ci/.tools/peers-venv``, made with ``python -m venv`` + pip the first time and reused; never a
dependency of the package), which prints JSON: a cold epoch from S3 (its cache emptied first),
the time to its first sample (from building the dataset; the package is imported before), then
warm epochs from its local cache (the last one counts); raw samples, iterated in one process,
each value's length taken. Rounds take the loaders in turn, the order rotating; the lines give
medians, the ratios are ours over the best peer's, and the machine's load is printed beside.
Each line names the type of the values the loader hands out: wds_cloud and Mosaic hand out
``bytes`` (one copy each), LitData 0.2.76 ``memoryview`` slices of its memory-mapped chunks
(no copy, and pages that stay mapped while a value is alive); ``wds_views`` is wds_cloud
with ``zero_copy=True`` (views too). Beside them: the copy alone, one ``pread`` of each
member's data at offsets found beforehand, what returning ``bytes`` costs at the least.
Then, for each workload, ``WebDataset`` over the local tar files against a plain
``f.read(4 MB)`` of them, in MB/s (interleaved in this process).

``--quick`` (CI's smoke run) does the same on fewer shards, one round, and never installs the
peers: a peer whose venv is not there is skipped with a line saying so (installing them takes
minutes: torch, boto3, transformers...; run once without ``--quick``, or with
``--install-peers``). It is a report, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
PEERS_VENV = REPO / ".ci" / ".tools" / "peers-venv"
PEER_PACKAGES = ("torch==2.13.0", "litdata==0.2.76", "mosaicml-streaming==0.13.0")
PEERS = ("litdata", "mosaic")
LOADERS = ("wds_cloud", "wds_views", *PEERS)  # wds_views: WebDataset(zero_copy=True)
BUCKET = "bench"
KEY, SECRET = "bench-key", "bench-secret"
CHUNK = 16 << 20

# nothing may leave the machine: no cloud-metadata probes; rclone's ranged-GET checksums
ENV = {
    "AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_DEFAULT_REGION": "us-east-1",
}
for _name, _value in ENV.items():
    os.environ.setdefault(_name, _value)

#: per workload: (shards, samples per shard), full and --quick
SIZES = {"images": ((48, 160), (6, 160)), "tokens": ((2, 40_000), (1, 10_000))}

_BLOCK: list[bytes] = []


def _block() -> bytes:
    if not _BLOCK:
        import random

        _BLOCK.append(random.Random(20261201).randbytes(1 << 20))
    return _BLOCK[0]


def sample(workload: str, i: int) -> dict[str, bytes]:
    """Sample ``i`` of ``workload``: the same bytes in every format."""
    block = _block()
    if workload == "images":
        n = 98_000 + (i * 37) % 4001
        off = (i * 7919) % (len(block) - n)
        meta = {"id": i, "caption": f"a photo of thing number {i}", "width": 320, "height": 240}
        return {"jpg": i.to_bytes(8, "little") + block[off + 8:off + n],
                "json": json.dumps(meta).encode(), "cls": str(i % 1000).encode()}
    off = (i * 4099) % (len(block) - 4096)
    meta = {"id": i, "source": f"doc-{i // 7:08d}", "offset": (i % 7) * 2048, "lang": "en",
            "split": "train"}
    return {"tokens": i.to_bytes(8, "little") + block[off + 8:off + 4096],
            "json": json.dumps(meta).encode()}


# -- building (each format in the directory the server serves) ---------------------------------

def build_wds(out: Path, workload: str, shards: int, per_shard: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = out / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(s * per_shard, (s + 1) * per_shard):
                for ext, data in sample(workload, i).items():
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def _litdata_item(spec: tuple[str, int]) -> dict[str, bytes]:
    return sample(*spec)


def build_litdata(out: Path, workload: str, count: int) -> None:
    import litdata

    litdata.optimize(fn=_litdata_item, inputs=[(workload, i) for i in range(count)],
                     output_dir=str(out), chunk_bytes=CHUNK, num_workers=1,
                     reorder_files=False, mode="overwrite")


def build_mosaic(out: Path, workload: str, count: int) -> None:
    _stub_torchvision()
    from streaming import MDSWriter

    columns = dict.fromkeys(sample(workload, 0), "bytes")
    with MDSWriter(out=str(out), columns=columns, size_limit=CHUNK) as writer:
        for i in range(count):
            writer.write(sample(workload, i))


def _stub_torchvision() -> None:
    """Mosaic imports torchvision for its vision datasets (not used here), and the torchvision
    wheel pip picks does not load against the CPU torch: stand in for the two names."""
    import importlib.machinery
    import types

    try:
        import torchvision  # noqa: F401
        return
    except Exception:
        for name in list(sys.modules):
            if name.startswith("torchvision"):
                del sys.modules[name]
    tv = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    datasets.VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
    datasets.CIFAR10 = type("CIFAR10", (), {})  # type: ignore[attr-defined]
    functional.to_tensor = lambda x: x  # type: ignore[attr-defined]
    tv.datasets, tv.transforms, transforms.functional = datasets, transforms, functional  # type: ignore[attr-defined]
    modules = {"torchvision": tv, "torchvision.datasets": datasets,
               "torchvision.transforms": transforms,
               "torchvision.transforms.functional": functional}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules.update(modules)


# -- reading (in a process of its own) ---------------------------------------------------------

def _size(item: Any) -> int:
    return sum(len(v) for v in item.values() if isinstance(v, (bytes, bytearray, memoryview)))


_KINDS: list[str] = []


def _epoch(iterable: Any) -> tuple[float, float, int, int]:
    """(seconds to the first sample, seconds in all, samples, bytes) of one pass; the clock
    starts when ``iterable()`` (which builds the dataset, or returns it) is called."""
    start = time.perf_counter()
    first = 0.0
    count = nbytes = 0
    for item in iterable():
        if not count:
            first = time.perf_counter() - start
            if not _KINDS:  # what the loader hands out: bytes, or views (memoryview)
                _KINDS.append(",".join(sorted({type(v).__name__ for k, v in item.items()
                                               if not k.startswith("__")})))
        count += 1
        nbytes += _size(item)
    return first, time.perf_counter() - start, count, nbytes


def read_with(loader: str, url: str, cache: str, endpoint: str, warm_passes: int
              ) -> dict[str, Any]:
    """Cold epoch (empty cache), then ``warm_passes`` warm ones, of ``loader``."""
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    made: list[Any] = []
    if loader in ("wds_cloud", "wds_views"):
        import wds_cloud

        views = loader == "wds_views"
        options = {"key": KEY, "secret": SECRET, "endpoint_url": endpoint,
                   "config_kwargs": {"response_checksum_validation": "when_required",
                                     "request_checksum_calculation": "when_required"}}

        def build() -> Any:
            made.append(wds_cloud.WebDataset(url, shardshuffle=False, cache_dir=cache,
                                              storage_options={"s3": options},
                                              zero_copy=views))
            return made[0]
    elif loader == "litdata":
        import litdata
        from litdata.streaming import downloader

        # obstore (LitData's fast download path) refuses plain http unless allowed: the local
        # server is http on loopback, a real store https
        downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
            **downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}  # type: ignore[attr-defined]

        options = {"endpoint_url": endpoint, "aws_access_key_id": KEY,
                   "aws_secret_access_key": SECRET}

        def build() -> Any:
            made.append(litdata.StreamingDataset(url, cache_dir=cache, storage_options=options))
            return made[0]
    else:
        os.environ.update(S3_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=KEY,
                          AWS_SECRET_ACCESS_KEY=SECRET)
        _stub_torchvision()
        import streaming
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()

        def build() -> Any:
            made.append(streaming.StreamingDataset(remote=url, local=cache, shuffle=False,
                                                   batch_size=1))
            return made[0]
    first, cold, count, nbytes = _epoch(build)
    _KINDS.clear()  # what a warm epoch hands out (a cold one may differ: a filling cache)
    warm = [_epoch(lambda: made[0]) for _ in range(warm_passes)]
    again = None
    if loader == "wds_cloud":  # a second cold start in this process: its S3 client is set up
        shutil.rmtree(cache)
        made.clear()
        again = _epoch(build)[0]
    return {"loader": loader, "ttfs": first, "cold": cold, "samples": count, "bytes": nbytes,
            "warm": warm[-1][1] if warm else None, "warm_samples": warm[-1][2] if warm else 0,
            "ttfs_again": again, "kinds": _KINDS[0] if _KINDS else ""}


# -- the driver --------------------------------------------------------------------------------

def peers_python(install: bool) -> str | None:
    """The peers venv's python, made (and filled) first when ``install``; None if absent."""
    python = PEERS_VENV / "bin" / "python"
    check = [str(python), "-c",
             "import importlib.util as u, litdata; assert u.find_spec('streaming')"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False,
                                          env={**os.environ, **_quiet_env()}).returncode == 0:
        return str(python)
    if not install:
        return None
    print(f"# installing the peers ({', '.join(PEER_PACKAGES)}) into {PEERS_VENV} ...",
          flush=True)
    t0 = time.perf_counter()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *PEER_PACKAGES], check=True)
    print(f"# peers installed in {time.perf_counter() - t0:.0f} s", flush=True)
    return str(python)


def _quiet_env() -> dict[str, str]:
    return {"PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}


def run_json(argv: list[str], timeout: float = 900, path: str | None = None) -> dict[str, Any]:
    env = {**os.environ, **_quiet_env()}
    if path is not None:  # another wds_cloud (--baseline)
        env["PYTHONPATH"] = path
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout,
                         env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"exit {out.returncode}: {(out.stderr or out.stdout).strip()[-600:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def plain_read(paths: list[Path]) -> float:
    start, total = time.perf_counter(), 0
    for path in paths:
        with open(path, "rb") as f:
            while data := f.read(4 << 20):
                total += len(data)
    return total / (time.perf_counter() - start)


def local_read(paths: list[Path]) -> float:
    import wds_cloud

    start = time.perf_counter()
    total = sum(_size(s) for s in wds_cloud.WebDataset([str(p) for p in paths],
                                                       shardshuffle=False))
    return total / (time.perf_counter() - start)


def local_ratio(paths: list[Path], rounds: int) -> str:
    """wds_cloud over local files against a plain read of them: a line."""
    for path in paths:
        plain_read([path])
    local_read(paths[:1])
    rates: dict[str, list[float]] = {"wds": [], "plain": []}
    for r in range(max(rounds, 3)):
        for name in (("wds", "plain") if r % 2 == 0 else ("plain", "wds")):
            rates[name].append(local_read(paths) if name == "wds" else plain_read(paths))
    wds, plain = (statistics.median(rates[k]) / 1e6 for k in ("wds", "plain"))
    return (f"local files: wds_cloud {wds:,.0f} MB/s of member data, plain f.read(4 MB) "
            f"{plain:,.0f} MB/s of tar bytes: {wds / plain:.2f}× (target ≥ 0.5×)")


def copy_floor(paths: list[Path], count: int, rounds: int) -> str:
    """What handing out ``bytes`` costs at the least: one ``os.pread`` of each member's data
    out of the tar files, at offsets found beforehand (no parsing, no samples): a line."""
    members = []
    for path in paths:
        with tarfile.open(path) as tar:
            members.append((path, [(m.size, m.offset_data) for m in tar.getmembers()]))
    times = []
    for _ in range(max(rounds, 3)):
        start = time.perf_counter()
        for path, spans in members:
            fd = os.open(path, os.O_RDONLY)
            try:
                for size, offset in spans:
                    os.pread(fd, size, offset)
            finally:
                os.close(fd)
        times.append(time.perf_counter() - start)
    return (f"the copy alone (one pread per member of the local files, nothing parsed): "
            f"{statistics.median(times) / count * 1e6:.1f} µs a sample")


def _load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def bench(workload: str, root: Path, endpoint: str, peers: str | None, rounds: int,
          quick: bool, warm_passes: int, baseline: str | None = None,
          chosen: tuple[str, ...] = PEERS) -> list[str]:
    shards, per_shard = SIZES[workload][1 if quick else 0]
    count = shards * per_shard
    t0 = time.perf_counter()
    paths = build_wds(root / BUCKET / f"wds-{workload}", workload, shards, per_shard)
    urls = {"wds_cloud": f"s3://{BUCKET}/wds-{workload}/shard-{{0000..{shards - 1:04d}}}.tar",
            "litdata": f"s3://{BUCKET}/litdata-{workload}",
            "mosaic": f"s3://{BUCKET}/mosaic-{workload}"}
    loaders = ["wds_cloud", "wds_views"] + (["baseline"] if baseline else [])
    urls["baseline"] = urls["wds_views"] = urls["wds_cloud"]
    for peer in chosen:
        if peers is None:
            continue
        try:
            run_json([peers, str(HERE), "--peer", peer, "--build", str(root / BUCKET /
                      f"{peer}-{workload}"), "--workload", workload, "--count", str(count)])
            loaders.append(peer)
        except Exception as exc:
            print(f"{workload}: {peer}: building failed, skipped: {exc}", flush=True)
    mb = sum(p.stat().st_size for p in paths) / 1e6
    print(f"# {workload}: {count:,} samples, {shards} tar shards ({mb:,.0f} MB), built in all "
          f"formats in {time.perf_counter() - t0:.1f} s; {rounds} round(s); {_load()}",
          flush=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in loaders}
    for r in range(rounds):
        for name in loaders[r % len(loaders):] + loaders[:r % len(loaders)]:
            python = sys.executable if name in ("wds_cloud", "wds_views", "baseline") \
                else peers
            assert python is not None
            loader = "wds_cloud" if name == "baseline" else name
            argv = [python, str(HERE), "--peer", loader, "--read", urls[name], "--cache",
                    str(root.parent / f"cache-{name}"), "--endpoint", endpoint,
                    "--warm-passes", str(warm_passes)]
            try:
                results[name].append(run_json(argv, path=baseline if name == "baseline"
                                              else None))
            except Exception as exc:
                print(f"{workload}: {name}: round {r + 1} failed: {exc}", flush=True)
    lines = [_report(workload, results, count)]
    lines.append(f"{workload}: " + copy_floor(paths, count, 1 if quick else rounds))
    lines.append(f"{workload}: " + local_ratio(paths, 1 if quick else rounds))
    for line in lines:
        print(line, flush=True)
    return lines


def _report(workload: str, results: dict[str, list[dict[str, Any]]], count: int) -> str:
    medians: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        if not runs:
            continue
        bad = [run for run in runs if run["samples"] != count or run["warm_samples"] != count]
        if bad:
            print(f"{workload}: {name}: read {bad[0]['samples']}/{bad[0]['warm_samples']} "
                  f"samples, not {count}", flush=True)
        medians[name] = {k: statistics.median(run[k] for run in runs)
                         for k in ("ttfs", "cold", "warm")}
        m = medians[name]
        print(f"{workload}: {name:9s} cold {count / m['cold']:9,.0f} samples/s, warm "
              f"{count / m['warm']:9,.0f} samples/s ({m['warm'] / count * 1e6:5.1f} µs a sample), "
              f"first sample {m['ttfs']:.3f} s, values {runs[0].get('kinds')}  (medians of "
              f"{len(runs)}; {_load()})", flush=True)
    ours = medians.get("wds_cloud")
    peers = {k: v for k, v in medians.items() if k in PEERS}
    if ours is None or not peers:
        return f"{workload}: no ratio (peers not measured)"
    litdata = peers.get("litdata")
    best_cold = min(v["cold"] for v in peers.values())
    views = medians.get("wds_views")
    warm = f"warm {litdata['warm'] / ours['warm']:.2f}× LitData's (target ≥ 1.0×)" \
        if litdata else "warm: LitData not measured"
    if litdata and views:
        warm += f", {litdata['warm'] / views['warm']:.2f}× with zero_copy=True"
    if "baseline" in medians:
        base = medians["baseline"]
        print(f"{workload}: wds_cloud against the baseline: warm "
              f"{base['warm'] / ours['warm']:.2f}×, cold {base['cold'] / ours['cold']:.2f}×",
              flush=True)
    again = statistics.median(run["ttfs_again"] for run in results["wds_cloud"])
    return (f"{workload}: ratios: {warm}; cold {best_cold / ours['cold']:.2f}× the best "
            f"peer's (target ≥ 1.1×); first sample {ours['ttfs']:.3f} s (target ≤ 0.2 s; "
            f"{again:.3f} s for a second dataset in the process, whose S3 client is set up)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shards, one round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--warm-passes", type=int, default=2, help="warm epochs a round")
    parser.add_argument("--workloads", default="images,tokens")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="the peers to run (default: all)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also run the wds_cloud found in DIR (PYTHONPATH), as 'baseline'")
    parser.add_argument("--install-peers", action="store_true",
                        help="install the peers venv even with --quick")
    # one loader in this process (how the driver runs each of them)
    parser.add_argument("--peer", choices=LOADERS, help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--read", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer and args.build:
        builder = build_litdata if args.peer == "litdata" else build_mosaic
        builder(Path(args.build), args.workload, args.count)
        print(json.dumps({"built": args.build}))
        return 0
    if args.peer:
        print(json.dumps(read_with(args.peer, args.read, args.cache, args.endpoint,
                                   args.warm_passes)))
        return 0
    from wds_cloud.testing import LocalS3Server

    rounds = 1 if args.quick else args.rounds
    peers = peers_python(install=args.install_peers or not args.quick)
    if peers is None:
        print(f"# peers skipped: no peers venv at {PEERS_VENV} (--quick never installs one; "
              f"run once without --quick, or with --install-peers)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_peers-") as tmp:
        root = Path(tmp) / "served"
        (root / BUCKET).mkdir(parents=True)
        with LocalS3Server(root, key=KEY, secret=SECRET, etag_hash="crc32") as server:
            for workload in args.workloads.split(","):
                bench(workload, root, server.endpoint_url, peers, rounds, args.quick,
                      args.warm_passes, args.baseline,
                      tuple(p for p in args.peers.split(",") if p in PEERS))
                shutil.rmtree(root / BUCKET, ignore_errors=True)
                (root / BUCKET).mkdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
