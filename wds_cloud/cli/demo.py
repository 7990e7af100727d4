"""``wds-cloud demo``: the main job. Writes a synthetic dataset to an S3 server on this
machine (``--local``: to local files), then streams it back as a training loop would."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import wds_cloud as wds

from .common import Progress

__all__ = ["add_parser", "cmd_demo", "make_demo_shards"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="the main job: write a synthetic dataset to an S3 server on "
                       "this machine and stream it back")
    p.add_argument("--local", action="store_true", help="use local files instead of S3")
    p.add_argument("--dir", help="where the shards (or the S3 buckets) go (default: temporary)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--per-shard", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--spec", metavar="FILE",
                   help="read the dataset back through a dataset spec over s3://demo/train/ "
                   "(e.g. config/demo-mix.yaml): a mix of sources, with each epoch's shares")
    p.set_defaults(func=cmd_demo)


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
            if args.spec:
                raise SystemExit("wds-cloud demo: --spec reads s3://demo/train/; leave out "
                                 "--local")
            return _demo_run(args, str(root / "demo-%06d.tar"), str(root / "demo-*.tar"), None)
        from ..testing.locals3 import LocalS3Server

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
    if args.spec:
        return _demo_spec(args, options)
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


def _demo_spec(args: argparse.Namespace, options: Any) -> int:
    """The job over a dataset spec: an endless mix, cut into epochs of as many samples as the
    dataset has, each worker taking its share."""
    from collections import Counter

    dataset = wds.WebDataset(args.spec, storage_options=options)
    workers = max(args.workers, 1)
    per_worker = args.shards * args.per_shard // args.batch_size // workers
    pipeline = (dataset.decode().to_tuple("npy", "cls", "__source__")
                .batched(args.batch_size).with_epoch(per_worker))
    loader = wds.WebLoader(pipeline, batch_size=None, num_workers=args.workers)
    print(f"spec {args.spec}: seed {dataset.seed}, sources "
          f"{', '.join(s.name for s in dataset.spec.sources)}")
    for epoch in range(args.epochs):
        progress = Progress(f"epoch {epoch}", enabled=not args.quiet)
        seen: Counter[str] = Counter()
        for images, labels, sources in loader:
            seen.update(sources)
            progress.update(len(labels), int(images.nbytes))
        progress.close()
        total = sum(seen.values())
        want = dataset.spec.probabilities(epoch, dataset.seed)
        shares = ", ".join(f"{name} {seen[name] / total:.1%} (expected {p:.1%})"
                           for name, p in want.items())
        print(f"throughput: {progress.summary()} (epoch {epoch}, {args.workers} workers, "
              f"batch size {args.batch_size}, from {args.spec})")
        print(f"shares: {shares}")
    return 0
