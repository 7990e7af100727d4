"""``wds-cloud bench URL...``: read shards and print samples/s and MB/s."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import wds_cloud as wds

from .common import Progress, expand, raw_samples, sample_bytes

__all__ = ["add_parser", "cmd_bench"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="read shards and print samples/s and MB/s")
    p.add_argument("urls", nargs="+")
    p.add_argument("--decode", action="store_true", help="decode samples with the default decoder")
    p.add_argument("--limit", type=int, default=0, help="stop after this many samples")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Read a shard set and print throughput."""
    progress = Progress("reading", enabled=not args.quiet)
    source: Iterable[dict[str, Any]]
    if args.decode:
        dataset = wds.WebDataset(expand(args.urls), shardshuffle=False).decode()
        source = dataset
    else:
        source = raw_samples(args.urls)
    for sample in source:
        progress.update(1, sample_bytes(sample) if not args.decode else 0)
        if args.limit and progress.count >= args.limit:
            break
    progress.close()
    print(f"throughput: {progress.summary()}")
    return 0
