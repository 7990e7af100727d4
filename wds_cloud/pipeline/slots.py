"""Resuming on another shape: the workers of a saved run become *slots* that the workers of
the new run take over.

A job saves one state per rank (``loader.state_dict()``, with a state per DataLoader worker
inside). :func:`merge_state_dicts` joins the states of all ranks into one whose ``slots`` are
the saved workers, in the order ``j = rank * num_workers + worker``, each knowing which worker
it was. Loaded into a job of another shape (ranks, workers, batch size), the ``S`` slots are
dealt to the new ranks in contiguous blocks (rank ``r`` plays ``[r * S // R, (r + 1) * S //
R)``) and within a rank round robin to its workers (:func:`owner`). A copy of the dataset
plays each saved worker (:data:`~wds_cloud.pipeline.shards.playing` answers every "where do
I run" while it computes an item) and goes on from the slot's state, so it reads what that
worker had left of the epoch, and only that: the samples of its shuffle buffer, the rest of
its current shard (a ranged read), its shards not yet started. A
new worker plays its slots in turn, an item from each. A saved worker that had yielded nothing
is a *fresh* slot: it starts the epoch as that worker would have.

So the rest of the epoch is read exactly once over the new shape (in an exact-epoch mode), and
every source of a mix continues from its own cursor (resampled). Workers beyond the saved
count play no slot until the epoch ends; from the next epoch the new shape is the shape.

A state taken while slots are played holds them (``slots`` in a worker's state), so a job can
change shape again before the epoch ends: merging flattens them back into the saved workers.

Layer 2: standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from copy import deepcopy
from typing import Any

from ..errors import ResumeError
from . import shards
from .shards import WorkerInfo

__all__ = [
    "CanonicalBatches",
    "assign",
    "canonical_slots",
    "check_canonical",
    "fresh_slot",
    "merge_state_dicts",
    "owner",
    "plain_states",
    "play",
    "playing_info",
    "quota",
    "slot_of",
]

State = dict[str, Any]
_END: Any = object()


def slot_of(state: Mapping[str, Any]) -> int:
    """The slot index of a saved worker's state: ``rank * num_workers + worker``."""
    return int(state["rank"]) * int(state["num_workers"]) + int(state["worker"])


def fresh_slot(epoch: int, rank: int, world_size: int, worker: int, num_workers: int) -> State:
    """The slot of a saved worker that had yielded nothing in ``epoch``."""
    return {"fresh": 1, "epoch": epoch, "rank": rank, "world_size": world_size,
            "worker": worker, "num_workers": num_workers}


def plain_states(state: Mapping[str, Any]) -> list[State]:
    """The saved workers' own states inside ``state`` (a loader's, a merged one, a worker's
    that plays slots, a dataset's), slots flattened, ``None`` for workers not yet started."""
    if "slots" in state:
        return [dict(s) for s in state["slots"]]
    if "workers" in state:
        out: list[State] = []
        for one in state["workers"]:
            out += plain_states(one) if one and "slots" in one else [one]
        return out
    return [dict(state)]


def _rank_slots(state: Mapping[str, Any], epoch: int) -> list[State]:
    """The slots of one rank's state, fresh ones filled in from the loader's shape."""
    if state.get("kind") == "merged":
        return [dict(s) for s in state["slots"]]
    if state.get("kind") != "WebLoader":  # a dataset's own state (no DataLoader workers)
        return plain_states(state)
    workers = list(state.get("workers") or [])
    known = [s for s in plain_states(state) if s]
    rank = state.get("rank", known[0]["rank"] if known else None)
    world = state.get("world_size", known[0]["world_size"] if known else None)
    if rank is None or world is None:
        raise ResumeError("a WebLoader state whose workers had yielded nothing does not say "
                          "its rank; save it with this version", field="rank")
    out: list[State] = []
    for w, one in enumerate(workers):
        if not one:
            out.append(fresh_slot(epoch, int(rank), int(world), w, len(workers)))
        else:
            out += plain_states(one) if "slots" in one else [dict(one)]
    return out


