"""``wds-cloud``: inspect, benchmark and pack WebDataset shards, and run the demo job.

The CLI sits on top of the public API (``import wds_cloud as wds``) and is the only part of the
package that prints.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import wds_cloud as wds
from wds_cloud.cachecli import add_cache_parser
from wds_cloud.settings import human_size

__all__ = ["main"]


class Progress:
    """A small progress line on stderr: count, rate and bytes, redrawn at most 5 times a second."""

    def __init__(self, label: str, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.created = self.start = time.perf_counter()
        self.startup: float | None = None  # seconds until the first item (imports, workers)
        self.count = 0
        self.nbytes = 0
        self._last = 0.0

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        """Count ``n`` items of ``nbytes``; rates are measured from the first item on."""
        now = time.perf_counter()
        if self.startup is None:
            self.startup = now - self.created
            self.start = now
        self.count += n
        self.nbytes += nbytes
        if self.enabled and now - self._last > 0.2:
            self._last = now
            self.stream.write(f"\r{self.label}: {self.summary()}   ")
            self.stream.flush()

    def summary(self) -> str:
        dt = max(time.perf_counter() - self.start, 1e-9)
        size = f", {human_size(self.nbytes)}" if self.nbytes else ""
        rate = f", {self.nbytes / dt / 1e6:,.1f} MB/s" if self.nbytes else ""
        startup = f" (first after {self.startup:.2f} s)" if self.startup is not None else ""
        return (f"{self.count} samples{size} in {dt:.2f} s{startup}: "
                f"{self.count / dt:,.0f} samples/s{rate}")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def sample_bytes(sample: dict[str, Any]) -> int:
    """Payload bytes of a raw sample (meta keys excluded)."""
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and
               isinstance(v, (bytes, bytearray)))


def expand(specs: Sequence[str]) -> list[str]:
    """Each command-line shard spec expanded (braces, ``::``, ``${NAME}``), in order."""
    url_vars = wds.Settings.from_env().url_vars
    return [url for spec in specs for url in wds.expand_urls(spec, url_vars=url_vars)]


def _raw_samples(specs: Sequence[str]) -> Iterator[dict[str, Any]]:
    return iter(wds.DataPipeline(wds.SimpleShardList(expand(specs)), wds.tarfile_to_samples()))


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the first samples of a shard set, then totals."""
    count, nbytes = 0, 0
    suffixes: dict[str, int] = {}
    for sample in _raw_samples(args.urls):
        if count < args.count:
            parts = ", ".join(f"{k}:{human_size(len(v))}" for k, v in sorted(sample.items())
                              if not k.startswith("__"))
            print(f"{sample['__key__']}  [{parts}]  ({sample['__url__']})")
        for k in sample:
            if not k.startswith("__"):
                suffixes[k] = suffixes.get(k, 0) + 1
        count += 1
        nbytes += sample_bytes(sample)
        if not args.all and count >= args.count:
            break
    what = "samples" if args.all else "samples shown"
    print(f"{count} {what}, {human_size(nbytes)}; members: "
          + ", ".join(f".{k} x{n}" for k, n in sorted(suffixes.items())))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Read a shard set and print throughput."""
    progress = Progress("reading", enabled=not args.quiet)
    source: Iterable[dict[str, Any]]
    if args.decode:
        dataset = wds.WebDataset(expand(args.urls), shardshuffle=False).decode()
        source = dataset
    else:
        source = _raw_samples(args.urls)
    for sample in source:
        progress.update(1, sample_bytes(sample) if not args.decode else 0)
        if args.limit and progress.count >= args.limit:
            break
    progress.close()
    print(f"throughput: {progress.summary()}")
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    """Pack files that share a basename into samples of tar shards."""
    root = Path(args.source)
    if not root.is_dir():
        print(f"wds-cloud pack: {root} is not a directory", file=sys.stderr)
        return 2
    groups: dict[str, dict[str, Path]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        directory, _, base = rel.rpartition("/")
        key, dot, suffix = base.partition(".")
        if not dot:
            continue
        groups.setdefault(f"{directory}/{key}" if directory else key, {})[suffix] = path
    if wds.urls.split_scheme(args.pattern)[0] == "":
        Path(args.pattern).parent.mkdir(parents=True, exist_ok=True)
    progress = Progress("packing", enabled=not args.quiet)
    with wds.ShardWriter(args.pattern, maxcount=args.maxcount, maxsize=args.maxsize) as sink:
        for key, members in groups.items():
            sample: dict[str, Any] = {"__key__": key}
            sample.update({suffix: path.read_bytes() for suffix, path in members.items()})
            sink.write(sample)
            progress.update(1, sample_bytes(sample))
        shards = sink.shard
    progress.close()
    print(f"packed {progress.count} samples into {shards} shard(s): {progress.summary()}")
    return 0


def make_demo_shards(
    pattern: str, *, shards: int, per_shard: int, storage_options: Any = None,
) -> list[str]:
    """Write a small synthetic image-classification dataset to ``pattern`` (a path or URL with
    a ``%06d`` field); returns the shard URLs."""
    import numpy as np

    rng = np.random.default_rng(0)
    with wds.ShardWriter(pattern, maxcount=per_shard, storage_options=storage_options) as sink:
        for i in range(shards * per_shard):
            image = rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8)
            sink.write({"__key__": f"sample{i:07d}", "npy": image, "cls": int(i % 10),
                        "json": {"index": i}})
    return [pattern % k for k in range(shards)]


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: write a synthetic dataset to an S3 server on this machine (or local disk
    with ``--local``), then stream it back as a training loop would."""
    with tempfile.TemporaryDirectory(prefix="wds-demo-") as tmp:
        root = Path(args.dir) if args.dir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        if args.local:
            return _demo_run(args, str(root / "demo-%06d.tar"), str(root / "demo-*.tar"), None)
        from .locals3 import LocalS3Server

        (root / "demo").mkdir(exist_ok=True)  # the bucket
        with LocalS3Server(root, key="demo", secret="demo-secret") as server:
            print(f"S3 server (rclone) at {server.endpoint_url}, buckets in {root}")
            options = {"s3": server.storage_options}
            return _demo_run(args, "s3://demo/train/demo-%06d.tar", "s3://demo/train/demo-*.tar",
                             options)


