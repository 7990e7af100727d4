"""What a :class:`~wds_cloud.pytorch.WebLoader` wraps around torch's DataLoader: each pass an
epoch, the workers' states shipped with their items and kept for ``state_dict`` (after a
restore, in the order of the uninterrupted run; on another shape, per slot played, see
:mod:`wds_cloud.pipeline.slots`), the workers' groups of items taken apart in that order, and
more items in flight for small ones. What the workers send is :mod:`wds_cloud.shipping`'s.

Layer 3: imports torch only inside what runs with a DataLoader.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .errors import ResumeError
from .io.forks import settle_imports
from .pipeline.shards import WorkerInfo
from .pipeline.slots import slot_of
from .shipping import Group, _Sizes, grouped, raise_if_error, went_on

__all__ = ["PREFETCH_BYTES", "PREFETCH_MAX", "EpochedLoader", "ReportIO", "shut_on_error"]

#: items a WebLoader's worker may have in flight at most (torch's default ``prefetch_factor``
#: is 2), and the bytes all its workers' items in flight may add up to (see ``_deepened``)
PREFETCH_MAX, PREFETCH_BYTES = 8, 16 << 20

log = logging.getLogger(__name__)


def _where() -> WorkerInfo:
    """Where the loader runs (rank, world size), as :func:`wds_cloud.pytorch.worker_info`."""
    from .pytorch import worker_info

    return worker_info()


def _set_epoch(obj: object, epoch: int) -> None:
    from .pytorch import set_epoch

    set_epoch(obj, epoch)


class EpochedLoader:
    """A DataLoader as a pipeline source: each pass first sets the dataset's epoch; items
    sent with their worker's state (see :class:`~wds_cloud.pipeline.state.Shipped`) are
    unpacked and the states kept, for :meth:`state_dict`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.epoch = 0
        self.current = -1  # the pass under way
        self.yielded = 0
        self.last_worker = -1
        self.states: list[Any] = []
        self.resume: dict[str, Any] | None = None
        #: per worker, the saved workers' slots it plays (a resume on another shape), by slot
        self.played: dict[int, dict[int, Any]] = {}
        self.played_left: dict[int, int] = {}  # and the items each has left of its quota
        self.resume_played: dict[int, dict[int, Any]] | None = None
        #: ``(every, report)``: ``report()`` after every ``every`` batches (``stats_every``)
        self.reporting: tuple[int, Callable[[], None]] | None = None
        #: whether to raise the workers' items in flight for small items (``_deepened``)
        self.deepen = False
        #: whether the workers send their items in groups (:func:`~wds_cloud.shipping.grouped`)
        self.grouped = False
        self.prefetch = 0  # the items in flight per worker, as of the last item taken

    def __iter__(self) -> Iterator[Any]:
        dataset = self.loader.dataset
        _set_epoch(dataset, self.epoch)
        self.current, self.epoch = self.epoch, self.epoch + 1
        resume, self.resume = self.resume, None
        workers = self.loader.num_workers
        self.states = list(resume["workers"]) if resume else [None] * max(workers, 1)
        self.played, self.resume_played = self.resume_played or {}, None
        self.played_left = {}
        for worker, saved in enumerate(self.states):  # workers that went on playing slots
            if saved and "slots" in saved:
                self.played[worker] = {slot_of(s): s for s in saved["slots"]}
                self.played_left[worker] = int(saved.get("left", -1))
        self.yielded = resume["yielded"] if resume else 0
        self.last_worker = resume["last_worker"] if resume else -1
        if workers:
            settle_imports()
        it = iter(self.loader)
        book = getattr(dataset, "book", None)
        if book is not None and workers:
            book.pending = None  # handed to the workers now; later passes start afresh
        out = self._counted(it) if not workers else self._unshipped(it, resume is not None)
        self.prefetch = getattr(it, "_prefetch_factor", 0)
        if self.deepen and workers and _deepens(it):
            out = self._deepened(it, out)
        if workers:
            out = shut_on_error(self.loader, it, out)
        return out if self.reporting is None else _reported(out, *self.reporting)

    def _deepened(self, it: Any, items: Iterator[Any]) -> Iterator[Any]:
        """``items``, while the workers' items in flight (torch's ``prefetch_factor``, 2 by
        default) go up to :data:`PREFETCH_MAX` each, as long as all of them would fit in
        :data:`PREFETCH_BYTES` at the size of the largest item taken so far. The main
        process asks a worker for an item only when it takes one of the worker's, in order:
        with two in flight, a worker that makes small items quickly waits for its turn
        (``tests/bench/bench_loader.py``: 2 workers made tiny batches at 0.94 times the rate
        of one process with 2 in flight, 1.11 times with 8). Raised only: torch cannot take
        back an item asked for; an item larger than those before stops the rise."""
        workers = self.loader.num_workers
        _Sizes.take()  # sizes from before this pass are not its own
        largest = 0
        for n, item in enumerate(items, 1):
            yield item
            if n & 15:  # look every 16 items
                continue
            largest = max(largest, _Sizes.take())
            fits = PREFETCH_BYTES // max(1, largest * workers)
            while it._prefetch_factor < min(PREFETCH_MAX, fits) and not it._shutdown:
                it._prefetch_factor += 1
                for _ in range(workers):
                    it._try_put_index()
            self.prefetch = it._prefetch_factor

    def _counted(self, it: Iterator[Any]) -> Iterator[Any]:
        for item in it:
            self.yielded += 1
            yield item

    def _unshipped(self, it: Iterator[Any], resumed: bool) -> Iterator[Any]:
        """Items without their states, groups taken apart; after a restore, or when the
        workers send groups, in the order the uninterrupted run of single items had: round
        robin from the worker after the last one that yielded (:meth:`_in_turn`)."""
        if not (resumed or self.grouped):
            for shipped in it:
                yield self._take(shipped)
            return
        if not resumed and not getattr(self.loader, "in_order", True):
            for got in it:  # torch's in_order=False: as they come
                for shipped in (got.entries() if isinstance(got, Group) else (got,)):
                    yield self._take(shipped)
            return
        yield from self._in_turn(it)

    def _in_turn(self, it: Iterator[Any]) -> Iterator[Any]:
        """The items of ``it`` (single, or in groups) in turn: one of each worker's in worker
        order, skipping those that have no more (a group marked ``last``, or an item with
        no more ``left``), as torch gives single items (``in_order``)."""
        workers = self.loader.num_workers
        queues: list[deque[Any]] = [deque() for _ in range(workers)]
        done = {w for w, st in enumerate(self.states) if st and st.get("left") == 0}
        ended: set[int] = set()  # workers whose last item has come
        turn = (self.last_worker + 1) % workers
        for got in it:
            if isinstance(got, Group):
                queues[got.worker].extend(got.entries())
                if got.last:
                    ended.add(got.worker)
            else:
                queues[_worker_of(got)].append(got)
            while len(done) < workers:
                queue = queues[turn]
                if not queue:
                    if turn not in ended and turn not in done:
                        break  # its next item is still to come
                    done.add(turn)
                if turn not in done:
                    item = queue.popleft()
                    if getattr(item, "state", {}).get("left") == 0:
                        done.add(turn)
                    yield self._take(item)
                turn = (turn + 1) % workers
        while any(queues):  # the end: what is left, in turn
            if queues[turn]:
                yield self._take(queues[turn].popleft())
            turn = (turn + 1) % workers

    def _take(self, shipped: Any) -> Any:
        from .pipeline.state import Shipped

        raise_if_error(shipped)  # (in its place among its worker's items)
        self.yielded += 1
        if not isinstance(shipped, Shipped):
            return shipped
        worker = _worker_of(shipped)
        state = shipped.state
        if "played" in state:  # saved workers' slots, played by this worker
            played = self.played.setdefault(worker, {})
            for slot, one in state["played"].items():
                played[slot] = went_on(played.get(slot), one)
            self.played_left[worker] = int(state.get("left", -1))
            self.last_worker = worker
            return shipped.item
        self.states[worker] = went_on(self.states[worker], state)
        self.last_worker = worker
        return shipped.item

    def state_dict(self) -> dict[str, Any]:
        workers = self.loader.num_workers
        states = list(self.states)
        for worker, played in self.played.items():
            states[worker] = self._playing_state(worker, played)
        if not workers:
            dataset = self.loader.dataset
            states = [dataset.state_dict() if hasattr(dataset, "state_dict") else None]
        here = _where()
        return {"version": 1, "kind": "WebLoader", "epoch": max(self.current, 0),
                "yielded": self.yielded, "num_workers": workers,
                "batch_size": self.loader.batch_size, "last_worker": self.last_worker,
                "rank": here.rank, "world_size": here.world_size, "workers": states}

    def _playing_state(self, worker: int, played: dict[int, Any]) -> dict[str, Any]:
        """The state of a worker that plays saved workers' slots (as its dataset's book would
        give it, :meth:`~wds_cloud.pipeline.state.ResumeBook.state_dict`)."""
        here = _where()
        return self.loader.dataset.book.playing_state(
            here.rank, here.world_size, worker, self.loader.num_workers,
            max(self.current, 0), [played[slot] for slot in sorted(played)],
            self.played_left.get(worker, -1))

    def load_state_dict(self, state: dict[str, Any], *, on_mismatch: str) -> None:
        if state.get("kind") not in ("WebLoader", "merged"):
            raise ResumeError(f"not a WebLoader's state (kind {state.get('kind')!r})",
                              field="kind")
        here, workers = _where(), self.loader.num_workers
        shape = (state.get("world_size", here.world_size), state.get("num_workers"),
                 state.get("batch_size"))
        same = shape == (here.world_size, workers, self.loader.batch_size)
        if state["kind"] == "merged" and same:
            state = _rank_state(state, here.rank)
        elif state["kind"] == "merged" or not same:
            self._load_slots(state, here, on_mismatch)
            return
        for name, now in (("num_workers", self.loader.num_workers),
                          ("batch_size", self.loader.batch_size)):
            if state.get(name) != now and on_mismatch != "reseed":
                raise ResumeError(f"cannot resume exactly: {name} differs (saved "
                                  f"{state.get(name)!r}, now {now!r}); load it with "
                                  "on_mismatch='reseed' to go on statistically", field=name)
        dataset = self.loader.dataset
        load = getattr(dataset, "load_state_dict", None)
        if load is None:
            raise ResumeError(f"the dataset {type(dataset).__name__} keeps no state",
                              field="kind")
        workers = self.loader.num_workers
        saved = list(state.get("workers") or [])
        if workers:
            load({"workers": saved, "epoch": state["epoch"]}, on_mismatch=on_mismatch)
        elif saved and saved[0]:
            load(saved[0], on_mismatch=on_mismatch)
        self.epoch = int(state["epoch"])
        if workers and len(saved) == workers:
            self.resume = {"workers": saved, "yielded": int(state.get("yielded", 0)),
                           "last_worker": int(state.get("last_worker", -1))}


    def _load_slots(self, state: dict[str, Any], here: WorkerInfo, on_mismatch: str) -> None:
        """Resume on another shape (ranks, workers, batch size): each worker plays the slots
        of the saved workers given to it (:mod:`wds_cloud.pipeline.slots`)."""
        from .pipeline.slots import assign, merge_state_dicts

        merged = state if state["kind"] == "merged" else merge_state_dicts([state])
        dataset = self.loader.dataset
        if getattr(dataset, "load_state_dict", None) is None:
            raise ResumeError(f"the dataset {type(dataset).__name__} keeps no state",
                              field="kind")
        dataset.load_state_dict(merged, on_mismatch=on_mismatch)
        self.epoch = int(merged["epoch"])
        workers = self.loader.num_workers
        self.resume_played = {
            worker: {slot_of(s): s for s in assign(merged["slots"], WorkerInfo(
                here.rank, here.world_size, worker, workers))}
            for worker in range(workers)}
        log.info("resuming a job of %s ranks x %s workers on %d x %d: %d saved workers' "
                 "slots go on in this rank's workers", merged["world_size"],
                 merged["num_workers"], here.world_size, workers,
                 sum(len(p) for p in self.resume_played.values()) if workers
                 else len(assign(merged["slots"], here)))


