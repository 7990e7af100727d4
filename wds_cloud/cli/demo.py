"""``wds-cloud demo``: the main job, the whole product in one command.

1. makes a small sample dataset of files (``sample000000.npy``/``.cls``/``.json``: a 32x32
   image, its class, its metadata) in a work directory;
2. packs them into shards with ``create`` (:func:`wds_cloud.create_shards`) straight to an S3
   server started on this machine (``rclone serve s3``, as ``wds-cloud serve-s3`` does);
   ``--local`` writes local shards instead;
3. writes a YAML dataset spec mixing three slices of the shards by weight (or takes ``--spec``);
4. streams it through the spec and the shard cache into a PyTorch DataLoader (``WebLoader``),
   epoch by epoch, with a progress bar, a ``throughput:`` line, the sources' shares and the
   requests the store saw and the shards read from the cache (from the second epoch on, only
   shards no epoch has cached yet are requested: those the first epoch's draws did not reach).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from ..settings import human_size
from .common import Progress, command_parser, count_arg, plural

__all__ = ["DEMO_SPEC", "add_parser", "cmd_demo", "make_sample_files"]

#: the demo's spec; ``{prefix}`` is where ``create`` wrote the shards
DEMO_SPEC = """\
# The demo's dataset spec: three slices of one set of shards, mixed by weight.
prefix: {prefix}
seed: 1234
datasets:
  - name: head
    shards: demo-{{000000..000003}}.tar   # a brace pattern
    weight: 0.6
  - name: middle
    shards: [demo-000004.tar, demo-000005.tar]   # a list
    weight: 0.3
    scale: [0.5, 1.5]                   # a factor drawn per epoch, the same on every rank
  - name: tail
    shards: demo-00000[67].tar          # a glob, listed once
    weight: 0.1
"""


_DESCRIPTION = """\
The main job, the whole product in one command:
  1. makes a small dataset of files that share a basename (sample000000.npy, .cls, .json);
  2. packs them into shards with create, straight to an S3 server it starts on this machine
     (as wds-cloud serve-s3 does; --local: local shards);
  3. writes a YAML dataset spec mixing three slices of the shards by weight (or takes --spec);
  4. streams it through the spec and the shard cache into a PyTorch DataLoader, epoch by
     epoch: a progress bar, a throughput: line, the sources' shares and the requests the
     store saw and the shards the cache gave (from the second epoch on, the store sees
     requests only for shards not cached yet)."""


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "demo", help="the main job: make a dataset, pack it with create to "
                       "an S3 server on this machine, stream it through a spec and the cache "
                       "into a DataLoader", description=_DESCRIPTION)
    p.add_argument("--local", action="store_true",
                   help="write the shards to local files instead of the S3 server (no cache)")
    p.add_argument("--dir", help="work directory for the files, buckets and cache "
                   "(default: a temporary directory, removed at the end)")
    p.add_argument("--epochs", type=count_arg(1), default=2, help="epochs to read")
    p.add_argument("--shards", type=count_arg(8), default=8,
                   help="shards to create (the demo spec reads 8)")
    p.add_argument("--per-shard", type=count_arg(1), default=1000, help="samples per shard")
    p.add_argument("--batch-size", type=count_arg(1), default=64, help="samples per batch")
    p.add_argument("--workers", type=count_arg(0), default=min(2, os.cpu_count() or 1),
                   help="DataLoader worker processes")
    p.add_argument("--spec", metavar="FILE",
                   help="read through this spec instead of the demo's (it reads "
                   "s3://demo/train/demo-NNNNNN.tar, e.g. config/demo-mix.yaml)")
    p.set_defaults(func=cmd_demo)


def make_sample_files(root: Path, count: int) -> None:
    """``count`` samples as files sharing a basename: ``.npy`` (a 32x32x3 image), ``.cls``,
    ``.json``."""
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        base = root / f"sample{i:06d}"
        np.save(base.with_suffix(".npy"), rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
        base.with_suffix(".cls").write_text(str(i % 10))
        base.with_suffix(".json").write_text(json.dumps({"index": i}))


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the main job (see the module docstring)."""
    if args.local and args.spec:
        raise SystemExit("wds-cloud demo: --spec reads s3://demo/train/; leave out --local")
    with tempfile.TemporaryDirectory(prefix="wds-demo-") as tmp:
        root = Path(args.dir).resolve() if args.dir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        files = root / "files"
        total = args.shards * args.per_shard
        print(f"1. {plural(total, 'sample')} as files (.npy image, .cls, .json) in {files}")
        make_sample_files(files, total)
        if args.local:
            return _run(args, root, files, f"{root / 'shards'}/", None)
        from ..testing.locals3 import LocalS3Server

        (root / "buckets" / "demo").mkdir(parents=True, exist_ok=True)
        with LocalS3Server(root / "buckets", key="demo", secret="demo-secret") as server:
            print(f"   S3 server (rclone) at {server.endpoint_url}, buckets in "
                  f"{root / 'buckets'}")
            return _run(args, root, files, "s3://demo/train/", {"s3": server.storage_options})