def _demo_run(args: argparse.Namespace, pattern: str, glob: str, options: Any) -> int:
    urls = make_demo_shards(pattern, shards=args.shards, per_shard=args.per_shard,
                            storage_options=options)
    print(f"wrote {len(urls)} shards of {args.per_shard} samples to {pattern % 0} ...")
    dataset = (wds.WebDataset(glob, shardshuffle=False, nodesplitter=wds.split_by_node,
                              storage_options=options)
               .decode().to_tuple("npy", "cls").batched(args.batch_size))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=args.workers)
    for epoch in range(args.epochs):
        progress = Progress(f"epoch {epoch}", enabled=not args.quiet)
        for images, labels in loader:
            progress.update(len(labels), int(images.nbytes))
        progress.close()
        print(f"throughput: {progress.summary()} (epoch {epoch}, {args.workers} workers, "
              f"batch size {args.batch_size}, from {glob})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wds-cloud", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="show the first samples of shards, or count them all")
    p.add_argument("urls", nargs="+", help="shard URLs or brace patterns")
    p.add_argument("-n", "--count", type=int, default=5, help="samples to show")
    p.add_argument("--all", action="store_true", help="read every sample and count them")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("bench", help="read shards and print samples/s and MB/s")
    p.add_argument("urls", nargs="+")
    p.add_argument("--decode", action="store_true", help="decode samples with the default decoder")
    p.add_argument("--limit", type=int, default=0, help="stop after this many samples")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("pack", help="pack a directory of files into tar shards")
    p.add_argument("source", help="directory; files sharing a basename form one sample")
    p.add_argument("pattern", help="output pattern, e.g. out/shard-%%06d.tar or s3://b/p-%%06d.tar")
    p.add_argument("--maxcount", type=int, default=10000)
    p.add_argument("--maxsize", type=float, default=1e9)
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("demo", help="the main job: write a synthetic dataset to an S3 server on "
                       "this machine and stream it back")
    p.add_argument("--local", action="store_true", help="use local files instead of S3")
    p.add_argument("--dir", help="where the shards (or the S3 buckets) go (default: temporary)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--per-shard", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.set_defaults(func=cmd_demo)

    add_cache_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except wds.WdsCloudError as exc:
        print(f"wds-cloud: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
