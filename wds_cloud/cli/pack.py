"""``wds-cloud pack DIR PATTERN``: files that share a basename, packed into tar shards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import wds_cloud as wds

from .common import Progress, sample_bytes

__all__ = ["add_parser", "cmd_pack"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack a directory of files into tar shards")
    p.add_argument("source", help="directory; files sharing a basename form one sample")
    p.add_argument("pattern", help="output pattern, e.g. out/shard-%%06d.tar or s3://b/p-%%06d.tar")
    p.add_argument("--maxcount", type=int, default=10000)
    p.add_argument("--maxsize", type=float, default=1e9)
    p.set_defaults(func=cmd_pack)


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
