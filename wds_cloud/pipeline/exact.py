"""Exact epochs over a plain shard list: :class:`ExactEpochShards`.

Every epoch, the shard URLs are permuted with ``KeyedRandom(seed, epoch, -1, SHUFFLE)`` (the
same permutation on every rank and worker, a new one each epoch, so shards move between ranks
across epochs) and dealt to the ``world_size * num_workers`` slots: slot ``s = rank *
num_workers + worker`` reads positions ``s, s + S, s + 2S, ...``. Every slot reads the same
number of shards: ``remainder="drop"`` leaves out the last ``len % S`` shards of the epoch's
permutation (different ones each epoch); ``"pad"`` (the default) fills the short slots with
shards from the start of the permutation, so every shard is read at least once.

Equal shard counts give every rank the same number of batches when the shards hold equal
numbers of samples (as ``ShardWriter(maxcount=...)`` writes them, but for the last). Otherwise
cut the epoch with ``.repeat().with_epoch(nbatches=N)``, which gives exactly N batches per rank.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import ConfigError
from .epochs import EpochCounter
from .rng import SHUFFLE, KeyedRandom
from .shards import WorkerInfoSource, _check_urls, expand_source, resolve_worker_info

__all__ = ["ExactEpochShards", "deal"]

log = logging.getLogger(__name__)

_REMAINDERS = ("pad", "drop")


def deal(urls: list[str], *, seed: int, epoch: int, slots: int,
         remainder: str = "pad") -> list[list[str]]:
    """The shards of each slot in ``epoch`` (see the module docstring)."""
    if remainder not in _REMAINDERS:
        raise ConfigError(f"remainder must be one of {_REMAINDERS}, got {remainder!r}")
    order = list(urls)
    KeyedRandom(seed, epoch, -1, SHUFFLE).shuffle(order)
    if remainder == "drop":
        order = order[:len(order) - len(order) % slots]
    elif len(order) % slots:
        order += order[:slots - len(order) % slots]
    return [order[s::slots] for s in range(slots)]


class ExactEpochShards:
    """Yield this slot's ``{"url": ...}`` of each epoch (see the module docstring).

    ``urls``: a brace pattern or a list; ``seed``: shared by all ranks; ``worker_info``: where
    this runs; ``epochs``: the epoch numbering (``set_epoch``; each iteration advances it).
    Fewer shards than slots is a :class:`ConfigError`.
    """

    def __init__(self, urls: str | Iterable[str], *, seed: int, remainder: str = "pad",
                 worker_info: WorkerInfoSource = None, epochs: EpochCounter | None = None,
                 url_vars: Mapping[str, str] | None = None) -> None:
        if remainder not in _REMAINDERS:
            raise ConfigError(f"epoch_mode='exact': remainder must be one of {_REMAINDERS}, "
                              f"got {remainder!r}")
        self.urls = _check_urls(expand_source(urls, url_vars=url_vars), urls)
        self.seed = seed
        self.remainder = remainder
        self.worker_info = worker_info
        self.epochs = epochs if epochs is not None else EpochCounter()

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration (in every DataLoader worker) epoch ``epoch``."""
        self.epochs.set(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = resolve_worker_info(self.worker_info)
        slots = info.world_size * info.num_workers
        if len(self.urls) < slots:
            raise ConfigError(
                f"epoch_mode='exact': {len(self.urls)} shards for {slots} slots "
                f"({info.world_size} ranks x {info.num_workers} workers); every slot needs a "
                "shard: use fewer workers, more (smaller) shards, or resampled=True / a "
                "dataset spec, whose streams never run dry")
        epoch = self.epochs.next(info.worker)
        mine = deal(self.urls, seed=self.seed, epoch=epoch, slots=slots,
                    remainder=self.remainder)[info.rank * info.num_workers + info.worker]
        log.debug("exact epoch %d: rank %d worker %d reads %d shards", epoch, info.rank,
                  info.worker, len(mine))
        for url in mine:
            yield {"url": url}

    def __len__(self) -> int:
        return len(self.urls)

    def __repr__(self) -> str:
        return (f"ExactEpochShards({len(self.urls)} urls, seed={self.seed}, "
                f"remainder={self.remainder!r})")
