"""A dataset spec as a pipeline source: the sample-level mix, and webdataset's per-epoch lists.

Layer 2: no torch, no stores. What reads shards is an argument (``read``: shard items in,
samples out), bound by the composition root (:mod:`wds_cloud.dataset`) to the router.

**The mix** (:class:`SpecMix`, a spec with weights): each slot, ``slot = rank * num_workers +
worker``, reads every source as an endless stream of shards, a fresh permutation of the source's
shards per pass (``KeyedRandom(seed, epoch, slot, SHARDS, i)``), so a small source never runs
dry; the source of each output sample is drawn from ``spec.probabilities(epoch, seed)`` with
``KeyedRandom(seed, epoch, slot, MIX)``. Samples carry ``__source__``. The stream of a slot is
a pure function of (seed, epoch, rank, worker, num_workers), and of the shards' contents.

**Per-epoch shard lists** (mode ``"shards"``: webdataset's ``resample: k`` / ``choose: n``, or
every shard once): :func:`epoch_shards` lists an epoch's shards, the same on every rank, in
webdataset 1.0.2's order for the seed ``seed + epoch``: per source ``k`` drawn with replacement,
``n`` without, or all of them; then shuffled together.
:class:`SpecEpochShards` deals that list to the slots; :class:`SpecShardMix` is webdataset's
``MultiShardSample`` (the whole list, or for a weighted spec an endless shard-level mix, left to
the pipeline's splitters).

Epoch numbers come from an :class:`~wds_cloud.pipeline.epochs.EpochCounter`: ``set_epoch(e)``,
and every new iteration advances the epoch.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..pipeline.core import PipelineStage
from ..pipeline.epochs import EpochCounter
from ..pipeline.filters import buffer_shuffle, check_bufsize
from ..pipeline.rng import MIX, SHARDS, SHUFFLE, KeyedRandom, PythonRandom
from ..pipeline.shards import WorkerInfoSource, resolve_worker_info
from ..pipeline.shufflestate import ResumableShuffle
from ..pipeline.state import Ref, ResumeBook, refetch, track_shards
from ..tar.shardloop import ShardCursor
from .extensions import ExtensionCheck
from .schedule import Clock
from .schema import DatasetSpec

__all__ = [
    "SpecEpochShards",
    "SpecMix",
    "SpecShardMix",
    "SpecShuffle",
    "SpecSource",
    "epoch_shards",
    "keep_extensions",
    "source_draws",
]

log = logging.getLogger(__name__)

Sample = dict[str, Any]
#: reads shard items (``{"url": ...}``) of source ``i`` into samples
Reader = Callable[..., Iterator[Sample]]

_BLOCK = 256  # source draws made at a time (the stream does not depend on it)


def _cumulative(spec: DatasetSpec, epoch: int, seed: int) -> np.ndarray[Any, Any]:
    probs = np.array(list(spec.probabilities(epoch, seed).values()), dtype=np.float64)
    cumulative = np.cumsum(probs)
    cumulative[-1] = 1.0
    return cumulative


def _shares(spec: DatasetSpec, epoch: int, seed: int,
            clock: Clock) -> Callable[[int], np.ndarray[Any, Any]] | None:
    """For a spec with weight schedules: the cumulative shares of the block of draws that
    starts after ``n`` draws of the slot (the schedule at the block's middle); else None."""
    by = spec.schedule_by
    if by is None:
        return None
    factors = spec.scale_factors(epoch, seed)

    def at(n: int) -> np.ndarray[Any, Any]:
        position = clock.position(by, epoch, n + _BLOCK / 2)
        weights = np.array([s.weight_at(position) * f
                            for s, f in zip(spec.sources, factors, strict=True)])
        cumulative = np.cumsum(weights / weights.sum())
        cumulative[-1] = 1.0
        return cumulative

    return at


def source_draws(spec: DatasetSpec, *, seed: int, epoch: int, slot: int, n: int,
                 clock: Clock | None = None) -> list[int]:
    """The first ``n`` source indices the mix of ``slot`` draws in ``epoch``: exactly the
    runtime's draws (for ``wds-cloud spec check --simulate``), with no I/O; ``clock``: the
    job's shape, for weight schedules."""
    rng = KeyedRandom(seed, epoch, slot, MIX)
    shares = _shares(spec, epoch, seed, clock or Clock())
    if shares is None:
        return [int(i) for i in rng.choose(_cumulative(spec, epoch, seed), n)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choose(shares(len(out)), _BLOCK).tolist()
    return out[:n]


def keep_extensions(sample: Sample, extensions: Sequence[str] | None) -> Sample:
    """``sample`` with only the members whose extension is one of ``extensions`` (and the
    ``__key__``-style metadata); ``None`` keeps all."""
    if extensions is None:
        return sample
    wanted = set(extensions)
    return {k: v for k, v in sample.items() if k.startswith("__") or k in wanted}


def _passes(urls: Sequence[str], rng: KeyedRandom, what: str) -> Iterator[str]:
    """``urls`` endlessly, a fresh permutation per pass."""
    if not urls:
        raise ConfigError(f"{what} has no shards")
    while True:
        order = list(urls)
        rng.shuffle(order)
        yield from order


class SpecSource:
    """What the spec-driven sources share: the spec, the URLs, the seed, the epochs, the
    position of the iteration under way."""

    def __init__(self, spec: DatasetSpec, urls: Sequence[Sequence[str]], *, seed: int,
                 worker_info: WorkerInfoSource = None,
                 epochs: EpochCounter | None = None) -> None:
        if len(urls) != len(spec.sources):
            raise ConfigError(f"{len(urls)} URL lists for {len(spec.sources)} sources")
        for source, found in zip(spec.sources, urls, strict=True):
            if not found:
                raise ConfigError(f"{spec.origin}: {source.key} ({source.name!r}): "
                                  f"{source.pattern!r} matches no shards")
        self.spec = spec
        self.urls = [list(u) for u in urls]
        self.seed = seed
        self.worker_info = worker_info
        self.epochs = epochs if epochs is not None else EpochCounter()
        #: (epoch, slot) of the iteration under way in this process, for :class:`SpecShuffle`
        self.position: tuple[int, int] | None = None

    #: the resumable state of the dataset this source belongs to (set by the dataset)
    book: ResumeBook | None = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration (in every DataLoader worker) epoch ``epoch``."""
        self.epochs.set(epoch)

    def _epoch(self, worker: int) -> int:
        """The epoch of the iteration starting now (the saved one when resuming)."""
        book = self.book
        saved = -1 if book is None else int(book.get("epoch", -1))
        if saved >= 0:
            self.epochs.resume(worker, saved)
        epoch = self.epochs.next(worker)
        if book is not None:
            book.epoch = epoch
        return epoch

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.spec.origin}, {len(self.spec.sources)} sources, "
                f"seed={self.seed})")


class SpecMix(SpecSource):
    """The sample-level mix of a weighted spec (see the module docstring).

    ``urls[i]``: the shard URLs of ``spec.sources[i]`` (globs listed). ``read(items, i)``
    turns shard items of source ``i`` into samples. ``worker_info``: where this runs.
    """

    def __init__(self, spec: DatasetSpec, urls: Sequence[Sequence[str]], *, seed: int,
                 read: Reader, worker_info: WorkerInfoSource = None,
                 epochs: EpochCounter | None = None) -> None:
        if spec.mode != "mix":
            raise ConfigError(f"{spec.origin}: a spec of mode {spec.mode!r} is not mixed by "
                              "weight (SpecEpochShards, SpecSampleEpochs read it)")
        super().__init__(spec, urls, seed=seed, worker_info=worker_info, epochs=epochs)
        self.read = read

    #: ``(samples per epoch over all ranks, batch size)`` where the pipeline knows them, for
    #: weight schedules (:class:`~wds_cloud.spec.schedule.Clock`; set by the dataset)
    shape: tuple[int | None, int | None] = (None, None)
    #: ``count(names, counts)``: told the samples each source gave (``counts[i]`` for
    #: ``names[i]``) after each block of draws and at the end, counted from the block's
    #: draws, not per sample (per-source statistics; set by the composition root)
    count: Callable[[Sequence[str], list[int]], None] | None = None

    def __iter__(self) -> Iterator[Sample]:
        info = resolve_worker_info(self.worker_info)
        slot = info.rank * info.num_workers + info.worker
        epoch = self._epoch(info.worker)
        self.position = (epoch, slot)
        cumulative = _cumulative(self.spec, epoch, self.seed)
        log.info("%s: epoch %d, slot %d (rank %d/%d, worker %d/%d), shares %s",
                 self.spec.origin, epoch, slot, info.rank, info.world_size, info.worker,
                 info.num_workers, self.spec.probabilities(epoch, self.seed))
        n = len(self.spec.sources)
        sources: list[_SourceStream | None] = [None] * n
        takes: list[Callable[[], Sample] | None] = [None] * n  # each source's __next__
        cursors = [ShardCursor() for _ in range(n)]
        names = [source.name for source in self.spec.sources]
        flavors = [source.subflavors for source in self.spec.sources]
        filtered = any(source.extensions is not None for source in self.spec.sources)
        check = ExtensionCheck(self.spec)
        rng = KeyedRandom(self.seed, epoch, slot, MIX)
        shares = _shares(self.spec, epoch, self.seed,
                         Clock(info.world_size * info.num_workers, *self.shape))
        book = self.book
        drawn = [0, 0]  # samples drawn, and the source of the last one
        skip = 0
        tell = self.count
        offset = 0  # draws skipped at the start of the block under way (a restore)
        self._keys = list(range(n))  # what each source's shard permutation is keyed by
        if book is not None:
            from .remix import source_keys

            drawn[0] = int(book.get("mix.n", 0))
            skip = drawn[0] % _BLOCK
            rng.skip(drawn[0] - skip)
            book.part("mix.", lambda: {"mix.n": drawn[0], "mix.last": drawn[1]})
            self._keys = [int(book.get(f"src.{i}.key", i)) for i in range(n)]  # (a remix)
            named = source_keys(self.spec, self.urls, self._keys)
            book.part("names.", lambda: named)
            self._last = (cursors, drawn)
        begin, draws = drawn[0], np.zeros(0, dtype=np.intp)  # the block under way
        try:
            while True:
                if shares is not None:  # the schedule's weights, once per block
                    cumulative = shares(drawn[0] - skip)
                draws = rng.choose(cumulative, _BLOCK)
                block = draws.tolist()
                begin, offset = drawn[0], skip
                if skip:
                    block, skip = block[skip:], 0
                for i in block:  # the hot loop: one draw, one sample
                    take = takes[i]
                    if take is None:
                        opened = sources[i] = self._source(i, epoch, slot, cursors[i])
                        take = takes[i] = opened.samples.__next__
                    try:
                        sample = take()
                    except StopIteration:
                        raise ConfigError(f"{self._what(i)}: the reader stopped (its handler "
                                          "said stop)") from None
                    if filtered:
                        if check.active:
                            check.see(i, sample)
                        sample = keep_extensions(sample, self.spec.sources[i].extensions)
                    sample["__source__"] = names[i]
                    if flavors[i] is not None:
                        sample["__subflavors__"] = flavors[i]
                    drawn[0] += 1
                    drawn[1] = i
                    yield sample
                for stream, count in zip(sources, np.bincount(draws, minlength=n).tolist(),
                                         strict=True):
                    if count and stream is not None:
                        stream.served += count
                if tell is not None:
                    tell(names, np.bincount(draws[offset:], minlength=n).tolist())
                    begin = drawn[0]
        finally:
            if tell is not None and drawn[0] > begin:  # the part of a block yielded
                tell(names, np.bincount(draws[offset:offset + drawn[0] - begin],
                                        minlength=n).tolist())
            for stream in sources:
                if stream is not None:
                    close = getattr(stream.samples, "close", None)
                    if close is not None:
                        close()

    def last_ref(self) -> Ref:
        """The reference of the sample yielded last (for a resumable shuffle)."""
        cursors, drawn = self._last
        cursor = cursors[drawn[1]]
        ordinal, offset = cursor.last()
        return drawn[1], cursor.started - 1, ordinal, offset

    def refetch(self, refs: list[Ref]) -> list[Sample]:
        """The samples of ``refs``, read again (restoring a shuffle buffer)."""
        assert self.book is not None
        out = []
        for ref, sample in zip(refs, refetch(self.book, refs, self.read), strict=True):
            source = self.spec.sources[ref[0]]
            sample = keep_extensions(sample, source.extensions)
            sample["__source__"] = source.name
            if source.subflavors is not None:
                sample["__subflavors__"] = source.subflavors
            out.append(sample)
        return out

    def _what(self, i: int) -> str:
        source = self.spec.sources[i]
        return f"{self.spec.origin}: {source.key} ({source.name!r})"

    def _source(self, i: int, epoch: int, slot: int, cursor: ShardCursor) -> _SourceStream:
        what = self._what(i)
        key = self._keys[i]  # i, or the index it had when a resumed state was saved
        shards = _passes(self.urls[i], KeyedRandom(self.seed, epoch, slot, SHARDS, key), what)
        items: Iterator[dict[str, Any]] = ({"url": url} for url in shards)
        if self.book is not None:
            items = track_shards(self.book, i, cursor, items)
        return _SourceStream(items, len(self.urls[i]), what,
                             lambda items: self.read(items, i, cursor))


class _SourceStream:
    """One source's samples (``samples``), with a guard against an endless run of empty
    shards: the mix adds the samples it took to ``served`` after each block of draws.

    The guard fires when more shards than two passes, plus the read-ahead (``lookahead``),
    plus two blocks of draws, went by while ``served`` stood still: a block needs at most
    ``_BLOCK`` samples, so a source that gives any never trips it.
    """

    def __init__(self, shards: Iterator[dict[str, Any]], nshards: int, what: str,
                 read: Callable[[Iterable[dict[str, Any]]], Iterator[Sample]],
                 lookahead: int = 64) -> None:
        self.shards = shards
        self.limit = 2 * nshards + lookahead + 2 * _BLOCK
        self.what = what
        self.served = 0
        self.samples = read(self._items())

    def _items(self) -> Iterator[dict[str, Any]]:
        mark, pulled = self.served, 0
        for item in self.shards:
            if self.served != mark:
                mark, pulled = self.served, 0
            pulled += 1
            if pulled > self.limit:
                raise ConfigError(f"{self.what}: two passes over its shards gave no samples; "
                                  "are they empty, or all skipped by the handler?")
            yield item


def epoch_shards(spec: DatasetSpec, urls: Sequence[Sequence[str]], *, seed: int,
                 epoch: int) -> list[tuple[str, int]]:
    """The shards of ``epoch`` of a spec of mode ``"shards"``, as ``(url, source index)``, the
    same on every rank and worker, in webdataset 1.0.2's order for ``MultiShardSample`` whose
    ``set_epoch(seed + epoch)`` was called: per source ``resample`` drawn with replacement,
    ``choose`` without, or all of them; then shuffled together (:class:`PythonRandom`)."""
    rng = PythonRandom(seed + epoch)
    items: list[tuple[str, int]] = []
    for i, (source, found) in enumerate(zip(spec.sources, urls, strict=True)):
        if source.resample is not None:
            picked = rng.choices(list(found), source.resample)
        elif source.choose is not None:
            if source.choose > len(found):
                raise ConfigError(
                    f"{spec.origin}: {source.key}.choose: {source.choose} shards asked for, "
                    f"but {source.pattern!r} has {len(found)}")
            picked = list(found)
            rng.shuffle(picked)
            picked = picked[:source.choose]
        else:
            picked = list(found)
        items += [(url, i) for url in picked]
    rng.shuffle(items)
    return items


class SpecEpochShards(SpecSource):
    """The samples of a counted spec's epoch: :func:`epoch_shards` dealt to the slots (slot
    ``s`` of ``S = world_size * num_workers`` reads items ``s, s + S, ...``), read with
    ``read(items, -1)``; samples carry ``__source__`` and keep only their source's
    ``extensions``. With a :attr:`book`, the slot's stream of shards is resumable as one
    source (``src.0.*``), and so is a :class:`SpecShuffle` after it."""

    def __init__(self, spec: DatasetSpec, urls: Sequence[Sequence[str]], *, seed: int,
                 read: Reader, worker_info: WorkerInfoSource = None,
                 epochs: EpochCounter | None = None) -> None:
        super().__init__(spec, urls, seed=seed, worker_info=worker_info, epochs=epochs)
        self.read = read
        self._cursor = ShardCursor()
        self._owner: dict[str, int] = {}

    def __iter__(self) -> Iterator[Sample]:
        info = resolve_worker_info(self.worker_info)
        slots = info.world_size * info.num_workers
        slot = info.rank * info.num_workers + info.worker
        epoch = self._epoch(info.worker)
        self.position = (epoch, slot)
        items = epoch_shards(self.spec, self.urls, seed=self.seed, epoch=epoch)
        if len(items) < slots:
            log.warning("%s: epoch %d has %d shards for %d slots (%d ranks x %d workers): "
                        "some slots read nothing", self.spec.origin, epoch, len(items), slots,
                        info.world_size, info.num_workers)
        mine = items[slot::slots]
        owner = self._owner = {url: i for url, i in reversed(mine)}  # the first naming a URL
        check = ExtensionCheck(self.spec)
        cursor = self._cursor = ShardCursor()
        shards: Iterator[dict[str, Any]] = ({"url": url} for url, _ in mine)
        if self.book is not None:
            shards = track_shards(self.book, 0, cursor, shards)
        for sample in self.read(shards, -1, cursor):
            yield self._labelled(owner.get(sample.get("__url__", ""), mine[0][1] if mine else 0),
                                 sample, check)
        check.finish()

    def _labelled(self, i: int, sample: Sample, check: ExtensionCheck | None = None) -> Sample:
        source = self.spec.sources[i]
        if check is not None and check.active:
            check.see(i, sample)
        sample = keep_extensions(sample, source.extensions)
        sample["__source__"] = source.name
        if source.subflavors is not None:
            sample["__subflavors__"] = source.subflavors
        return sample

    def last_ref(self) -> Ref:
        """The reference of the sample yielded last (for a resumable shuffle)."""
        ordinal, offset = self._cursor.last()
        return 0, self._cursor.started - 1, ordinal, offset

    def refetch(self, refs: list[Ref]) -> list[Sample]:
        """The samples of ``refs``, read again (restoring a shuffle buffer)."""
        assert self.book is not None
        owner = self._owner

        def read(items: Iterable[dict[str, Any]], _: int, cursor: ShardCursor) -> Any:
            return self.read(items, -1, cursor)

        return [self._labelled(owner.get(sample.get("__url__", ""), 0), sample)
                for sample in refetch(self.book, refs, read)]


class SpecShardMix(SpecSource):
    """webdataset's ``MultiShardSample``: a spec as a stream of shards ``{"url": ...,
    "__source__": name}``, the same on every rank and worker, for the pipeline's splitters.

    A counted spec yields its :func:`epoch_shards` once per epoch. A weighted spec yields an
    endless shard-level mix: each next shard's source drawn by ``probabilities(epoch)``
    (``KeyedRandom(seed, epoch, -1, MIX)``), its shards in a fresh permutation per pass. This
    mixes shards, not samples: shares of samples follow only when shards hold equal numbers
    of samples (``WebDataset(spec)`` mixes samples).
    """

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = resolve_worker_info(self.worker_info)
        epoch = self.epochs.next(info.worker)
        if self.spec.counted:
            for url, i in epoch_shards(self.spec, self.urls, seed=self.seed, epoch=epoch):
                yield {"url": url, "__source__": self.spec.sources[i].name}
            return
        cumulative = _cumulative(self.spec, epoch, self.seed)
        rng = KeyedRandom(self.seed, epoch, -1, MIX)
        passes = [_passes(urls, KeyedRandom(self.seed, epoch, -1, SHARDS, i), source.key)
                  for i, (source, urls) in enumerate(zip(self.spec.sources, self.urls,
                                                         strict=True))]
        while True:
            for i in rng.choose(cumulative, _BLOCK).tolist():
                yield {"url": next(passes[i]), "__source__": self.spec.sources[i].name}


class SpecShuffle(PipelineStage):
    """A buffer shuffle of a spec's samples drawing from ``KeyedRandom(seed, epoch, slot,
    SHUFFLE)`` of the iteration under way (``WebDataset(spec).shuffle(n)``), so that the
    shuffled stream, too, is a function of the seed, rank, worker and epoch."""

    def __init__(self, source: SpecMix | SpecEpochShards, bufsize: int,
                 initial: int = 100) -> None:
        self.source = source
        self.bufsize = check_bufsize(bufsize)
        self.initial = initial

    def run(self, src: Iterable[Sample]) -> Iterator[Sample]:
        it = iter(src)
        first = next(it, None)  # starts the source's iteration: its position is known then
        if first is None:
            return
        if self.source.position is None:
            raise ConfigError("SpecShuffle must follow its spec source in the pipeline")
        epoch, slot = self.source.position
        rng = KeyedRandom(self.source.seed, epoch, slot, SHUFFLE)
        book = self.source.book
        if book is not None and not book.unsupported:
            shuffle = ResumableShuffle(book, self.source, self.bufsize, self.initial)
            yield from shuffle.run(itertools.chain([first], it), rng)
            return
        yield from buffer_shuffle(itertools.chain([first], it), self.bufsize, self.initial, rng)
