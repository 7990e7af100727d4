"""``wds-cloud inspect URL|SPEC...``: per shard, samples, extensions, member sizes and anomalies.

Each shard is read entry by entry (:func:`wds_cloud.tar.audit.audit_shard`), several at once in
a thread pool (I/O bound); the audits are then compared across shards
(:func:`~wds_cloud.tar.audit.cross_shard_anomalies`). Without ``--all`` only the first
``--shards N`` shards are read; the names of all of them are still checked for mixed
compression. A spec's sources are compared each on its own.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import numpy as np

from ..errors import OpenError
from ..settings import human_size
from ..tar.audit import KINDS, Anomaly, ShardAudit, audit_shard, cross_shard_anomalies
from ..tar.audit import size_percentiles as percentiles
from ..urls import redact
from .common import (
    OK,
    PROBLEMS,
    UNUSABLE,
    Input,
    Inputs,
    Progress,
    add_input_options,
    add_json_option,
    command_parser,
    count_arg,
    emit_json,
    plural,
)

__all__ = ["add_parser", "cmd_inspect", "inspect_shards"]

_DESCRIPTION = """\
Read shards entry by entry and report, per shard: samples, members, bytes of member data,
compression; overall: how many samples have each extension and member sizes per extension
(p0, p50, p90, p99, max); and anomalies, each with the shard, member and byte offset (in the
uncompressed tar) where known:

  corrupt            truncated or corrupt data (reading stops there)
  empty              a shard without members
  compression        data compressed otherwise than the name says (.tar holding gzip)
  non-regular        directories, symlinks, hard links, devices, fifos (readers skip them)
  no-extension       a file name without a dot in its basename (readers drop it)
  duplicate-key      a member (key + extension) twice in a shard
  non-adjacent       members of one sample separated by other samples (a, b, a)
  extra-dots         a rare extension with a dot in it (photo.2021.jpg: key 'photo',
                     extension '2021.jpg'): a dot meant as part of the key?
  split-sample       a sample at the end of one shard and the start of the next
  key-in-two-shards  the same key in two shards
  mixed-compression  compressed and plain shards in one set (by name or data)

Without --all the first shard(s) are read (--shards N); --all reads every one, --workers at
a time, with a progress bar.