def _run(args: argparse.Namespace, root: Path, files: Path, prefix: str,
         options: dict[str, Any] | None) -> int:
    import wds_cloud as wds

    pattern = f"{prefix}demo-%06d.tar"
    with Progress("creating", unit="shard", enabled=not args.quiet) as progress:
        report = wds.create_shards(
            files, pattern, maxcount=args.per_shard, storage_options=options,
            on_shard=lambda shard: progress.update(1, shard.size))
    print(f"2. create: {report.summary()}")
    spec = Path(args.spec) if args.spec else root / "demo.yaml"
    if not args.spec:
        spec.write_text(DEMO_SPEC.format(prefix=prefix))
    cache = None if args.local else root / "cache"
    print(f"3. spec {spec}" + (f", shard cache in {cache}" if cache else ""))
    dataset = wds.WebDataset(str(spec), storage_options=options,
                             cache_dir=str(cache) if cache else None)
    steps = args.shards * args.per_shard // args.batch_size
    pipeline = (dataset.decode().to_tuple("npy", "cls", "__source__")
                .batched(args.batch_size).with_epoch(nbatches=steps))
    loader = wds.WebLoader(pipeline, batch_size=None, num_workers=args.workers)
    print(f"4. reading: seed {dataset.seed}, {steps} batches of {args.batch_size} per epoch, "
          f"WebLoader with {plural(args.workers, 'worker')}")
    for epoch in range(args.epochs):
        _epoch(args, loader, dataset, epoch, remote=options is not None)
    if cache is not None:
        from ..cache import ShardCache
        from ..cache import admin as cacheadmin

        use = cacheadmin.usage(ShardCache(str(cache)))
        print(f"5. cache: {plural(use.entries, 'shard')}, {human_size(use.bytes)} in {cache}")
    return 0


def _epoch(args: argparse.Namespace, loader: Any, dataset: Any, epoch: int, *,
           remote: bool) -> None:
    before = loader.io_stats()
    seen: Counter[str] = Counter()
    with Progress(f"epoch {epoch}", enabled=not args.quiet) as progress:
        for images, labels, sources in loader:
            seen.update(sources)
            progress.update(len(labels), int(images.nbytes))
    print(f"throughput: {progress.summary()} (epoch {epoch})")
    total = max(sum(seen.values()), 1)
    want = dataset.spec.probabilities(epoch, dataset.seed)
    print("   shares: " + ", ".join(f"{name} {seen[name] / total:.1%} (expected {p:.1%})"
                                    for name, p in want.items()))
    if remote:
        after = loader.io_stats()
        requests = after["requests"] - before["requests"]
        nbytes = after["bytes_read"] - before["bytes_read"]
        hits = after["cache_hits"] - before["cache_hits"]
        line = f"   S3: {plural(requests, 'request')}, {human_size(nbytes)} read"
        if hits and not requests:
            line += " (everything came from the shard cache)"
        elif hits:
            line += (f" (shards not cached yet); {plural(hits, 'read')} of shards already "
                     "downloaded came from the shard cache")
        print(line)
