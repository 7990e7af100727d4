"""``wds-cloud ls URL|SPEC...``: the shards inputs name, with their sizes and a total.

Shards are listed as every command reads them (:class:`~.common.Inputs`: brace patterns,
globs, ``::`` lists, specs), then looked up without being read
(:func:`wds_cloud.listing.shard_sizes`: one listing per directory, or a metadata request per
shard for a few; for http(s), a request for each shard's first byte). A spec's shards are
grouped by source. Shards that do not exist are listed as ``missing``, named on stderr, and
make the exit status 2; sizes that cannot be known without reading (``pipe:``, a server that
does not say) are shown as ``?``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..settings import human_size
from ..urls import redact
from .common import (
    OK,
    UNUSABLE,
    Input,
    Inputs,
    add_input_options,
    add_json_option,
    command_parser,
    emit_json,
    plural,
)

__all__ = ["Row", "add_parser", "cmd_ls", "list_shards"]

_SHOWN = 5  # missing shards named on stderr

_DESCRIPTION = """\
List shards with their sizes and a total, without reading them: local files are stat'ed,
buckets listed (one listing per directory, or one metadata request per shard for up to 3),
http(s) servers asked for each shard's first byte. A spec's shards are grouped by source.
Missing shards (e.g. of a brace pattern) are listed as "missing" and named on stderr (exit
status 2); sizes that cannot be known without reading the shard (pipe:, a server that does
not say) show as "?".

examples:
  wds-cloud ls 'shards/train-{000000..000099}.tar'
  wds-cloud ls 's3://bucket/train-*.tar' -o s3.endpoint_url=http://127.0.0.1:9000
  wds-cloud ls config/train.yaml --json"""


@dataclass(frozen=True)
class Row:
    """One listed shard: its input, and its size in bytes (None: unknown, or missing)."""

    shard: Input
    size: int | None
    missing: bool

    def as_dict(self) -> dict[str, Any]:
        return {"url": redact(self.shard.url), "source": self.shard.source,
                "size": self.size, "missing": self.missing}


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "ls", help="list shards with their sizes and a total",
                       description=_DESCRIPTION)
    add_input_options(p, what="shards to list")
    p.add_argument("-b", "--bytes", action="store_true",
                   help="print sizes in bytes rather than KiB/MiB/GiB")
    add_json_option(p)
    p.set_defaults(func=cmd_ls)


def list_shards(inputs: Inputs, shards: Sequence[Input]) -> list[Row]:
    """A :class:`Row` per shard, in order: sizes looked up with each shard's options."""
    from ..listing import Listings, shard_sizes

    listings: Listings = {}
    sizes: dict[int, int | None] = {}
    groups: dict[str, list[int]] = {}
    for i, shard in enumerate(shards):
        groups.setdefault(json.dumps(shard.options, sort_keys=True, default=str), []).append(i)
    for indexes in groups.values():
        options = shards[indexes[0]].options
        found = shard_sizes([shards[i].url for i in indexes], router=inputs.router(options),
                            listings=listings)
        sizes.update((i, found[shards[i].url]) for i in indexes if shards[i].url in found)
    return [Row(shard, sizes.get(i), i not in sizes) for i, shard in enumerate(shards)]


def _total(rows: Sequence[Row]) -> dict[str, Any]:
    nbytes = sum(r.size or 0 for r in rows)
    return {"shards": len(rows), "bytes": nbytes, "size": human_size(nbytes),
            "missing": sum(r.missing for r in rows),
            "unknown": sum(r.size is None and not r.missing for r in rows)}


def _summary(total: dict[str, Any], exact: bool) -> str:
    size = f"{total['bytes']:,} bytes" if exact else \
        f"{total['size']} ({total['bytes']:,} bytes)"
    text = f"{plural(total['shards'], 'shard')}, {size}"
    if total["missing"]:
        text += f"; {total['missing']:,} missing"
    if total["unknown"]:
        text += f"; {total['unknown']:,} of unknown size"
    return text


def _sources(rows: Sequence[Row]) -> list[tuple[str | None, list[Row]]]:
    """Consecutive rows of one source, grouped."""
    out: list[tuple[str | None, list[Row]]] = []
    for row in rows:
        if out and out[-1][0] == row.shard.source:
            out[-1][1].append(row)
        else:
            out.append((row.shard.source, [row]))
    return out


def _print(rows: Sequence[Row], exact: bool) -> None:
    def size(row: Row) -> str:
        if row.missing:
            return "missing"
        if row.size is None:
            return "?"
        return f"{row.size:,}" if exact else human_size(row.size)

    width = max(len(size(r)) for r in rows)
    for source, group in _sources(rows):
        indent = ""
        if source is not None:
            print(f"source {source!r}: {_summary(_total(group), exact)}")
            indent = "  "
        for row in group:
            print(f"{indent}{size(row):>{width}}  {redact(row.shard.url)}")
    print(f"total: {_summary(_total(rows), exact)}")


def cmd_ls(args: argparse.Namespace) -> int:
    inputs = Inputs.from_args(args)
    rows = list_shards(inputs, inputs.shards())
    if args.json:
        sources = [{"name": name, **_total(group)} for name, group in _sources(rows)
                   if name is not None]
        emit_json({"shards": [r.as_dict() for r in rows], "sources": sources,
                   "total": _total(rows)})
    else:
        _print(rows, args.bytes)
    missing = [redact(r.shard.url) for r in rows if r.missing]
    if missing:
        more = f", and {len(missing) - _SHOWN:,} more" if len(missing) > _SHOWN else ""
        print(f"wds-cloud ls: error: {len(missing):,} of {plural(len(rows), 'shard')} not "
              f"found: {', '.join(missing[:_SHOWN])}{more}", file=sys.stderr)
        return UNUSABLE
    return OK