def merge_state_dicts(states: Sequence[Mapping[str, Any]]) -> State:
    """One state for a job of any shape from the states of all the ranks of a job (each
    rank's ``loader.state_dict()``, or ``dataset.state_dict()`` where no DataLoader workers
    ran), gathered e.g. with ``torch.distributed.all_gather_object``; see the module
    docstring. :class:`~wds_cloud.errors.ResumeError` when they are not one job's: another
    epoch (``field="epoch"``), a rank missing or twice (``"rank"``)."""
    if isinstance(states, Mapping) or not states:
        raise ResumeError("merge_state_dicts takes a list of the ranks' states (one or more)",
                          field="state")
    epochs = {int(s.get("epoch", -1)) for s in states}
    if len(epochs) != 1:
        raise ResumeError(f"the states are of different epochs {sorted(epochs)}: take them "
                          "at the same step on every rank", field="epoch")
    epoch = epochs.pop()
    slots: dict[int, State] = {}
    batch_sizes = {s.get("batch_size") for s in states if s.get("kind") == "WebLoader"}
    for state in states:
        for one in _rank_slots(state, epoch):
            j = slot_of(one)
            if j in slots:
                raise ResumeError(f"rank {one['rank']} worker {one['worker']} is in the states "
                                  "twice", field="rank")
            slots[j] = one
    first = next(iter(slots.values()))
    world, workers = int(first["world_size"]), int(first["num_workers"])
    for one in slots.values():
        if (int(one["world_size"]), int(one["num_workers"])) != (world, workers):
            raise ResumeError(f"the states are of jobs of different shapes ({world} ranks x "
                              f"{workers} workers, and {one['world_size']} x "
                              f"{one['num_workers']})", field="world_size")
    missing = sorted({j // workers for j in range(world * workers) if j not in slots})
    if missing:
        raise ResumeError(f"the states of ranks {missing} of {world} are missing: merge the "
                          "states of every rank", field="rank")
    return {"version": 1, "kind": "merged", "epoch": epoch, "world_size": world,
            "num_workers": workers, "batch_size": batch_sizes.pop() if len(batch_sizes) == 1
            else None, "slots": [slots[j] for j in sorted(slots)],
            "loaders": {str(s.get("rank", 0)): {"yielded": s.get("yielded", 0),
                                                 "last_worker": s.get("last_worker", -1)}
                        for s in states if s.get("kind") == "WebLoader"}}


def owner(j: int, slots: int, world_size: int, num_workers: int) -> tuple[int, int]:
    """``(rank, worker)`` that plays slot ``j`` of ``slots``: rank ``r`` the contiguous
    block ``[r * slots // world_size, (r + 1) * slots // world_size)``, and within it the
    ``l``-th slot worker ``l % num_workers``."""
    rank = ((j + 1) * world_size - 1) // slots
    return rank, (j - rank * slots // world_size) % num_workers


def assign(slots: Sequence[State], info: WorkerInfo) -> list[State]:
    """The slots the worker ``info`` plays (:func:`owner`)."""
    me = (info.rank, info.worker)
    return [dict(s) for j, s in enumerate(slots)
            if owner(j, len(slots), info.world_size, info.num_workers) == me]


def playing_info(state: Mapping[str, Any], seed: int | None) -> WorkerInfo:
    """The worker a slot's state was saved by (``seed``: the player's torch seed)."""
    return WorkerInfo(int(state["rank"]), int(state["world_size"]), int(state["worker"]),
                      int(state["num_workers"]), seed)


def quota(pipeline: Any, book: Any, info: WorkerInfo) -> int:
    """The items the worker ``info`` yields in the rest of an epoch resumed on another shape,
    when the epoch has a length (``with_epoch``) and the streams never end: what every saved
    worker had left (``T``, the same in every new worker), shared as evenly as a per-rank
    epoch is, each rank the same number of units (``ceil(T / multiple / ranks)``). -1 without
    a length, for streams that end (an exact epoch is read once, not shared) and for
    canonical slots: each slot runs to its own end. A worker that was playing slots goes on
    with its own quota."""
    if not book.endless or book.slot_canonical or (pipeline.rank_epoch is None
                                                   and pipeline.nsamples <= 0):
        return -1
    if book.slot_left is not None:
        return int(book.slot_left)
    total = 0
    for saved in book.merged_slots or []:
        share = pipeline._share_of(playing_info(saved, None))
        if not saved.get("fresh"):  # (a state sent between whole ones: + replay)
            share -= int(saved.get("yielded", 0)) + int(saved.get("replay", 0))
        total += share
    multiple = pipeline.rank_epoch[1] if pipeline.rank_epoch is not None else 1
    units = -(-max(total, 0) // multiple)
    if book.merged_slots is book.slotted:  # its own slots, quota unknown: their rest
        return units * multiple
    per_rank = -(-units // info.world_size)
    mine = per_rank // info.num_workers + (info.worker < per_rank % info.num_workers)
    return mine * multiple


def play(pipeline: Any, slots: list[State], info: WorkerInfo, quota: int = -1
         ) -> Iterator[Any]:
    """The items of ``pipeline`` (whose book was given ``slots`` to play) played by the
    worker ``info``: one copy of the pipeline per slot, resumed from its state, in turn; with
    a ``quota`` (>= 0), that many items in all, the copies going on past their own shares
    (their streams are resampled, or end where they end); else each to its own end. An
    item a copy ships (:class:`~wds_cloud.pipeline.state.Shipped`) goes out with the slot's
    state under ``"state"``, the slot under ``"slot"`` and the quota left under ``"left"``."""
    from .state import Shipped

    book = pipeline.book
    live: list[tuple[int, WorkerInfo, Iterator[Any]]] = []
    books: dict[int, Any] = {}
    for state in slots:
        copy = deepcopy(pipeline)  # as pickling would (the live state stays), lambdas too
        copy.book.pending = state
        copy.book.outgoing = None  # its items go out through this one's
        copy.unbounded = quota >= 0
        j, playing = slot_of(state), playing_info(state, info.seed)
        books[j] = copy.book
        shards.playing = playing
        try:
            live.append((j, playing, iter(copy)))
        finally:
            shards.playing = None
    book.slot_books = books
    book.slot_left = quota if quota >= 0 else None
    if quota > 0 and not live:  # more workers than saved ones, and endless streams: a
        copy = deepcopy(pipeline)  # fresh one of its own, its state not kept (nothing to
        copy.book.pending = fresh_slot(book.epoch, info.rank, info.world_size,  # resume)
                                       info.worker, info.num_workers)
        copy.book.ship = False
        copy.unbounded = True
        live.append((-1, info, iter(copy)))
    while live and quota != 0:
        for entry in list(live):
            if quota == 0:
                break
            j, playing, it = entry
            shards.playing = playing
            try:
                item = next(it, _END)
            finally:
                shards.playing = None
            if item is _END:
                live.remove(entry)
                continue
            if j >= 0:
                book.slot_started.add(j)
            if quota > 0:
                quota -= 1
                book.slot_left = quota
            if isinstance(item, Shipped):
                item = Shipped(item.item, {"worker": info.worker, "slot": j,
                                           "state": item.state, "left": quota})
            yield item


def canonical_slots(epoch: int, slots: int) -> State:
    """The pending state of a fresh epoch played as ``slots`` canonical slots: slot ``j`` is
    the worker ``j`` of ``slots`` of one rank, whatever the job's shape."""
    return {"version": 1, "kind": "merged", "epoch": epoch, "world_size": 1,
            "num_workers": slots, "canonical": 1,
            "slots": [fresh_slot(epoch, 0, 1, j, slots) for j in range(slots)]}


def check_canonical(slots: int, batch_size: int, world_size: int) -> int:
    """The samples each slot gives to each batch (``slots`` canonical slots, per-rank
    ``batch_size``, ``world_size`` ranks), or a ConfigError naming what does not divide."""
    from ..errors import ConfigError

    if slots % world_size:
        raise ConfigError(f"WebLoader(slots={slots}) on {world_size} ranks: the ranks must "
                          "divide the slots (each rank plays slots // ranks of them)")
    per_rank = slots // world_size
    if batch_size % per_rank:
        raise ConfigError(f"WebLoader(slots={slots}, batch_size={batch_size}) on "
                          f"{world_size} ranks: each rank's {per_rank} slots give equal parts "
                          f"of its batch, so batch_size must be a multiple of {per_rank} "
                          "(the global batch a multiple of the slots)")
    return batch_size // per_rank


class CanonicalBatches:
    """The batches of one rank of a job reading ``slots`` canonical slots: batch ``t`` is,
    for each of the rank's slots in order, that slot's next ``per`` samples, so that the
    job's global batch ``t`` (the ranks' batches in rank order) is every slot's samples
    ``[t * per, (t + 1) * per)`` in slot order, whatever the ranks and workers.

    ``items`` yields ``(slot, sample, state)`` as the workers send them; ``take(slot,
    state)`` is told the state after each sample that goes into a batch (so a state taken
    between batches belongs to the batches yielded). At the end, each batch has what the
    slots still had.
    """

    def __init__(self, rank_slots: list[int], per: int) -> None:
        self.rank_slots = rank_slots
        self.per = per

    def batches(self, items: Iterator[tuple[int, Any, Any]],
                take: Any) -> Iterator[list[Any]]:
        from collections import deque

        queues: dict[int, Any] = {j: deque() for j in self.rank_slots}
        ended = False
        while True:
            batch: list[Any] = []
            for j in self.rank_slots:
                queue = queues[j]
                while len(queue) < self.per and not ended:
                    got = next(items, _END)
                    if got is _END:
                        ended = True
                        break
                    queues.setdefault(got[0], deque()).append(got[1:])
                for _ in range(min(self.per, len(queue))):
                    sample, state = queue.popleft()
                    take(j, state)
                    batch.append(sample)
            if not batch:
                return
            yield batch
