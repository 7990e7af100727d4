"""``wds-cloud``: inspect, benchmark and pack WebDataset shards, look after a shard cache, and
run the demo job.

``main.py`` builds the parser from one module per command (each has ``add_parser(sub)``); the
commands sit on top of the public API (``import wds_cloud as wds``). The CLI is the only part of
the package that prints.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import wds_cloud as wds

from . import bench, cache, demo, inspect, pack, spec

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wds-cloud", description="Inspect, benchmark and pack WebDataset shards, look after "
        "a shard cache, and run the demo job.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (inspect, bench, pack, demo, cache, spec):
        command.add_parser(sub)
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


