"""``wds-cloud create SRC_DIR --output PATTERN``: pack a directory into tar shards, in parallel,
reproducibly (a thin layer over :mod:`wds_cloud.parallel`).

Also the options and output the per-shard commands share (``create`` and ``map-shards``):
the executor options, the final line and the ``--json`` document.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..parallel import RunReport, ShardReport, open_executor, plan_shards, scan_directory
from ..parallel.create import DirectoryScan, write_shards
from ..urls import redact, split_scheme
from .common import (
    OK,
    PROBLEMS,
    UNUSABLE,
    Progress,
    add_input_options,
    add_json_option,
    command_parser,
    count_arg,
    emit_json,
    plural,
    size_arg,
    storage_options,
)

__all__ = ["add_executor_options", "add_parser", "cmd_create", "executor_kind", "print_failures",
           "shard_count", "shard_range"]

_DESCRIPTION = """\
Pack the files under SRC_DIR into tar shards. Files that share a key form a sample: the key of
SRC_DIR/sub/a.b.c is sub/a (the path up to the basename's first dot, webdataset's rule) and
its field is b.c. Samples are sorted by key and the members of a sample by name (the tar
--sort=name convention), with fixed owner and times: the same files give byte-identical shards
whatever the number of workers or the executor. Shards are written atomically (a failed shard
leaves nothing behind), locally or straight to s3://, gs:// or az://.

Left out, and reported on stderr: hidden files and directories (.name), files without an
extension (readers would skip them) and __*__ names at the top (readers skip them too).

examples:
  wds-cloud create ./images --output 'shards/train-%06d.tar' --maxsize 100MB --workers 8
  wds-cloud create ./images --output 's3://bucket/train-%06d.tar' \\
      -o endpoint_url=http://127.0.0.1:9000 --executor dask --workers 4
  wds-cloud create ./images --output out/train-%06d.tar --executor dask \\
      --scheduler tcp://10.0.0.5:8786"""


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "create", help="pack a directory of files into tar shards, in "
                       "parallel and reproducibly", description=_DESCRIPTION)
    p.add_argument("source", metavar="SRC_DIR", help="the directory of files to pack")
    p.add_argument("--output", required=True, metavar="PATTERN",
                   help="shard names with a %%d field for the shard number: out/train-%%06d.tar, "
                   "s3://bucket/train-%%06d.tar (.tar.gz: gzip); a plain name if one shard is "
                   "enough")
    p.add_argument("--maxcount", type=count_arg(1), default=10000, metavar="N",
                   help="samples per shard at most")
    p.add_argument("--maxsize", type=size_arg, default="1GB", metavar="SIZE",
                   help="size of a shard's tar file at most: 1MB, 500MiB, 1e9, 1GB (a bigger "
                   "sample gets a shard of its own)")
    p.add_argument("--start", type=count_arg(0), default=0, metavar="N",
                   help="number of the first shard")
    add_executor_options(p, local="threads")
    add_input_options(p, inputs=False)
    add_json_option(p)
    p.set_defaults(func=cmd_create)


def add_executor_options(p: argparse.ArgumentParser, *, local: str) -> None:
    """``--executor``, ``--scheduler``, ``--workers`` and ``--retries``."""
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help=f"where the per-shard tasks run: local ({local} of this machine) or "
                   "dask (a new LocalCluster on 127.0.0.1, or the cluster of --scheduler; "
                   "needs pip install 'wds-cloud[dask]')")
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="address of a running Dask scheduler (tcp://HOST:8786); implies "
                   "--executor dask")
    p.add_argument("--workers", type=count_arg(1), default=min(8, os.cpu_count() or 1),
                   metavar="N", help=f"{local} (local; 1: in this process) or Dask worker "
                   "processes (a new LocalCluster); ignored with --scheduler")
    p.add_argument("--retries", type=count_arg(0), default=2, metavar="N",
                   help="times a failed shard is tried again")


def executor_kind(args: argparse.Namespace) -> str:
    return "dask" if args.scheduler is not None else str(args.executor)


