"""``wds-cloud inspect URL...``: the first samples of shards, or a count of them all."""

from __future__ import annotations

import argparse
from typing import Any

from wds_cloud.settings import human_size

from .common import raw_samples, sample_bytes

__all__ = ["add_parser", "cmd_inspect"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("inspect", help="show the first samples of shards, or count them all")
    p.add_argument("urls", nargs="+", help="shard URLs or brace patterns")
    p.add_argument("-n", "--count", type=int, default=5, help="samples to show")
    p.add_argument("--all", action="store_true", help="read every sample and count them")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the first samples of a shard set, then totals."""
    count, nbytes = 0, 0
    suffixes: dict[str, int] = {}
    for sample in raw_samples(args.urls):
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
