"""Epochs that count samples per source (mode ``"samples"``): Mosaic's ``proportion`` /
``repeat`` / ``choose`` and Energon's ``blend_epochized`` (and its validation splits).

Layer 2: no torch, no stores; what reads a shard is an argument, as in :mod:`.build`.

**Counts** (:func:`epoch_counts`, Mosaic's rules): with ``repeat`` a source gives
``int(repeat * N)`` samples per epoch (``N``: its samples), with ``choose`` (``samples``) that
many, with neither ``N``; with proportions, ``epoch_size`` (default the total of ``N``) is
shared by weight (or by size), rounded down, the shortfall given one each to sources drawn
from the seed.

**Which samples** (:func:`plan`): a source's epoch is ``count // N`` whole passes over its
shards plus the first ``count % N`` samples of one more pass, each pass a fresh permutation of
the shards from ``KeyedRandom(seed, epoch, -1, SHARDS, i)`` (listed order with
``shuffle: false``). The same on every rank.

**Who reads what** (:func:`deal`): each source's sequence is cut into one contiguous range per
slot (``rank * num_workers + worker``), the remainders handed out round-robin across sources
(rank by rank), so the slots' totals, and the ranks', differ by at most one sample. Within a
slot the next sample's source is drawn with probability proportional to what the source has
left in the slot
(``KeyedRandom(seed, epoch, slot, MIX)``): every sample of the plan exactly once, sources
mixed sample by sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from ..errors import ConfigError
from ..pipeline.epochs import EpochCounter
from ..pipeline.rng import MIX, SHARDS, KeyedRandom
from ..pipeline.shards import WorkerInfoSource, resolve_worker_info
from .build import SpecSource
from .extensions import ExtensionCheck
from .schema import DatasetSpec

__all__ = ["Piece", "SpecSampleEpochs", "deal", "epoch_counts", "plan"]

log = logging.getLogger(__name__)

Sample = dict[str, Any]
#: ``(shard index, first sample, end)``: samples ``first..end-1`` of a source's shard
Piece = tuple[int, int, int]


def epoch_counts(spec: DatasetSpec, totals: Sequence[int], seed: int) -> list[int]:
    """Samples per epoch of each source of ``spec``, whose sources hold ``totals`` samples."""
    sources = spec.sources
    if spec.shares == "counts":
        return [int(s.repeat * n) if s.repeat is not None
                else s.samples if s.samples is not None else n
                for s, n in zip(sources, totals, strict=True)]
    size = spec.epoch_size if spec.epoch_size is not None else sum(totals)
    weights = list(totals) if spec.shares == "size" else [s.weight for s in sources]
    total = float(sum(weights))
    if total <= 0:
        raise ConfigError(f"{spec.origin}: every source's share is zero")
    counts = [int(size * w / total) for w in weights]
    shortfall = size - sum(counts)
    for i in KeyedRandom(seed, 0, -1, MIX).sample(range(len(counts)), min(shortfall,
                                                                           len(counts))):
        counts[i] += 1
    return counts


def plan(counts_per_shard: Sequence[int], count: int, *, seed: int, epoch: int, source: int,
         shuffle: bool = True) -> list[Piece]:
    """The pieces a source reads in ``epoch`` to give ``count`` samples (module docstring)."""
    total = sum(counts_per_shard)
    if count and not total:
        raise ConfigError(f"source {source} has no samples, but {count} are asked for")
    rng = KeyedRandom(seed, epoch, -1, SHARDS, source)
    pieces: list[Piece] = []
    left = count
    while left > 0:
        order = list(range(len(counts_per_shard)))
        if shuffle:
            rng.shuffle(order)
        for j in order:
            n = counts_per_shard[j]
            if n <= 0:
                continue
            take = min(n, left)
            pieces.append((j, 0, take))
            left -= take
            if not left:
                break
    return pieces


def deal(pieces: Sequence[Sequence[Piece]], slots: int,
         ranks: int = 1) -> list[list[list[Piece]]]:
    """``out[slot][source]``: the contiguous part of each source's pieces that ``slot`` reads
    (module docstring). The remainders go round the slots rank by rank (rank 0's worker 0,
    rank 1's worker 0, ...), so that the ranks' totals, too, differ by at most one."""
    out: list[list[list[Piece]]] = [[] for _ in range(slots)]
    workers = slots // ranks
    turn = [(p % ranks) * workers + p // ranks for p in range(slots)]  # position -> slot
    offset = 0
    for source_pieces in pieces:
        count = sum(end - first for _, first, end in source_pieces)
        base, extra = divmod(count, slots)
        sizes = [base] * slots
        for p in range(offset, offset + extra):
            sizes[turn[p % slots]] += 1
        offset = (offset + extra) % slots
        it = iter(source_pieces)
        current: Piece | None = None
        for s in range(slots):
            mine: list[Piece] = []
            need = sizes[s]
            while need:
                if current is None:
                    current = next(it)
                j, first, end = current
                take = min(need, end - first)
                mine.append((j, first, first + take))
                need -= take
                current = (j, first + take, end) if first + take < end else None
            out[s].append(mine)
    return out


class SpecSampleEpochs(SpecSource):
    """The samples of a spec of mode ``"samples"`` (see the module docstring).

    ``urls[i]``, ``counts[i]``: the shards of source ``i`` and their samples. ``read(items,
    i)`` reads shard items of source ``i`` into samples. Samples carry ``__source__`` (and
    ``__subflavors__`` where the source has them) and keep only their source's
    ``extensions``.
    """

    def __init__(self, spec: DatasetSpec, urls: Sequence[Sequence[str]],
                 counts: Sequence[Sequence[int]], *, seed: int,
                 read: Callable[..., Iterator[Sample]], worker_info: WorkerInfoSource = None,
                 epochs: EpochCounter | None = None) -> None:
        super().__init__(spec, urls, seed=seed, worker_info=worker_info, epochs=epochs)
        self.counts = [list(c) for c in counts]
        self.read = read
        self.per_epoch = epoch_counts(spec, [sum(c) for c in self.counts], seed)

    def __len__(self) -> int:
        """Samples per epoch over all slots."""
        return sum(self.per_epoch)

    def __iter__(self) -> Iterator[Sample]:
        info = resolve_worker_info(self.worker_info)
        slots = info.world_size * info.num_workers
        slot = info.rank * info.num_workers + info.worker
        epoch = self.epochs.next(info.worker)
        self.position = (epoch, slot)
        pieces = [plan(c, n, seed=self.seed, epoch=epoch, source=i, shuffle=self.spec.shuffle)
                  for i, (c, n) in enumerate(zip(self.counts, self.per_epoch, strict=True))]
        mine = deal(pieces, slots, info.world_size)[slot]
        left = [sum(end - first for _, first, end in p) for p in mine]
        log.info("%s: epoch %d, slot %d: %d samples (%s)", self.spec.origin, epoch, slot,
                 sum(left), ", ".join(f"{s.name} {n}" for s, n in zip(self.spec.sources, left,
                                                                      strict=True)))
        check = ExtensionCheck(self.spec)
        readers = [self._pieces(i, p, check) for i, p in enumerate(mine)]
        rng = KeyedRandom(self.seed, epoch, slot, MIX)
        remaining = sum(left)
        try:
            while remaining:
                pick = rng.below(remaining)
                i = 0
                while pick >= left[i]:
                    pick -= left[i]
                    i += 1
                try:
                    sample = next(readers[i])
                except StopIteration:  # its shards gave fewer samples than counted (warned)
                    remaining -= left[i]
                    left[i] = 0
                    continue
                left[i] -= 1
                remaining -= 1
                yield sample
            check.finish()
        finally:
            for reader in readers:
                reader.close()

    def _pieces(self, i: int, pieces: list[Piece],
                check: ExtensionCheck) -> Generator[Sample, None, None]:
        source = self.spec.sources[i]
        wanted = set(source.extensions) if source.extensions is not None else None
        for j, first, end in pieces:
            url = self.urls[i][j]
            samples = self.read(iter([{"url": url}]), i)
            seen = 0
            try:
                for sample in samples:
                    if seen >= first:
                        if wanted is not None:
                            if check.active:
                                check.see(i, sample)
                            sample = {k: v for k, v in sample.items()
                                      if k.startswith("__") or k in wanted}
                        sample["__source__"] = source.name
                        if source.subflavors is not None:
                            sample["__subflavors__"] = source.subflavors
                        yield sample
                    seen += 1
                    if seen >= end:
                        break
            finally:
                close = getattr(samples, "close", None)
                if close is not None:
                    close()
            if seen < end:  # a handler skipped a damaged part, or the shard changed
                log.warning("%s: %s (%r): %s gave %d samples, but %d were counted for it "
                            "(damaged, or changed since it was counted or prepared?): this "
                            "epoch has %d fewer", self.spec.origin, source.key, source.name,
                            url, seen, self.counts[i][j], end - max(seen, first))

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, {sum(self.per_epoch)} samples per epoch)"