def cmd_create(args: argparse.Namespace) -> int:
    """Run ``wds-cloud create``; the exit status."""
    scan = scan_directory(args.source)
    _warn_skipped(scan)
    if not scan.samples:
        return _fail(f"no files to pack in {args.source!r} ({scan.describe_skipped()})")
    plans = plan_shards(scan.samples, args.output, maxcount=args.maxcount,
                        maxsize=args.maxsize, start=args.start)
    _warn_stale(args.output, args.start + len(plans))
    options = storage_options(args)
    with open_executor(executor_kind(args), workers=args.workers,
                       scheduler=args.scheduler) as executor, \
            Progress("creating", unit="shard", total=len(plans),
                     enabled=not args.quiet) as progress:
        report = write_shards(plans, executor=executor, retries=args.retries,
                              storage_options=options,
                              on_shard=lambda shard: progress.update(1, shard.size))
    report.skipped = scan.skipped
    print_failures(report, "create")
    if args.json:
        emit_json({"source": os.path.abspath(args.source), "output": redact(args.output),
                   "executor": executor_kind(args), **report.to_json()})
    else:
        print(f"created {report.summary()}")
    return OK if report.ok else PROBLEMS


def _fail(message: str) -> int:
    print(f"wds-cloud create: error: {message}", file=sys.stderr)
    return UNUSABLE


def shard_count(report: RunReport) -> str:
    """``3 shards``, or ``2 of 3 shards`` when some failed."""
    done, total = len(report.written), len(report.shards)
    return plural(done, "shard") if done == total else f"{done} of {plural(total, 'shard')}"


def shard_range(shards: Sequence[ShardReport]) -> str:
    """``: out/p-000000.tar .. out/p-000002.tar`` (first and last written), or nothing."""
    if not shards:
        return ""
    first, last = redact(shards[0].output), redact(shards[-1].output)
    return f": {first}" if len(shards) == 1 else f": {first} .. {last}"


def print_failures(report: RunReport, command: str, limit: int = 10) -> None:
    """On stderr: the shards written after failed attempts, and those that failed for good
    (``limit`` of each, then how many more)."""
    retried = [s for s in report.shards if s.ok and s.errors]
    failed = [s for s in report.shards if not s.ok]
    for shard in retried[:limit]:
        print(f"wds-cloud {command}: {redact(shard.name)}: written after "
              f"{plural(len(shard.errors), 'failed attempt')} ({shard.errors[-1]})",
              file=sys.stderr)
    for shard in failed[:limit]:
        print(f"wds-cloud {command}: error: {redact(shard.name)} failed after "
              f"{plural(shard.attempts, 'attempt')}: {shard.error}", file=sys.stderr)
    for shards, what in ((retried, "written after failed attempts"), (failed, "failed")):
        if len(shards) > limit:
            print(f"wds-cloud {command}: ... and {len(shards) - limit} more shards {what} "
                  "(--json lists them all)", file=sys.stderr)


def _warn_skipped(scan: DirectoryScan) -> None:
    hidden, bare, reserved = (scan.skipped.get(k, []) for k in
                              ("hidden", "no_extension", "reserved"))
    if hidden:
        what = plural(len(hidden), "hidden file or directory", "hidden files and directories")
        print(f"wds-cloud create: skipped {what}: {_few(hidden)}", file=sys.stderr)
    if bare:
        print(f"wds-cloud create: warning: skipped {plural(len(bare), 'file')} without an "
              f"extension (readers would drop {'it' if len(bare) == 1 else 'them'}): "
              f"{_few(bare)}", file=sys.stderr)
    if reserved:
        print(f"wds-cloud create: warning: skipped {plural(len(reserved), 'file')} under a "
              f"__name__ readers skip as metadata: {_few(reserved)}", file=sys.stderr)


def _few(names: Sequence[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" (and {len(names) - n} more)" if len(names) > n else "")


def _warn_stale(pattern: str, after: int) -> None:
    """A local shard numbered right after the last one is left from an earlier run."""
    if split_scheme(pattern)[0] or "%" not in pattern:
        return
    try:
        name = pattern % after
    except (TypeError, ValueError):
        return
    if os.path.exists(name):
        print(f"wds-cloud create: warning: {name} (and maybe more) is left from an earlier "
              "run and is not part of this one; remove it before reading the shards with a "
              "glob", file=sys.stderr)