def shut_on_error(loader: Any, it: Any, items: Iterator[Any]) -> Iterator[Any]:
    """``items`` (from torch's iterator ``it`` over ``loader``'s workers); when they end in an
    error (a worker's, raised here), ``it``'s workers are shut down at once. The error's
    traceback holds ``it`` in a reference cycle: left to the garbage collector, it could be
    collected in a process forked meanwhile (the next loader's workers), where torch's
    shutdown fails ("can only test a child process"), and the workers would live until a
    collection here. Persistent workers stay: the DataLoader reuses them next pass."""
    try:
        yield from items
    except Exception:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None and not loader.persistent_workers:
            shutdown()
        raise


def _deepens(it: Any) -> bool:
    """Whether ``it`` is torch's iterator over workers as :meth:`EpochedLoader._deepened`
    knows it (torch 2.x: its prefetch factor and the call that asks a worker for an item)."""
    return all(hasattr(it, name) for name in ("_prefetch_factor", "_try_put_index",
                                              "_tasks_outstanding", "_shutdown"))


def _rank_state(merged: dict[str, Any], rank: int) -> dict[str, Any]:
    """A merged state loaded into a job of its own shape: this rank's loader state."""
    workers = int(merged["num_workers"])
    loader = merged.get("loaders", {}).get(str(rank), {})
    slots = merged["slots"][rank * workers:(rank + 1) * workers]
    return {"version": 1, "kind": "WebLoader", "epoch": merged["epoch"],
            "yielded": loader.get("yielded", 0), "last_worker": loader.get("last_worker", -1),
            "num_workers": workers, "batch_size": merged.get("batch_size"), "rank": rank,
            "world_size": merged["world_size"],
            "workers": [None if s.get("fresh") else s for s in slots]}


