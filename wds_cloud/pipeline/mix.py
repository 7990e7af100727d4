"""Mixing samples from several datasets: :class:`RandomMix` and :class:`RoundRobin`.

Both are lazy and picklable: nothing is opened until they are iterated, and each ``iter()``
starts every dataset afresh. :class:`RandomMix` draws from the ``random.Random`` it is given
(``rng``) or makes (``seed``); with neither, from the global ``random`` draw for draw as
webdataset 1.0.2 does, so that ``random.seed(...)`` (and torch's seeding of each DataLoader
worker's ``random``) makes the mix reproducible, and the same as webdataset's.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["RandomMix", "RoundRobin", "random_samples", "round_robin_longest",
           "round_robin_shortest"]


def round_robin_shortest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each source in turn, until any source is exhausted."""
    for source in itertools.cycle(sources):
        for item in source:
            yield item
            break
        else:
            return


def round_robin_longest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each source in turn, dropping exhausted sources, until none is left."""
    live = list(sources)
    i = 0
    while live:
        i %= len(live)
        for item in live[i]:
            yield item
            i += 1
            break
        else:
            del live[i]


class RoundRobin:
    """Iterate ``datasets`` in turn, one item each, until the first (or, with ``longest``,
    the last) of them is exhausted."""

    def __init__(self, datasets: Sequence[Iterable[Any]], longest: bool = False) -> None:
        self.datasets = list(datasets)
        self.longest = longest

    def __iter__(self) -> Iterator[Any]:
        sources = [iter(d) for d in self.datasets]
        if not sources:
            return iter(())
        return round_robin_longest(*sources) if self.longest else round_robin_shortest(*sources)


def _weights(probs: Sequence[float] | None, n: int) -> list[float]:
    if probs is None:
        return [1.0] * n
    weights = [float(p) for p in probs]
    if len(weights) != n:
        raise ConfigError(f"RandomMix: {len(weights)} probabilities for {n} datasets")
    if any(not math.isfinite(w) or w < 0 for w in weights) or (n and sum(weights) <= 0):
        raise ConfigError(
            f"RandomMix: probabilities must be finite, non-negative and not all zero; "
            f"got {weights}"
        )
    return weights


def random_samples(
    sources: Sequence[Iterator[Any]], probs: Sequence[float] | None = None,
    longest: bool = False, *, rng: random.Random | None = None,
) -> Iterator[Any]:
    """Yield items from sources picked at random in proportion to ``probs`` (default equal).

    Stops when the picked source is exhausted, or with ``longest`` drops it and goes on until
    every source is exhausted (or only zero-weight sources remain).
    """
    live = list(sources)
    weights = _weights(probs, len(live))
    rand = rng.random if rng is not None else random.random
    while live:
        total = sum(weights)
        if total <= 0:
            return
        # webdataset's pick: the first source whose share, summed, is above a uniform draw
        # (bisect_right: never a zero-weight source; the last positive one if rounding left
        # the sum just short of 1)
        cum = list(itertools.accumulate(w / total for w in weights))
        last = max(j for j, w in enumerate(weights) if w > 0)
        while True:
            i = min(bisect.bisect_right(cum, rand()), last)
            for item in live[i]:
                yield item
                break
            else:
                break
        if not longest:
            return
        del live[i]
        del weights[i]


class RandomMix:
    """Mix ``datasets``, each item from one picked with probability ``probs[i] / sum(probs)``.

    Stops at the first exhausted dataset, or with ``longest`` when all are exhausted.
    ``rng`` (shared across epochs) or ``seed`` (a fresh ``random.Random(seed)`` each epoch,
    so every epoch mixes the same way) make the mix reproducible; with neither, it draws from
    the global ``random``, as webdataset's does.
    """

    def __init__(
        self, datasets: Sequence[Iterable[Any]], probs: Sequence[float] | None = None,
        longest: bool = False, *, seed: int | str | bytes | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if seed is not None and rng is not None:
            raise ConfigError("RandomMix: pass either rng or seed, not both")
        self.datasets = list(datasets)
        self.probs = None if probs is None else _weights(probs, len(self.datasets))
        self.longest = longest
        self.seed = seed
        self.rng = rng

    def __iter__(self) -> Iterator[Any]:
        rng = self.rng if self.seed is None else random.Random(self.seed)
        sources = [iter(d) for d in self.datasets]
        return random_samples(sources, self.probs, self.longest, rng=rng)