examples:
  wds-cloud inspect shards/train-000000.tar
  wds-cloud inspect 'shards/train-{000000..000099}.tar' --all --workers 16
  wds-cloud inspect 's3://bucket/train-*.tar' -n 3 -o s3.endpoint_url=http://127.0.0.1:9000
  wds-cloud inspect config/train.yaml --all --json"""

_EXIT = """\
exit status: 0 no anomalies; 1 anomalies found (corrupt shards included); 2 bad arguments,
or a shard that cannot be found or opened (the others are still inspected); 130 interrupted."""


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "inspect", help="check shards: samples, extensions, member "
                       "sizes, anomalies", description=_DESCRIPTION, epilog=_EXIT)
    add_input_options(p, what="shards to inspect")
    p.add_argument("-n", "--shards", type=count_arg(1), default=1, metavar="N",
                   help="without --all: how many shards to read, from the first")
    p.add_argument("--all", action="store_true", help="read every shard")
    p.add_argument("--workers", type=count_arg(1), default=8, metavar="N",
                   help="shards read at once (threads)")
    p.add_argument("--show", type=count_arg(0), default=10, metavar="N",
                   help="anomalies listed per kind in the text output (--json lists up to "
                        "20 per shard and kind; all are counted)")
    add_json_option(p)
    p.set_defaults(func=cmd_inspect)


def _audit(inputs: Inputs, shard: Input) -> ShardAudit:
    stream = inputs.open(shard)
    try:
        return audit_shard(stream, url=shard.url)
    finally:
        stream.close()


def inspect_shards(inputs: Inputs, shards: Sequence[Input], *, workers: int = 8,
                   progress: Progress | None = None
                   ) -> tuple[list[ShardAudit | None], list[OpenError]]:
    """The audit of each of ``shards`` (in order; None for a shard that could not be opened
    or read), and the errors of those that could not."""
    for options in {id(s.options): s.options for s in shards}.values():
        inputs.router(options)  # built here, not raced for in the threads
    audits: list[ShardAudit | None] = [None] * len(shards)
    errors: dict[int, OpenError] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(shards))))
    futures = {pool.submit(_audit, inputs, shard): i for i, shard in enumerate(shards)}
    try:
        for future in as_completed(futures):
            i = futures[future]
            try:
                audits[i] = future.result()
            except OpenError as exc:
                errors[i] = exc
            except OSError as exc:
                errors[i] = OpenError(f"cannot read {redact(shards[i].url)!r}: {exc}",
                                      url=redact(shards[i].url))
            if progress is not None:
                done = audits[i]
                progress.update(1, done.nbytes if done is not None else 0)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C: no new shards
        raise
    pool.shutdown()
    return audits, [errors[i] for i in sorted(errors)]


def _extensions(audits: Sequence[ShardAudit]) -> dict[str, dict[str, Any]]:
    """Per extension over ``audits``: samples having it, and member size percentiles."""
    samples: Counter[str] = Counter()
    sizes: dict[str, list[np.ndarray]] = {}
    for audit in audits:
        samples.update(audit.extensions)
        for ext, s in audit.sizes.items():
            sizes.setdefault(ext, []).append(s)
    out = {ext: {"samples": samples[ext], "members": int(sum(len(s) for s in sizes[ext])),
                 "sizes": percentiles(np.concatenate(sizes[ext]))}
           for ext in sorted(sizes)}
    every = [s for parts in sizes.values() for s in parts]
    if every:
        out["*"] = {"samples": sum(a.samples for a in audits),
                    "members": sum(a.members for a in audits),
                    "sizes": percentiles(np.concatenate(every))}
    return out


def _shard_row(shard: Input, audit: ShardAudit) -> dict[str, Any]:
    return {"url": redact(shard.url), "source": shard.source, "samples": audit.samples,
            "members": audit.members, "entries": audit.entries, "bytes": audit.nbytes,
            "compression": audit.compression or None,
            "extensions": {ext: {"samples": n, "sizes": percentiles(audit.sizes[ext])}
                           for ext, n in sorted(audit.extensions.items())},
            "anomalies": dict(audit.counts)}


def _report(shards: Sequence[Input], chosen: Sequence[Input],
            audits: Sequence[ShardAudit | None], errors: Sequence[OpenError]) -> dict[str, Any]:
    done = [a for a in audits if a is not None]
    found: list[Anomaly] = []
    counts: Counter[str] = Counter()
    for source in dict.fromkeys(s.source for s in shards):  # compared within a source
        more, more_counts = cross_shard_anomalies(
            [a for s, a in zip(chosen, audits, strict=True) if s.source == source],
            urls=[s.url for s in shards if s.source == source])
        found += more
        counts += more_counts
    for audit in done:
        counts.update(audit.counts)
    anomalies = sorted([x for a in done for x in a.anomalies] + found,
                       key=lambda x: KINDS.index(x.kind))
    rows = [_shard_row(s, a) for s, a in zip(chosen, audits, strict=True) if a]
    by_url = {row["url"]: row["anomalies"] for row in rows}
    for x in found:
        if x.url in by_url:
            by_url[x.url][x.kind] = by_url[x.url].get(x.kind, 0) + 1
    return {
        "shards": rows,
        "summary": {"listed": len(shards), "selected": len(chosen), "inspected": len(done),
                    "samples": sum(a.samples for a in done),
                    "members": sum(a.members for a in done),
                    "bytes": sum(a.nbytes for a in done),
                    "extensions": _extensions(done)},
        "anomaly_counts": {k: counts[k] for k in KINDS if counts[k]},
        "anomalies": [a.as_dict() for a in anomalies],
        "errors": [{"url": e.url, "message": str(e)} for e in errors],
    }


def _table(rows: Sequence[dict[str, Any]]) -> None:
    width = max([len("shard")] + [len(r["url"]) for r in rows])
    print(f"{'shard':<{width}}  {'samples':>9}  {'members':>9}  {'data':>10}  "
          f"{'compression':<11}  anomalies")
    for r in rows:
        print(f"{r['url']:<{width}}  {r['samples']:>9,}  {r['members']:>9,}  "
              f"{human_size(r['bytes']):>10}  {r['compression'] or '-':<11}  "
              f"{sum(r['anomalies'].values()):,}")


def _print_extensions(extensions: dict[str, dict[str, Any]]) -> None:
    if not extensions:
        return
    width = max(len("extension"), *(len(ext) for ext in extensions))
    names = ("p0", "p50", "p90", "p99", "max")
    print(f"\n{'extension':<{width}}  {'samples':>9}  "
          + "  ".join(f"{n:>10}" for n in names))
    for ext, row in extensions.items():
        label = "(all)" if ext == "*" else ext
        sizes = "  ".join(f"{human_size(row['sizes'][n]):>10}" for n in names)
        print(f"{label:<{width}}  {row['samples']:>9,}  {sizes}")


def _print_anomalies(report: dict[str, Any], show: int) -> None:
    counts = report["anomaly_counts"]
    if not counts:
        if report["summary"]["inspected"]:
            print("\nno anomalies")
        return
    total = sum(counts.values())
    print(f"\n{plural(total, 'anomaly', 'anomalies')}: "
          + ", ".join(f"{n:,} {kind}" for kind, n in counts.items()))
    listed: Counter[str] = Counter()
    for a in report["anomalies"]:
        listed[a["kind"]] += 1
        if listed[a["kind"]] > show:
            continue
        where = a["url"] or "(shard set)"
        if a["member"] is not None:
            where += f" member {a['member']!r}"
        if a["offset"] is not None:
            where += f" at offset {a['offset']}"
        print(f"  {a['kind']}: {where}: {a['message']}")
    for kind, n in counts.items():
        if n > min(show, listed[kind]):
            print(f"  {kind}: ... {n - min(show, listed[kind]):,} more")


def _print(report: dict[str, Any], show: int) -> None:
    if report["shards"]:
        _table(report["shards"])
    s = report["summary"]
    read = ("" if s["inspected"] == s["listed"] else
            f" (of {s['listed']:,} listed; --all reads every one)"
            if s["selected"] < s["listed"] else f" (of {s['listed']:,} listed)")
    print(f"\n{plural(s['inspected'], 'shard')} inspected{read}: "
          f"{plural(s['samples'], 'sample')}, {plural(s['members'], 'member')}, "
          f"{human_size(s['bytes'])} of member data")
    _print_extensions(s["extensions"])
    _print_anomalies(report, show)


def cmd_inspect(args: argparse.Namespace) -> int:
    inputs = Inputs.from_args(args)
    shards = inputs.shards()
    chosen = shards if args.all else shards[:args.shards]
    with Progress("inspect", unit="shard", total=len(chosen),
                  enabled=not getattr(args, "quiet", False)) as progress:
        audits, errors = inspect_shards(inputs, chosen, workers=args.workers, progress=progress)
    report = _report(shards, chosen, audits, errors)
    if args.json:
        emit_json(report)
    else:
        _print(report, args.show)
    for error in errors:
        print(f"wds-cloud inspect: error: {error}", file=sys.stderr)
    if errors:
        return UNUSABLE
    return PROBLEMS if report["anomaly_counts"] else OK
