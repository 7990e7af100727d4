"""The numbers of ``wds-cloud spec check``: one row per source, warnings, the mixing simulation,
and their plain-text table. No I/O here: what the listing and the one shard read per source
found comes in as :class:`Found`.

Estimates, per source (``share``: its expected share, with each ``scale`` at its midpoint):

- samples in the source: as an Energon-prepared dataset's ``.nv-meta`` says them (exact), else
  the samples of the one shard read (the smallest) scaled by bytes (``count * bytes /
  smallest``), or by the number of shards where sizes are unknown (``~`` marks an estimate);
- expected samples per epoch: ``share * world_size * epoch_batches * batch_size`` (a weighted
  mix), ``shards per epoch * samples per shard`` (webdataset's per-epoch shard lists), or the
  counts of Mosaic's / Energon's rules (a spec of mode ``"samples"``: exact when the sizes are);
- passes: expected samples per epoch / samples in the source;
- GET requests per epoch: the shards opened, one GET each (a shard's read is one streaming
  GET, plus one per resume or retry); in a mix every slot (rank x worker) reads its own
  stream of every source: per slot ``ceil(samples drawn from the source / samples per
  shard) + ahead``, the shards started and ``ahead``, the shards opened ahead of each stream
  when the epoch stops (read-ahead opens one while pre-reading does not pay, more on links
  slower than their reader; 0 with ``WDS_READAHEAD=0`` and for local files). The samples
  drawn are epoch 0's very draws (the mixing generator run without I/O, as ``--simulate``)
  for up to :data:`EXACT_DRAWS` samples per epoch; beyond, their expectation, with the shard
  under way half read on average: ``slots * (samples per slot / samples per shard + 1/2 +
  ahead)``;
- bytes read per epoch: GET requests * the mean shard size (whole shards: an upper bound).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..settings import human_size
from ..urls import redact, split_scheme
from .common import plural

if TYPE_CHECKING:
    from ..spec import DatasetSpec, SourceSpec

__all__ = ["Found", "Shape", "rows_of", "schedule_lines", "schedule_positions",
           "schedule_rows", "simulate", "simulation_lines", "table_lines", "warnings_of"]

TINY = 0.01  # an expected share under this is worth a warning
#: epochs of up to this many samples have their GETs counted from epoch 0's draws
EXACT_DRAWS = 4_000_000


@dataclass
class Found:
    """What listing a source and reading one of its shards found; ``urls`` None: not listed."""

    urls: list[str] | None = None
    sizes: dict[str, int | None] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    shard_read: str | None = None
    samples_read: int | None = None
    error: str | None = None
    #: samples in the source as the dataset says them (an Energon-prepared ``.nv-meta``)
    samples_known: int | None = None
    #: ``(key, why)`` read where the shards are but not used here (``.nv-meta/dataset.yaml``)
    notes: list[tuple[str, str]] = field(default_factory=list)
    #: the member extensions of the shard read (``shard_read``)
    extensions: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Shape:
    """The job the spec is checked for: ranks, DataLoader workers per rank, and per rank the
    batch size and batches per epoch (None: not given)."""

    world_size: int = 1
    workers: int = 1
    batch_size: int | None = None
    epoch_batches: int | None = None
    #: shards each stream of a remote source opens ahead of the one it reads (a GET each)
    ahead: int = 1

    @property
    def slots(self) -> int:
        """Streams read at once: ranks x workers (workers=0 reads in the rank's process)."""
        return self.world_size * max(self.workers, 1)

    @property
    def samples(self) -> int | None:
        """Samples per epoch over all ranks, when the epoch length is given."""
        if self.batch_size is None or self.epoch_batches is None:
            return None
        return self.world_size * self.epoch_batches * self.batch_size


def _drawn(spec: DatasetSpec, shape: Shape, seed: int) -> list[Counter[int]] | None:
    """Per slot, the samples of each source (by index) that epoch 0 of a mix draws, when
    the epoch's length is known and at most :data:`EXACT_DRAWS`."""
    total = shape.samples
    if total is None or total > EXACT_DRAWS:
        return None
    from ..spec.build import source_draws

    slots = shape.slots
    return [Counter(source_draws(spec, seed=seed, epoch=0, slot=slot,
                                 n=total // slots + (slot < total % slots)))
            for slot in range(slots)]


def _remote(pattern: str) -> bool:
    """Whether shards of ``pattern`` are read from a store (opened ahead: a GET each)."""
    return split_scheme(pattern)[0] not in ("", "file", "pipe")


def _shards(source: SourceSpec, found: Found) -> int | None:
    if found.urls is not None:
        return len(found.urls)
    return None if source.has_glob or source.is_directory else len(source.urls)


def _bytes(found: Found) -> int | None:
    if found.urls is None or not found.urls or any(found.sizes.get(u) is None
                                                   for u in found.urls):
        return None
    return sum(int(found.sizes[u] or 0) for u in found.urls)


def _samples(found: Found, nbytes: int | None, shards: int | None) -> int | None:
    """Samples in the source: as the dataset says them, else estimated from the one shard
    read."""
    if found.samples_known is not None:
        return found.samples_known
    if found.samples_read is None or found.shard_read is None or not shards:
        return None
    size = found.sizes.get(found.shard_read)
    if nbytes is not None and size:
        return round(found.samples_read * nbytes / size)
    return found.samples_read * shards


def _per_epoch(source: SourceSpec, shards: int | None) -> int | None:
    """A counted spec's shards per epoch from this source."""
    if source.resample is not None:
        return source.resample
    if source.choose is not None:
        return source.choose
    return shards


def _per_epoch_rule(spec: DatasetSpec, source: SourceSpec) -> str:
    """What a source of a spec of mode "samples" asks for per epoch."""
    if source.samples is not None:
        return f"choose {source.samples:,}"
    if source.repeat is not None:
        return f"repeat {source.repeat:g}"
    return {"proportion": f"proportion {source.weight:g}", "size": "by size"}.get(spec.shares,
                                                                                  "all")


def _epoch_counts(spec: DatasetSpec, totals: Sequence[int | None],
                  seed: int) -> list[int] | None:
    """Samples per epoch of each source of a spec of mode "samples", when all sizes are known
    (those the run would use exactly; estimates give estimates)."""
    if spec.mode != "samples" or any(t is None for t in totals):
        return None
    from ..spec.quota import epoch_counts

    return epoch_counts(spec, [int(t or 0) for t in totals], seed)


def rows_of(spec: DatasetSpec, found: Sequence[Found], shape: Shape,
            seed: int) -> list[dict[str, Any]]:
    """One row (a JSON-able dict) per source; None where a number cannot be known."""
    mixed = spec.mode == "mix"
    bounds = spec.probability_bounds() if mixed else {}
    realized = spec.probabilities(0, seed) if mixed else {}
    totals = [_samples(got, _bytes(got), _shards(source, got))
              for source, got in zip(spec.sources, found, strict=True)]
    counts = _epoch_counts(spec, totals, seed)
    drawn = _drawn(spec, shape, seed) if mixed else None
    rows = []
    for i, (source, got) in enumerate(zip(spec.sources, found, strict=True)):
        shards = _shards(source, got)
        nbytes = _bytes(got)
        samples = totals[i]
        per_shard = samples / shards if samples is not None and shards else None
        row: dict[str, Any] = {
            "name": source.name, "key": source.key, "pattern": redact(source.pattern),
            "listed": got.urls is not None, "shards": shards,
            "missing": [redact(u) for u in got.missing], "bytes": nbytes,
            "weight": source.weight, "scale": list(source.scale),
            "schedule": source.schedule.describe() if source.schedule is not None else None,
            "shard_read": redact(got.shard_read) if got.shard_read else None,
            "samples_in_shard_read": got.samples_read, "samples": samples,
            "samples_per_shard": per_shard, "error": got.error,
            "samples_known": got.samples_known is not None,
        }
        if source.subflavors is not None:
            row["subflavors"] = dict(source.subflavors)
        mean = nbytes / shards if nbytes is not None and shards else None
        expected: float | None
        if spec.mode == "samples":
            expected = counts[i] if counts is not None else None
            row["probability"] = (
                {"min": None, "expected": counts[i] / sum(counts), "max": None,
                 "epoch0": counts[i] / sum(counts)} if counts and sum(counts) else None)
            row["shards_per_epoch"] = None
            row["per_epoch"] = _per_epoch_rule(spec, source)
            gets = (math.ceil(expected / per_shard) + shape.slots
                    if expected is not None and per_shard else None)
        elif spec.counted:
            per_epoch = _per_epoch(source, shards)
            row["probability"] = None
            row["shards_per_epoch"] = per_epoch
            expected = per_epoch * per_shard if per_epoch is not None and per_shard else None
            gets = per_epoch
        else:
            low, share, high = bounds[source.name]
            row["probability"] = {"min": low, "expected": share, "max": high,
                                  "epoch0": realized[source.name]}
            row["shards_per_epoch"] = None
            expected = share * shape.samples if shape.samples is not None else None
            gets = None
            if expected is not None and per_shard:
                per_slot = expected / shape.slots
                ahead = shape.ahead if _remote(source.pattern) else 0
                if drawn is not None:
                    gets = sum(math.ceil(slot[i] / per_shard) + ahead
                               for slot in drawn if slot[i])
                else:
                    gets = (math.floor(shape.slots * (per_slot / per_shard + 0.5 + ahead) + 0.5)
                            if expected > 0 else 0)
        row["expected_samples"] = expected
        row["passes"] = expected / samples if expected is not None and samples else None
        row["gets"] = gets
        row["bytes_read"] = round(gets * mean) if gets is not None and mean is not None else None
        rows.append(row)
    return rows


def warnings_of(spec: DatasetSpec, rows: Sequence[dict[str, Any]], shape: Shape) -> list[str]:
    """What deserves a second look: sources repeated within an epoch, fewer shards than slots,
    tiny shares, sizes that could not be known. (Weights in a counted spec are no warning:
    the schema refuses them.)"""
    out: list[str] = []
    slots = (f"{plural(shape.slots, 'slot')} ({plural(shape.world_size, 'rank')} x "
             f"{plural(max(shape.workers, 1), 'worker')})")
    for row in rows:
        name = row["name"]
        if row["passes"] is not None and row["passes"] > 1:
            out.append(f"{name}: read {row['passes']:.1f} times per epoch (about "
                       f"{row['expected_samples']:,.0f} samples expected from about "
                       f"{row['samples']:,} in the source): its samples repeat within an epoch")
        if spec.mode == "mix" and row["shards"] is not None and 0 < row["shards"] < shape.slots:
            out.append(f"{name}: {plural(row['shards'], 'shard')} for {slots}: every slot "
                       "reads every source, so slots read the same shards at the same time; "
                       "split the source into more shards")
        share = row["probability"]["expected"] if row["probability"] else None
        scheduled = next(s for s in spec.sources if s.name == name).schedule is not None
        if scheduled:
            pass  # its share changes over training: the schedule's table shows it
        elif share is not None and share == 0:
            out.append(f"{name}: weight 0: it is never read")
        elif share is not None and share < TINY:
            out.append(f"{name}: expected share {share:.2%} is under {TINY:.0%}: is the weight "
                       f"{row['weight']:g} meant?")
        if row["listed"] and row["shards"] and row["bytes"] is None and not row["error"]:
            out.append(f"{name}: shard sizes are unknown for {row['pattern'].split(':')[0]}: "
                       "URLs without reading them; samples estimated as the shard read times "
                       "the number of shards")
    if spec.counted:
        total = sum(r["shards_per_epoch"] or 0 for r in rows)
        if all(r["shards_per_epoch"] is not None for r in rows) and total < shape.slots:
            out.append(f"an epoch has {plural(total, 'shard')} for {slots}: some slots read "
                       "nothing")
    return out


def simulate(spec: DatasetSpec, *, seed: int, slots: int, n: int,
             batch_size: int | None = None) -> dict[str, Any]:
    """Run only the mixing RNG: ``n`` source draws in each of ``slots`` slots in epoch 0
    (exactly the runtime's draws, no I/O); observed shares next to the realized ones (with
    weight schedules, their mean over the draws)."""
    from ..spec.build import source_draws
    from ..spec.schedule import Clock

    clock = Clock(slots, None, batch_size)
    counts: Counter[int] = Counter()
    for slot in range(slots):
        counts.update(source_draws(spec, seed=seed, epoch=0, slot=slot, n=n, clock=clock))
    realized = spec.probabilities(0, seed)
    if spec.schedule_by is not None:
        realized = _mean_shares(spec, seed, clock, n)
    total = n * slots
    observed = [counts[i] / total if total else 0.0 for i in range(len(spec.sources))]
    sources = [{"name": s.name, "realized": realized[s.name], "observed": observed[i],
                "count": counts[i]} for i, s in enumerate(spec.sources)]
    worst = max((abs(observed[i] - realized[s.name]) for i, s in enumerate(spec.sources)),
                default=0.0)
    return {"epoch": 0, "seed": seed, "slots": slots, "samples_per_slot": n, "samples": total,
            "sources": sources, "max_difference": worst}


def _mean_shares(spec: DatasetSpec, seed: int, clock: Any, n: int) -> dict[str, float]:
    """The shares of a scheduled spec averaged over ``n`` draws per slot, block by block as
    the mix evaluates them."""
    from ..spec.build import _BLOCK

    by = spec.schedule_by or "samples"
    total = dict.fromkeys((s.name for s in spec.sources), 0.0)
    for start in range(0, n, _BLOCK):
        size = min(_BLOCK, n - start)
        at = clock.position(by, 0, start + _BLOCK / 2)
        for name, share in spec.probabilities(0, seed, at=at).items():
            total[name] += share * size / n
    return total


def schedule_positions(spec: DatasetSpec, count: int = 6) -> list[int]:
    """Where ``spec check`` shows a scheduled spec's shares: 0, the schedules' points and
    ``count`` positions evenly spread up to the last point (with many points: the first
    ``count - 1`` and the last)."""
    points = sorted({x for s in spec.sources if s.schedule is not None
                     for x, _ in s.schedule.points} | {0})
    last = points[-1]
    if len(points) >= count or not last:
        return [*points[:count - 1], last] if len(points) > count else points
    even = {round(last * k / (count - 1)) for k in range(count)}
    return sorted(set(points) | even)


def schedule_rows(spec: DatasetSpec, seed: int, positions: Sequence[int]) -> dict[str, Any]:
    """The shares (epoch 0) at ``positions`` of the weight schedules, per source."""
    shares = [spec.probabilities(0, seed, at=x) for x in positions]
    return {"by": spec.schedule_by, "positions": list(positions),
            "shares": {s.name: [row[s.name] for row in shares] for s in spec.sources}}


def schedule_lines(sched: dict[str, Any]) -> list[str]:
    """The shares at each position as a table, one row per source."""
    unit = {"samples": "samples", "step": "steps"}[sched["by"]]
    header = ["source", *(f"{x:,}" for x in sched["positions"])]
    body = [[name, *map(_pct, shares)] for name, shares in sched["shares"].items()]
    return [f"weight schedules: shares at {unit} (over all ranks and workers; epoch 0)",
            *_table(header, body, left={0})]


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}"


def _size(value: int | None) -> str:
    return "?" if value is None else human_size(value)


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _scale(scale: Sequence[float]) -> str:
    lo, hi = scale
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def _line(cells: Sequence[str], widths: Sequence[int], left: set[int]) -> str:
    return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()


def _table(header: Sequence[str], body: Sequence[Sequence[str]], left: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return [_line(header, widths, left)] + [_line(r, widths, left) for r in body]


def table_lines(spec: DatasetSpec, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows as an aligned plain-text table ("?": unknown, "-": not given)."""
    def per_epoch(row: dict[str, Any]) -> list[str]:
        passes = row["passes"]
        return [_count(row["expected_samples"]) if row["expected_samples"] is not None else "-",
                f"{passes:.2f}" if passes is not None else "-",
                _count(row["gets"]) if row["gets"] is not None else "-",
                _size(row["bytes_read"]) if row["bytes_read"] is not None else "-"]

    exact = all(row["samples_known"] for row in rows)  # else "~": estimated
    first = ["source", "shards", "size", "samples" if exact else "samples~"]
    with_flavors = any(s.subflavors for s in spec.sources)
    last = ["samples/epoch", "passes", "GETs", "read/epoch", "pattern"]
    body = []
    for row in rows:
        shards = _count(row["shards"])
        if row["missing"]:
            shards += f" of {row['shards'] + len(row['missing'])}"
        cells = [row["name"], shards, _size(row["bytes"]), _count(row["samples"])]
        if spec.mode == "samples":
            p = row["probability"]
            cells += [row["per_epoch"], _pct(p["expected"]) if p else "?"]
        elif spec.counted:
            source = next(s for s in spec.sources if s.name == row["name"])
            mode = (f"resample {source.resample}" if source.resample is not None else
                    f"choose {source.choose}" if source.choose is not None else "all")
            cells += [mode, _count(row["shards_per_epoch"])]
        else:
            p = row["probability"]
            source = next(s for s in spec.sources if s.name == row["name"])
            weight = source.schedule.kind if source.schedule is not None else f"{row['weight']:g}"
            cells += [weight, _scale(row["scale"]),
                      f"{_pct(p['min'])} / {_pct(p['expected'])} / {_pct(p['max'])}",
                      _pct(p["epoch0"])]
        flavors = row.get("subflavors")
        extra = ([", ".join(f"{k}={v}" for k, v in flavors.items()) if flavors else "-"]
                 if with_flavors else [])
        body.append(cells + per_epoch(row) + extra + [row["pattern"]])
    middle = (["per epoch", "share"] if spec.mode == "samples" else
              ["mode", "shards/epoch"] if spec.counted else
              ["weight", "scale", "share min / expected / max", "epoch 0"])
    header = first + middle + last[:-1] + (["subflavors"] if with_flavors else []) + last[-1:]
    return _table(header, body, left={0, len(header) - 1})


def simulation_lines(sim: dict[str, Any]) -> list[str]:
    """The simulation as text: observed next to realized shares."""
    head = (f"simulation: {sim['samples_per_slot']:,} draws per slot x "
            f"{plural(sim['slots'], 'slot')} = {sim['samples']:,} (epoch {sim['epoch']}, "
            f"seed {sim['seed']}; mixing RNG only)")
    body = [[s["name"], _pct(s["realized"]), _pct(s["observed"]),
             f"{100 * (s['observed'] - s['realized']):+.2f}", f"{s['count']:,}"]
            for s in sim["sources"]]
    lines = _table(["source", "realized", "observed", "diff (pts)", "draws"], body, left={0})
    return [head, *lines, f"largest difference: {100 * sim['max_difference']:.2f} points"]
