"""Auditing tar shards: what breaks grouping members into samples as the writer meant.

:func:`audit_shard` reads one shard into a :class:`ShardAudit`: samples, members, extensions
(how many samples have each), member sizes, and the anomalies found in it;
:func:`cross_shard_anomalies` compares the audits of a shard set. Offsets are in the
uncompressed tar bytes (entries are read with :class:`~.entries.TarEntries`). Nothing here
prints; a truncated or corrupt shard is an anomaly, not
an exception (``OSError`` from the stream passes through).

Anomalies (:attr:`Anomaly.kind`) and why they matter to a WebDataset reader, which groups
adjacent members by key (the name up to the basename's first dot):

- ``corrupt``: truncated or corrupt data; reading stops there.
- ``empty``: no members at all.
- ``non-regular``: a directory, symlink, hard link, device or fifo; readers skip it.
- ``no-extension``: a file name without a dot in its basename; readers drop it.
- ``duplicate-key``: a member (key and extension) found twice in a shard: the sample is
  written twice, or a reader fails on the repeated extension.
- ``non-adjacent``: members of one key separated by other keys (``a.jpg b.jpg a.txt``):
  readers yield two partial samples.
- ``extra-dots``: a name whose extension has a dot (``photo.2021.jpg``: key ``photo``,
  extension ``2021.jpg``) that is rare: fewer than half of the shard's samples, or of its
  members with the same last suffix (``.jpg``), have it. A dot meant as part of the key
  (``img.001.jpg``, ``img.002.jpg`` collapse into one sample). Extensions such as
  ``seg.png`` that most samples carry are intended, and not flagged.
- ``compression``: the data is compressed otherwise than the name says (a ``.tar`` holding
  gzip data).
- ``split-sample``: the last key of a shard is the first key of the next one.
- ``key-in-two-shards``: the same key in two shards (elsewhere than across a boundary).
- ``mixed-compression``: a shard set with compressed and plain shards (by name or data).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from ..errors import ShardFormatError
from ..urls import redact
from .entries import TYPES, Entry, TarEntries, compression_of_name
from .header import padded
from .samples import base_plus_ext

__all__ = [
    "KINDS",
    "LIMIT",
    "Anomaly",
    "ShardAudit",
    "audit_shard",
    "cross_shard_anomalies",
    "size_percentiles",
]

#: anomalies of one kind kept per shard (all are counted)
LIMIT = 20
#: the anomaly kinds, in the order reports list them
KINDS = ("corrupt", "empty", "compression", "non-regular", "no-extension", "duplicate-key",
         "non-adjacent", "extra-dots", "split-sample", "key-in-two-shards", "mixed-compression")
#: the percentiles of member sizes a report gives
PERCENTILES = {"p0": 0, "p50": 50, "p90": 90, "p99": 99, "max": 100}

_META = re.compile(r"__[^/]*__($|/)")
_EXAMPLES = 3  # keys named in a key-in-two-shards anomaly
_WHERE = re.compile(r" \(url=.*\)$", re.S)
#: :class:`~.entries.TarEntries`' message for a member the stream ends in
_CUT_MEMBER = re.compile(r"truncated member: (\d+) bytes of data expected at offset (\d+)")


@dataclass(frozen=True)
class Anomaly:
    """Something in a shard (or a shard set: ``url`` None) that a reader would not group as
    the writer meant; ``member`` and ``offset`` say where, when known."""

    kind: str
    url: str | None
    message: str
    member: str | None = None
    offset: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "member": self.member,
                "offset": self.offset, "message": self.message}


def size_percentiles(sizes: np.ndarray) -> dict[str, int]:
    """``{"p0", "p50", "p90", "p99", "max"}`` of ``sizes`` (sizes that occur; {} if none)."""
    if not len(sizes):
        return {}
    values = np.percentile(sizes, list(PERCENTILES.values()), method="inverted_cdf")
    return {name: int(v) for name, v in zip(PERCENTILES, values, strict=True)}


@dataclass
class ShardAudit:
    """What :func:`audit_shard` found in one shard. ``extensions``: samples having each
    extension (lower-cased, as readers give them); ``sizes``: member sizes per extension;
    ``anomalies``: the first :data:`LIMIT` of each kind, ``counts``: all of them per kind."""

    url: str
    compression: str = ""
    entries: int = 0
    members: int = 0
    samples: int = 0
    nbytes: int = 0
    extensions: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, np.ndarray] = field(default_factory=dict)
    anomalies: list[Anomaly] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    first_key: str | None = None
    last_key: str | None = None
    #: ``hash()`` of each distinct key, aligned with :meth:`keys` (compared in-process only)
    key_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _keys: str = ""
    _kept: Counter[str] = field(default_factory=Counter, repr=False)

    def add(self, kind: str, message: str, member: str | None = None,
            offset: int | None = None, count: int = 1) -> None:
        self.counts[kind] += count
        self._kept[kind] += 1
        if self._kept[kind] <= LIMIT:
            self.anomalies.append(Anomaly(kind, redact(self.url), message, member, offset))

    def keys(self) -> list[str]:
        """The distinct keys, in order of first appearance."""
        return self._keys.split("\0") if self._keys else []

    def percentiles(self) -> dict[str, dict[str, int]]:
        return {ext: size_percentiles(s) for ext, s in sorted(self.sizes.items())}


def audit_shard(stream: BinaryIO, *, url: str = "") -> ShardAudit:
    """Read the shard in ``stream`` to the end (or to where it is corrupt) and audit it."""
    entries = TarEntries(stream, url=url)
    audit = ShardAudit(url, compression=entries.compression)
    named = compression_of_name(url)
    if named != audit.compression:
        audit.add("compression", f"the name says {named or 'plain tar'} but the data is "
                  f"{audit.compression or 'plain tar'}", offset=0)
    grouper = _Grouper(audit)
    try:
        for entry in entries:
            grouper.entry(entry)
    except ShardFormatError as exc:
        audit.add("corrupt", *_corrupt(exc, entries.offset))
    grouper.finish()
    return audit


def _corrupt(exc: ShardFormatError, end: int) -> tuple[str, str | None, int | None]:
    """The message, member and offset of a ``corrupt`` anomaly; ``end``: where the stream
    ended. A member whose data is all there but whose padding is cut short is whole: the
    archive is cut after it, and says so (the entries say "N bytes of data expected")."""
    message = _WHERE.sub("", str(exc))
    cut = _CUT_MEMBER.match(message)
    if cut is None:
        return message, exc.member, exc.offset
    size, data_at = int(cut.group(1)), int(cut.group(2))
    if end - data_at < size:
        return message, exc.member, exc.offset
    return (f"the archive is cut at offset {end}, in the padding after {exc.member!r}, which "
            f"is whole ({size:,} bytes of data at offset {data_at}): "
            f"{padded(size) - (end - data_at)} bytes of padding and the end-of-archive blocks "
            "are missing (a shard cut short, e.g. by an interrupted copy or upload)",
            exc.member, exc.offset)


class _Grouper:
    """Groups entries into samples as readers do, and notes what does not group cleanly."""

    def __init__(self, audit: ShardAudit) -> None:
        self.audit = audit
        self.seen: dict[str, int] = {}  # "key.ext" -> offset
        self.starts: dict[str, int] = {}  # key -> offset where its first run starts
        self.key: str | None = None
        self.run_exts: set[str] = set()
        self.resumed = False
        self.sizes: dict[str, list[int]] = {}
        self.dotted: dict[str, list[tuple[str, int]]] = {}

    def entry(self, e: Entry) -> None:
        a = self.audit
        a.entries += 1
        if not e.regular:
            what = TYPES.get(e.type, f"entry of type {e.type!r}")
            target = f" -> {e.linkname!r}" if e.linkname and e.type in "12" else ""
            a.add("non-regular", f"a {what}{target}: readers skip it", e.name, e.offset)
            return
        if _META.match(e.name):
            return  # webdataset's metadata members, skipped by readers
        key, ext = base_plus_ext(e.name)
        if key is None or ext is None:
            a.add("no-extension", "no extension (no dot in the basename): readers drop it",
                  e.name, e.offset)
            return
        ext = ext.lower()
        a.members += 1
        a.nbytes += e.size
        self.sizes.setdefault(ext, []).append(e.size)
        if key != self.key:
            self._new_run(key, e)
        name = f"{key}.{ext}"
        if name in self.seen:
            a.add("duplicate-key", f"sample {key!r} has a second {ext!r} member (the first at "
                  f"offset {self.seen[name]})", e.name, e.offset)
        elif self.resumed:
            a.add("non-adjacent", f"members of sample {key!r} are not adjacent: it starts at "
                  f"offset {self.starts[key]}, other samples come between", e.name, e.offset)
            self.resumed = False
        self.seen[name] = e.offset
        if ext not in self.run_exts:
            self.run_exts.add(ext)
            a.extensions[ext] = a.extensions.get(ext, 0) + 1
        if "." in ext:
            examples = self.dotted.setdefault(ext, [])
            if len(examples) < LIMIT:
                examples.append((e.name, e.offset))

    def _new_run(self, key: str, e: Entry) -> None:
        a = self.audit
        self.key, self.run_exts = key, set()
        a.samples += 1
        self.resumed = key in self.starts
        if not self.resumed:
            self.starts[key] = e.offset
        if a.first_key is None:
            a.first_key = key

    def finish(self) -> None:
        a = self.audit
        a.last_key = self.key
        a.sizes = {ext: np.array(s, np.int64) for ext, s in self.sizes.items()}
        keys = list(self.starts)
        a._keys = "\0".join(keys)
        a.key_hashes = np.fromiter((hash(k) for k in keys), np.int64, len(keys))
        if not a.entries and not a.counts["corrupt"]:
            a.add("empty", "no members: readers yield nothing from this shard", offset=0)
        self._extra_dots()

    def _extra_dots(self) -> None:
        a = self.audit
        suffixes = Counter[str]()
        for ext, s in self.sizes.items():
            suffixes[ext.rsplit(".", 1)[-1]] += len(s)
        for ext, examples in sorted(self.dotted.items()):
            count, last = len(self.sizes[ext]), ext.rsplit(".", 1)[-1]
            if 2 * count >= max(a.samples, suffixes[last]):
                continue
            for i, (name, offset) in enumerate(examples):
                key = name[:len(name) - len(ext) - 1]
                a.add("extra-dots", f"reads as key {key!r} with extension {ext!r}, which only "
                      f"{count} of {a.samples} samples have: is a dot meant as part of the key?",
                      name, offset, count=count if i == 0 else 0)


def cross_shard_anomalies(audits: Sequence[ShardAudit | None], *, urls: Sequence[str] = ()
                          ) -> tuple[list[Anomaly], Counter[str]]:
    """What the shards of a set have wrong together: samples split across consecutive shards,
    keys in two shards, mixed compression (by the names of ``urls``, every shard of the set,
    read or not; else by the data of ``audits``). ``audits`` in the set's order, None for a
    shard not read (its neighbours are then not consecutive).

    Returns the anomalies (one per pair of shards and kind, naming the keys or how many) and
    the count of each kind."""
    counts = Counter[str]()
    read = [a for a in audits if a is not None]
    position = [i for i, a in enumerate(audits) if a is not None]
    found = list(_shared_keys(read, position, counts))
    for how, groups in (("names", _by_compression(urls)),
                        ("data", _by_compression([a.url for a in read],
                                                 [a.compression for a in read]))):
        if len(groups) > 1:
            parts = ", ".join(f"{len(g)} {kind} (e.g. {redact(g[0])})"
                              for kind, g in sorted(groups.items()))
            found.append(Anomaly("mixed-compression", None,
                                 f"shards of one set differ in compression (by {how}): {parts}"))
            counts["mixed-compression"] += 1
            break
    return found, counts


def _by_compression(urls: Sequence[str], kinds: Sequence[str] | None = None
                    ) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for i, url in enumerate(urls):
        kind = kinds[i] if kinds is not None else compression_of_name(url)
        groups.setdefault(kind or "plain tar", []).append(url)
    return groups


def _shared_keys(audits: Sequence[ShardAudit], position: Sequence[int], counts: Counter[str]
                 ) -> Iterator[Anomaly]:
    """Keys found in two shards: a split sample where a shard's last key starts the next one,
    else one anomaly per pair of shards naming a few of their keys. Keys are compared by
    hash, then by name (a hash collision is no anomaly)."""
    if len(audits) < 2:
        return
    hashes = np.concatenate([a.key_hashes for a in audits])
    owner = np.repeat(np.arange(len(audits)), [len(a.key_hashes) for a in audits])
    index = np.concatenate([np.arange(len(a.key_hashes)) for a in audits])
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    later, first = order[same + 1], order[same]
    by = np.lexsort((index[later], owner[later]))  # in the set's order
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s2, i2, s1, i1 in zip(owner[later][by].tolist(), index[later][by].tolist(),
                              owner[first][by].tolist(), index[first][by].tolist(), strict=True):
        if s1 != s2:
            groups.setdefault((s2, s1), []).append((i2, i1))
    names: dict[int, list[str]] = {}
    for (s2, s1), pairs in groups.items():
        for s in (s1, s2):
            if s not in names:
                names[s] = audits[s].keys()
        keys = [names[s2][i2] for i2, i1 in pairs if names[s2][i2] == names[s1][i1]]
        yield from _pair_anomalies(audits[s1], audits[s2],
                                   position[s2] == position[s1] + 1, keys, counts)


def _pair_anomalies(first: ShardAudit, later: ShardAudit, consecutive: bool, keys: list[str],
                    counts: Counter[str]) -> Iterator[Anomaly]:
    """The anomalies of ``keys``, found in both ``first`` and ``later``."""
    if consecutive and first.last_key in keys and first.last_key == later.first_key:
        counts["split-sample"] += 1
        keys = [k for k in keys if k != first.last_key]
        yield Anomaly("split-sample", redact(later.url),
                      f"sample {first.last_key!r} is split: it ends {redact(first.url)} and "
                      "starts this shard (readers yield two partial samples)", offset=0)
    if keys:
        counts["key-in-two-shards"] += 1
        shown = ", ".join(repr(k) for k in keys[:_EXAMPLES]) + (", ..." if len(keys) >
                                                                 _EXAMPLES else "")
        what = f"key {keys[0]!r} is" if len(keys) == 1 else f"{len(keys):,} keys are"
        yield Anomaly("key-in-two-shards", redact(later.url),
                      f"{what} also in {redact(first.url)}"
                      + (f": {shown}" if len(keys) > 1 else ""))
