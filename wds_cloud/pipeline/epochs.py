"""Epoch numbers that survive DataLoader workers: :class:`EpochCounter`.

A DataLoader gives each worker a copy of the dataset: pickled anew every epoch (non-persistent
workers, ``spawn``) or kept for the whole run (persistent workers), and ``set_epoch`` called on
the dataset in the main process never reaches a persistent worker's copy. A counter kept in the
dataset object therefore restarts with every copy, and every epoch repeats.

An :class:`EpochCounter` keeps its numbers in shared memory, made in the process that built the
dataset and inherited by its workers (``fork``) or handed to them when they start (``spawn``,
``forkserver``). It holds the value of the last :meth:`set` (0 if never called) and, per
worker, how many iterations that worker started since. Worker ``w``'s ``k``-th iteration after
``set(n)`` is epoch ``n + k``: with persistent or non-persistent workers, fork or spawn, with or
without ``set_epoch``, every iteration of the dataset is a new epoch, and all workers (and,
when every rank runs the same number of epochs, all ranks) agree on its number.

Pickled outside of starting a process (``pickle.dumps(dataset)``), a counter is copied by
value: the copy counts on its own, from where the original stood.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing import context as mp_context
from typing import Any

from ..errors import ConfigError

__all__ = ["EpochCounter"]

# a lock made by the spawn context works in forked workers too; one made by the fork context
# cannot be handed to a spawned worker
_CONTEXT = multiprocessing.get_context("spawn")


class EpochCounter:
    """Shared epoch numbering for one dataset (see the module docstring).

    ``max_workers``: the most DataLoader workers per process the counter can tell apart.
    """

    def __init__(self, max_workers: int = 256) -> None:
        if max_workers < 1:
            raise ConfigError(f"EpochCounter(max_workers={max_workers}): need at least 1")
        self.max_workers = max_workers
        # [0]: the epoch of the last set(); [1 + w]: iterations worker w started since then
        self._values: Any = _CONTEXT.Array("q", 1 + max_workers)

    def set(self, epoch: int) -> None:
        """Make the next iteration of every worker epoch ``epoch``."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): the epoch must be an integer >= 0")
        with self._values.get_lock():
            self._values[0] = epoch
            for i in range(1, 1 + self.max_workers):
                self._values[i] = 0

    def next(self, worker: int = 0) -> int:
        """The epoch of the iteration worker ``worker`` starts now (and count it)."""
        if not 0 <= worker < self.max_workers:
            raise ConfigError(
                f"DataLoader worker {worker} is beyond the {self.max_workers} workers this "
                "dataset's epoch counter can tell apart; use fewer workers")
        with self._values.get_lock():
            started = self._values[1 + worker]
            self._values[1 + worker] = started + 1
            return int(self._values[0] + started)

    def resume(self, worker: int, epoch: int) -> None:
        """Make worker ``worker``'s next iteration epoch ``epoch`` (restoring a state), the
        ones after it ``epoch + 1``, ..."""
        with self._values.get_lock():
            self._values[1 + worker] = epoch - self._values[0]

    def peek(self, worker: int = 0) -> int:
        """The epoch worker ``worker``'s next iteration will be (not counted)."""
        with self._values.get_lock():
            return int(self._values[0] + self._values[1 + worker])

    def __getstate__(self) -> dict[str, Any]:
        if mp_context.get_spawning_popen() is not None:  # handed to a starting worker
            return {"max_workers": self.max_workers, "shared": self._values}
        with self._values.get_lock():
            return {"max_workers": self.max_workers, "copied": list(self._values)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_workers = state["max_workers"]
        if "shared" in state:
            self._values = state["shared"]
        else:
            self._values = _CONTEXT.Array("q", state["copied"])

    def __repr__(self) -> str:
        with self._values.get_lock():
            values = list(self._values)
        started = {w: n for w, n in enumerate(values[1:]) if n}
        return f"EpochCounter(set to {values[0]}, iterations started per worker {started})"