def _reported(items: Iterator[Any], every: int, report: Callable[[], None]) -> Iterator[Any]:
    for n, item in enumerate(items, 1):
        yield item
        if n % every == 0:
            report()


def _worker_of(shipped: Any) -> int:
    return int(shipped.state.get("worker", 0))


class ReportIO:
    """A WebLoader's ``worker_init_fn``: the worker also adds its remote I/O counts to its slots
    of ``counters`` (shared memory the loader reads) and, with ``ship``, makes its copy of the
    dataset send its resumable state along with each item (the dataset in the main process
    keeps yielding plain items), with ``group`` in groups (:func:`~wds_cloud.shipping.
    grouped`); then the user's ``init`` runs."""

    def __init__(self, counters: Any, init: Callable[[int], Any] | None,
                 ship: bool = False, sources: tuple[str, ...] = (), *,
                 group: bool = False) -> None:
        self.counters = counters
        self.init = init
        self.ship = ship
        self.sources = sources  # a spec's sources: counted per source too
        self.group = group

    def __call__(self, worker_id: int) -> None:
        from .stores.iostats import IO_FIELDS, SOURCE_FIELDS, report_io_to

        width = len(IO_FIELDS) + len(self.sources) * len(SOURCE_FIELDS)
        first = worker_id * width
        if first + width <= len(self.counters):  # num_workers was raised since: uncounted
            report_io_to(self.counters, first, self.sources)
        if self.ship:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            book = getattr(info.dataset, "book", None) if info is not None else None
            if book is not None:
                book.ship = True
                if self.group:
                    book.outgoing = functools.partial(grouped, worker=worker_id)
        if self.init is not None:
            self.init(worker_id)
