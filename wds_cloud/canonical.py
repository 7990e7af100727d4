"""``WebLoader(..., slots=S)``: a job whose global batches do not depend on its shape.

The dataset is read as ``S`` canonical *slots* (slot ``j`` plays worker ``j`` of ``S`` of a
single rank: its shards, its seeds, its shuffle buffer), whatever the ranks and DataLoader
workers; rank ``r`` of ``R`` plays the slots ``[r * S // R, (r + 1) * S // R)``, dealt round
robin to its workers (:mod:`wds_cloud.pipeline.slots`). The workers send single samples, each
with its slot's state; the main process batches them: batch ``t`` of a rank is, for each of its
slots in order, the slot's next ``S // R``-th part of the batch. So global batch ``t`` (the
ranks' batches in rank order) is every slot's samples ``[t * k, (t + 1) * k)`` in slot order,
``k = R * batch_size // S``: the same batches, byte for byte, for any ranks R dividing ``S``
with the same global batch ``R * batch_size`` (a multiple of ``S``), any workers, and across a
resume on another such shape. Its state is the slots' states (``merge_state_dicts`` joins the
ranks'); a state of other slots is refused.

What it costs: samples travel one by one from the workers and are collated in the main
process (``collate_fn``, default torch's); ``with_epoch(n)`` counts per slot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .errors import ResumeError
from .pipeline.shards import WorkerInfo
from .pipeline.slots import (
    CanonicalBatches,
    assign,
    canonical_slots,
    check_canonical,
    merge_state_dicts,
    owner,
    slot_of,
)

__all__ = ["CanonicalLoader"]

log = logging.getLogger(__name__)


class CanonicalLoader:
    """The source of a ``WebLoader(slots=S)``: see the module docstring. ``epoched`` is the
    loader's :class:`~wds_cloud.dataloader.EpochedLoader` (its DataLoader sends single samples)
    whose passes, epochs and states this one keeps for canonical slots."""

    def __init__(self, epoched: Any, slots: int, batch_size: int, collate: Any) -> None:
        from .pytorch import worker_info

        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            from .errors import ConfigError

            raise ConfigError(f"WebLoader(slots={slots!r}): a number of slots >= 1")
        if getattr(epoched.loader.dataset, "book", None) is None:
            from .errors import ConfigError

            raise ConfigError("WebLoader(slots=...) reads a resumable dataset (WebDataset or "
                              f"a spec), not a {type(epoched.loader.dataset).__name__}")
        self.epoched = epoched
        self.slots = slots
        self.batch_size = batch_size
        self.collate = collate
        self.here: WorkerInfo = worker_info()
        self.per = check_canonical(slots, batch_size, self.here.world_size)
        self.resume: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        from .dataloader import shut_on_error
        from .io.forks import settle_imports
        from .pytorch import set_epoch

        epoched = self.epoched
        loader = epoched.loader
        dataset = loader.dataset
        epoch = epoched.epoch
        set_epoch(dataset, epoch)
        epoched.current, epoched.epoch = epoch, epoch + 1
        epoched.yielded, epoched.last_worker = 0, -1
        pending, self.resume = self.resume or canonical_slots(epoch, self.slots), None
        here, workers = self.here, max(loader.num_workers, 1)
        epoched.played = {w: {slot_of(s): s for s in assign(pending["slots"], WorkerInfo(
            here.rank, here.world_size, w, workers))} for w in range(workers)}
        epoched.played_left = {}
        book = dataset.book
        book.pending = pending
        in_process = not loader.num_workers
        if in_process:
            book.ship = True  # (the workers' copies ship; here, the dataset itself)
        if not in_process:
            settle_imports()
        try:
            it = iter(loader)
        finally:
            book.pending = None
        rank_slots = [j for j in range(self.slots)
                      if owner(j, self.slots, here.world_size, workers)[0] == here.rank]
        batches = CanonicalBatches(rank_slots, self.per)
        every, report = epoched.reporting or (0, None)
        try:
            tagged = self._tagged(it, in_process)
            if not in_process:
                tagged = shut_on_error(loader, it, tagged)
            for batch in batches.batches(tagged, self._take):
                epoched.yielded += 1
                yield self.collate(batch)
                if report is not None and epoched.yielded % every == 0:
                    report()  # (stats_every)
        finally:
            if in_process:
                book.ship = False

    def _tagged(self, it: Iterator[Any], in_process: bool) -> Iterator[tuple[int, Any, Any]]:
        """``(slot, sample, state)`` of each sample the DataLoader yields."""
        from .shipping import Group, after, raise_if_error

        for got in it:
            for shipped in (got.entries() if isinstance(got, Group) else (got,)):
                raise_if_error(shipped)  # (after its worker's items)
                state = after([shipped.state]) if in_process else shipped.state
                worker = int(state["worker"])
                for slot, one in state["played"].items():  # one sample: one slot
                    yield int(slot), shipped.item, (worker, one)

    def _take(self, slot: int, state: tuple[int, Any]) -> None:
        from .shipping import went_on

        worker, one = state
        played = self.epoched.played.setdefault(worker, {})
        played[slot] = went_on(played.get(slot), one)

    def state_dict(self) -> dict[str, Any]:
        """The slots' states as of the samples in the batches yielded (never those the
        workers sent ahead), one entry a worker (``merge_state_dicts`` joins the ranks')."""
        epoched = self.epoched
        workers = max(epoched.loader.num_workers, 1)
        return {"version": 1, "kind": "WebLoader", "epoch": max(epoched.current, 0),
                "yielded": epoched.yielded, "num_workers": epoched.loader.num_workers,
                "batch_size": self.batch_size, "last_worker": -1, "canonical_slots": self.slots,
                "rank": self.here.rank, "world_size": self.here.world_size,
                "workers": [epoched._playing_state(w, epoched.played.get(w, {}))
                            for w in range(workers)]}

    def load_state_dict(self, state: dict[str, Any], *, on_mismatch: str) -> None:
        if state.get("kind") not in ("WebLoader", "merged"):
            raise ResumeError(f"not a WebLoader's state (kind {state.get('kind')!r})",
                              field="kind")
        merged = state if state["kind"] == "merged" else merge_state_dicts([state])
        if (merged["world_size"], merged["num_workers"]) != (1, self.slots):
            raise ResumeError(f"this state is of {merged['world_size']} ranks x "
                              f"{merged['num_workers']} workers (or slots), not of "
                              f"WebLoader(slots={self.slots}): resume it with the loader "
                              "that saved it", field="slots")
        merged = {**merged, "canonical": 1}
        self.epoched.loader.dataset.load_state_dict(merged, on_mismatch=on_mismatch)
        self.epoched.epoch = int(merged["epoch"])
        self.resume = merged
        log.info("resuming %d canonical slots on rank %d of %d", self.slots, self.here.rank,
                 self.here.world_size)
