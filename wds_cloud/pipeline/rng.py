"""Keyed random streams: every random choice of a spec dataset comes from one of these.

A :class:`KeyedRandom` is keyed by ``(seed, epoch, slot, purpose)`` through
:func:`~wds_cloud.pipeline.shards.derive_seed` (a stable hash, the same in every process,
platform and Python version): ``slot`` is ``rank * num_workers + worker`` (or ``-1`` for a
choice every rank must agree on, such as a per-epoch scale factor), ``purpose`` a small int
naming what the stream is for (:data:`MIX`, :data:`SHARDS`, :data:`SCALE`, ...) plus, where
there are several, the source's index.

The generator is numpy's PCG64, whose raw 64-bit words numpy promises to keep stable; the words
are mapped to floats, bounded ints, shuffles and weighted choices here, not by numpy's or
Python's distribution code (which may change between versions), so a library upgrade cannot
change a stream. Golden values in the tests pin the mapping.

``draws`` counts the words used, for resumable state. numpy is imported by the first stream
made, not with this module (``import wds_cloud.pipeline`` stays light).
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .shards import derive_seed

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MIX", "SCALE", "SHARDS", "SHUFFLE", "KeyedRandom", "PythonRandom"]

#: purposes: what a stream is for (with a source index where there are several)
MIX, SHARDS, SCALE, SHUFFLE = 1, 2, 3, 4

T = TypeVar("T")

_BLOCK = 1024  # words drawn from the generator at a time
_TO_UNIT = 2.0**-53


class KeyedRandom:
    """A random stream keyed by ``(seed, epoch, slot, purpose, *index)`` (see module doc)."""

    def __init__(self, seed: int, epoch: int, slot: int, purpose: int, *index: int) -> None:
        import numpy as np

        self.key = (seed, epoch, slot, purpose, *index)
        self._bits = np.random.PCG64(derive_seed(seed, slot, purpose, epoch, *index))
        self._block = np.empty(0, dtype=np.uint64)
        self._pos = 0
        self.draws = 0

    def _refill(self) -> None:
        import numpy as np

        self._block = np.asarray(self._bits.random_raw(_BLOCK), dtype=np.uint64)
        self._pos = 0

    def words(self, n: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
        """The next ``n`` raw 64-bit words."""
        import numpy as np

        out = np.empty(n, dtype=np.uint64)
        filled = 0
        while filled < n:
            if self._pos >= len(self._block):
                self._refill()
            take = min(n - filled, len(self._block) - self._pos)
            out[filled:filled + take] = self._block[self._pos:self._pos + take]
            self._pos += take
            filled += take
        self.draws += n
        return out

    def word(self) -> int:
        """The next raw 64-bit word."""
        if self._pos >= len(self._block):
            self._refill()
        value = int(self._block[self._pos])
        self._pos += 1
        self.draws += 1
        return value

    def skip(self, n: int) -> None:
        """Use up ``n`` words without looking at them (to restore a stream's position)."""
        while n > 0:
            take = min(n, _BLOCK)
            self.words(take)
            n -= take

    def random(self) -> float:
        """A float in [0, 1) from the top 53 bits of one word."""
        return (self.word() >> 11) * _TO_UNIT

    def randoms(self, n: int) -> np.ndarray[Any, np.dtype[np.float64]]:
        """``n`` floats in [0, 1), as :meth:`random` would give them one by one."""
        import numpy as np

        return (self.words(n) >> np.uint64(11)).astype(np.float64) * _TO_UNIT

    def uniform(self, lo: float, hi: float) -> float:
        """A float in [lo, hi) (``lo`` itself when they are equal)."""
        return lo + (hi - lo) * self.random()

    def below(self, n: int) -> int:
        """An int in [0, n), unbiased (a word is drawn again in the rare case it must be)."""
        if n <= 0:
            raise ValueError(f"below({n}): n must be positive")
        limit = (1 << 64) - (1 << 64) % n
        while True:
            w = self.word()
            if w < limit:
                return w % n

    def shuffle(self, items: MutableSequence[T]) -> None:
        """Shuffle ``items`` in place (Fisher-Yates, from the end)."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """``k`` distinct items, in the order drawn (a partial Fisher-Yates)."""
        if not 0 <= k <= len(items):
            raise ValueError(f"cannot choose {k} of {len(items)} items")
        pool = list(items)
        for i in range(k):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:k]

    def choose(self, cumulative: np.ndarray[Any, np.dtype[np.float64]],
               n: int) -> np.ndarray[Any, np.dtype[np.intp]]:
        """``n`` indices drawn with the probabilities whose running sum is ``cumulative``
        (ending at 1.0)."""
        import numpy as np

        found = np.searchsorted(cumulative, self.randoms(n), side="right")
        return np.minimum(found, len(cumulative) - 1)  # a last sum a rounding below 1.0

    def __repr__(self) -> str:
        return f"KeyedRandom{self.key} after {self.draws} draws"


class PythonRandom:
    """The draws of Python's ``random.Random(seed)`` that webdataset 1.0.2's shard lists make
    (``shuffle``, ``choices``), so that a spec read with webdataset's meaning gives webdataset's
    order for the same seed.

    Only the Mersenne Twister's raw 32-bit words come from :mod:`random` (``getrandbits(32)``,
    stable across Python versions); the mapping to bounded ints, floats, shuffles and choices is
    CPython's algorithm written out here, so that a change in :mod:`random`'s distribution code
    cannot change a stream. Golden values against webdataset in the tests pin it.
    """

    def __init__(self, seed: int) -> None:
        import random

        self.seed = seed
        self._mt = random.Random(seed)

    def _word(self) -> int:
        return self._mt.getrandbits(32)

    def below(self, n: int) -> int:
        """An int in [0, n): CPython's ``_randbelow_with_getrandbits``."""
        k = n.bit_length()
        while True:
            r = self._word() >> (32 - k) if k <= 32 else self._mt.getrandbits(k)
            if r < n:
                return r

    def random(self) -> float:
        """A float in [0, 1): CPython's ``genrand_res53`` from two words."""
        a, b = self._word() >> 5, self._word() >> 6
        return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)

    def shuffle(self, items: MutableSequence[T]) -> None:
        """``random.shuffle``: Fisher-Yates from the end."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def choices(self, items: Sequence[T], k: int) -> list[T]:
        """``random.choices(items, k=k)`` (no weights): ``k`` items with replacement."""
        n = float(len(items))
        return [items[int(self.random() * n)] for _ in range(k)]

    def __repr__(self) -> str:
        return f"PythonRandom({self.seed})"
