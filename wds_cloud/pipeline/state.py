"""Resumable state: where a dataset's iteration stands, saved and restored exactly.

Every stateful stage keeps its position here, as a small flat dict of ints and strings
(``state_dict()``/``load_state_dict()`` follow PyTorch's ``Stateful`` protocol, so torchdata's
``StatefulDataLoader`` works unchanged):

* the iteration: seed, epoch, slot (rank, world size, worker, workers) and the items the
  dataset yielded in this epoch (``yielded``);
* each source's reader (:class:`~wds_cloud.tar.shardloop.ShardCursor`): shards started in the
  source's shard stream, the current shard's URL and ETag/generation, the byte offset of its
  next sample and its sample ordinal (``src.<i>.*``);
* the mix: samples drawn (``mix.n``), from which its generator is replayed (no I/O);
* the shuffle buffer (:class:`~wds_cloud.pipeline.shufflestate.ResumableShuffle`): draws
  used and, per buffered sample, a 32-byte reference (source, shard, ordinal, byte offset),
  never its bytes.

A restore replays what costs no I/O (keyed generators, shard orders), reopens each source's
current shard at its byte offset (a ranged GET; ``pipe:``, stdin and compressed shards re-read
the shard's start) and refetches the buffered samples, one read per shard. With the same
spec, seed, world size, workers and batch size and unchanged objects, what follows the restore
equals what the uninterrupted run yielded. A state that does not fit raises
:class:`~wds_cloud.errors.ResumeError` naming the field; ``on_mismatch="reseed"`` goes on
from the saved epoch and count with fresh streams instead, with a WARNING. A state of another
shape (ranks, workers: every rank's, joined by :func:`~wds_cloud.pipeline.slots.
merge_state_dicts`) is played as slots (:mod:`~wds_cloud.pipeline.slots`).

The :class:`ResumeBook` is per dataset and per process: pickled with the dataset into
DataLoader workers (with a state loaded to restore), never with live positions.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from ..errors import ConfigError, ResumeError
from ..tar.shardloop import ShardCursor
from .shards import WorkerInfo

__all__ = [
    "SHIP_EVERY",
    "STATE_VERSION",
    "Ref",
    "RefSource",
    "ResumeBook",
    "Shipped",
    "decode_refs",
    "encode_refs",
    "fingerprint",
    "refetch",
    "track_shards",
]

log = logging.getLogger(__name__)

STATE_VERSION = 1
#: a WebLoader's worker sends its whole state with every this many items (see ``counted``)
SHIP_EVERY = 8
#: a buffered sample: (source index, shard index in the source's stream, ordinal, byte offset)
Ref = tuple[int, int, int, int]
State = dict[str, Any]

_FIT = ("world_size", "num_workers", "rank", "worker")
_END: Any = object()


def fingerprint(*parts: object) -> str:
    """A short stable digest of what a dataset reads (spec, URLs), to tell datasets apart."""
    digest = hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()
    return digest[:16]


def encode_refs(refs: Iterable[Ref]) -> str:
    """``refs`` as one string (base64 of little-endian int64s: about 43 bytes per ref)."""
    import numpy as np  # (here, not at import: a dataset that never saves a state skips it)

    flat = np.fromiter(itertools.chain.from_iterable(refs), dtype="<i8")
    return base64.b64encode(flat.tobytes()).decode("ascii")


def decode_refs(text: str) -> list[Ref]:
    """The refs of :func:`encode_refs`."""
    import numpy as np

    flat = np.frombuffer(base64.b64decode(text), dtype="<i8").reshape(-1, 4).tolist()
    return [(a, b, c, d) for a, b, c, d in flat]


#: reads shard items of source ``i`` into samples, keeping ``cursor``
SourceReader = Callable[[Iterable[dict[str, Any]], int, ShardCursor], Iterator[Any]]
_HISTORY = 4096  # shards remembered per source, for the references of buffered samples


def track_shards(book: ResumeBook, i: int, cursor: ShardCursor,
                 items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The shard items of source ``i``, resumed where ``book`` says, its position kept in
    ``book`` as ``src.<i>.*`` (and each shard's URL and version as ``ref.<i>.<k>`` while a
    buffered sample may point to it)."""
    prefix = f"src.{i}."
    started = int(book.get(prefix + "started", 0))
    history: dict[int, str] = {}

    def state() -> State:
        out: State = {prefix + "started": cursor.started, prefix + "url": cursor.url,
                      prefix + "version": cursor.version, prefix + "ordinal": cursor.ordinal,
                      prefix + "offset": cursor.next_offset(),
                      prefix + "done": int(cursor.done)}
        return out

    def refs() -> dict[int, str]:
        return history

    book.part(prefix, state)
    book.histories[i] = refs
    it = iter(items)
    k = 0  # the index of the next item in the source's shard stream
    if started:
        done = int(book.get(prefix + "done", 1))
        k = started if done else started - 1
        for _ in range(k):
            if next(it, None) is None:
                break
        cursor.started = k
        if not done:
            item = dict(next(it))
            item.update(offset=int(book.get(prefix + "offset", -1)),
                        ordinal=int(book.get(prefix + "ordinal", 0)),
                        version=str(book.get(prefix + "version", "")),
                        reseed=book.on_mismatch == "reseed")
            it = itertools.chain([item], it)
    for item in it:
        history[k] = str(item.get("url", ""))
        if len(history) > _HISTORY:
            del history[next(iter(history))]
        k += 1
        yield item


def refetch(book: ResumeBook, refs: list[Ref], read: SourceReader) -> list[Any]:
    """The samples of ``refs``, in order: each shard read once, from the first sample wanted
    (a ranged read; the start of the shard when the offset is not known)."""
    wanted: dict[tuple[int, int], dict[int, int]] = {}
    for n, (i, k, ordinal, _) in enumerate(refs):
        wanted.setdefault((i, k), {})[ordinal] = n
    starts: dict[tuple[int, int], tuple[int, int]] = {}
    for i, k, ordinal, offset in refs:
        first = starts.get((i, k))
        if first is None or ordinal < first[0]:
            starts[(i, k)] = (ordinal, offset)
    out: list[Any] = [None] * len(refs)
    for (i, k), ordinals in wanted.items():
        url = book.get(f"ref.{i}.{k}")
        if not url:
            raise ResumeError(f"the state has no URL for shard {k} of source {i}, which a "
                              "buffered sample comes from", field="shuffle.buffer")
        ordinal, offset = starts[(i, k)]
        cursor = ShardCursor()
        item = {"url": url, "offset": offset, "ordinal": ordinal}
        samples = read([item], i, cursor)
        try:
            left = len(ordinals)
            for sample in samples:
                at = ordinals.get(cursor.last()[0])
                if at is not None:
                    out[at] = sample
                    left -= 1
                    if not left:
                        break
        finally:
            close = getattr(samples, "close", None)
            if close is not None:
                close()
        missing = [o for o, n in ordinals.items() if out[n] is None]
        if missing:
            raise ResumeError(f"{url}: samples {missing[:5]} of the saved shuffle buffer "
                              "are not in the shard any more", field="version")
    return out


class RefSource(Protocol):
    """What a resumable shuffle reads from: the reference of the sample it yielded last, and
    the samples of references, refetched."""

    def last_ref(self) -> Ref: ...

    def refetch(self, refs: list[Ref]) -> list[Any]: ...


class ResumeBook:
    """The resumable position of one dataset in this process (see the module docstring).

    ``fingerprint`` names what the dataset reads; ``seed`` its seed and ``seed_chosen``
    whether the user chose it (a state's seed is adopted when not). Stages register
    ``part(name, fn)`` while they run; :meth:`state_dict` gathers them.
    """

    def __init__(self, kind: str, fingerprint: str, seed: int, *, seed_chosen: bool) -> None:
        self.kind = kind
        self.fingerprint = fingerprint
        self.seed = seed
        self.seed_chosen = seed_chosen
        self.on_mismatch = "raise"
        #: a loaded state, for the next iteration: one worker's, or ``{"workers": [...]}``
        self.pending: State | None = None
        #: sent along with every item (a WebLoader's workers): ``(item, state)``
        self.ship = False
        #: what a worker's shipped items go out through (``outgoing(items)``, e.g. grouped
        #: for the trip: :func:`wds_cloud.shipping.grouped`), if anything
        self.outgoing: Callable[[Iterator[Shipped]], Iterator[Any]] | None = None
        self.unsupported = ""  # why this dataset cannot resume, if it cannot
        #: its streams never end (resampled): a resume on another shape may share the rest
        #: of an epoch evenly over the new ranks (:mod:`~wds_cloud.pipeline.slots`)
        self.endless = False
        #: the pipeline's stages (:func:`~wds_cloud.pipeline.stagecheck.describe_stages`)
        self.stages = ""
        #: ``adapt(state)``: a state of another fingerprint made to fit this dataset (a mix
        #: whose sources changed, :func:`~wds_cloud.spec.remix.remap_state`), if it can be
        self.adapt: Callable[[State], State] | None = None
        self._reset()

    def _reset(self) -> None:
        self.restoring: State = {}
        self.parts: dict[str, Callable[[], State]] = {}
        self.yielded = 0
        self.limit = -1  # items this iteration yields in all, when known (with_epoch)
        self.epoch = -1
        self.info = WorkerInfo()
        #: the epoch keys of the iteration's shard stages (a shard list's, for its shuffle)
        self.key: list[int] = []
        self.histories: dict[int, Callable[[], dict[int, str]]] = {}
        #: the saved workers' states this worker plays (a run resumed on another shape,
        #: :mod:`~wds_cloud.pipeline.slots`), and their copies' books once they run
        self.slotted: list[State] | None = None
        self.slot_books: dict[int, ResumeBook] = {}
        self.slot_started: set[int] = set()
        #: every saved worker's state (for the quota of each), and this worker's quota left
        self.merged_slots: list[State] | None = None
        self.slot_left: int | None = None
        self.slot_canonical = False  # canonical slots (WebLoader(slots=)): each to its end

    def __getstate__(self) -> State:
        state = dict(self.__dict__)
        for live in ("restoring", "parts", "yielded", "limit", "epoch", "info", "key",
                     "histories", "slotted", "slot_books", "slot_started", "merged_slots",
                     "slot_left", "slot_canonical"):
            state.pop(live, None)
        return state

    def __setstate__(self, state: State) -> None:
        self.__dict__.update(state)
        self._reset()

    # -- the iteration -----------------------------------------------------------------------

    def begin(self, info: WorkerInfo) -> None:
        """An iteration starts here: take this worker's loaded state, if there is one."""
        self._reset()
        self.info = info
        pending, self.pending = self.pending, None
        if pending is None:
            return
        state = pending
        if pending.get("kind") == "merged":  # another shape: play the slots given to me
            from .slots import assign

            self.slotted = assign(pending["slots"], info)
            self.merged_slots = [dict(one) for one in pending["slots"]]
            self.slot_canonical = bool(pending.get("canonical"))
            self.restoring = {"epoch": pending.get("epoch", -1)}
            self.epoch = int(pending.get("epoch", -1))
            return
        if pending.get("fresh"):  # a saved worker that had yielded nothing: a fresh epoch
            self.restoring = {"epoch": pending.get("epoch", -1), "yielded": 0}
            return
        if "workers" in pending:
            states = pending["workers"]
            if len(states) != info.num_workers:
                self._mismatch("num_workers", len(states), info.num_workers)
                return
            state = states[info.worker] or {}
            if not state:  # this worker had yielded nothing: its epoch starts afresh
                self.restoring = {"epoch": pending.get("epoch", -1), "yielded": 0}
                return
        if not self._fits(state, info):
            return
        if "slots" in state:  # this worker was playing saved workers' slots: go on with them
            self.slotted = [dict(one) for one in state["slots"]]
            self.merged_slots = self.slotted
            if int(state.get("left", -1)) >= 0:
                self.slot_left = int(state["left"])
            self.restoring = {"epoch": state.get("epoch", -1)}
            self.epoch = int(state.get("epoch", -1))
            return
        self.restoring = state
        self.yielded = int(state.get("yielded", 0))

    def _check_kind(self, state: State) -> None:
        if state.get("version") != STATE_VERSION or state.get("kind") != self.kind:
            raise ResumeError(
                f"this state is of a {state.get('kind')!r} dataset (state version "
                f"{state.get('version')}), not of this {self.kind!r} one (version "
                f"{STATE_VERSION})", field="kind")

    def _fits(self, state: State, info: WorkerInfo) -> bool:
        self._check_kind(state)
        if state.get("unsupported"):
            raise ResumeError(f"the saved dataset could not resume: {state['unsupported']}",
                              field="unsupported")
        checks = [("fingerprint", state.get("fingerprint"), self.fingerprint),
                  ("seed", state.get("seed"), self.seed)]
        checks += [(name, state.get(name), getattr(info, name)) for name in _FIT]
        for name, saved, now in checks:
            if saved != now:
                self._mismatch(name, saved, now)
                return False
        return True

    def _mismatch(self, name: str, saved: object, now: object) -> None:
        what = {"fingerprint": "the dataset (spec or shard list)"}.get(name, name)
        message = (f"cannot resume exactly: {what} differs (saved {saved!r}, now {now!r})")
        if self.on_mismatch != "reseed":
            raise ResumeError(message + "; load it with on_mismatch='reseed' to go on "
                              "statistically", field=name)
        log.warning("%s; going on with fresh streams (on_mismatch='reseed')", message)

    def _adapted(self, state: Mapping[str, Any]) -> Mapping[str, Any]:
        """``state`` with each worker's state of another fingerprint adapted, where
        :attr:`adapt` can (the rest are left to the fingerprint check)."""
        if self.adapt is None:
            return state

        def one(worker: Any) -> Any:
            if worker and "slots" in worker:  # (its slots may be of another fingerprint)
                return {**worker, "slots": [one(s) for s in worker["slots"]]}
            if not worker or worker.get("fresh") or worker.get("fingerprint") == self.fingerprint:
                return worker
            self._check_kind(worker)
            assert self.adapt is not None
            try:
                return self.adapt(dict(worker))
            except ResumeError:
                if self.on_mismatch != "reseed":
                    raise
                return worker  # the fingerprint check reseeds it, with a WARNING

        if "workers" in state:
            return {**state, "workers": [one(w) for w in state["workers"]]}
        if state.get("kind") == "merged":
            return {**state, "slots": [one(s) for s in state["slots"]]}
        return one(state)

    def get(self, key: str, default: Any = None) -> Any:
        """A value of the state this iteration resumes from (``default`` if fresh)."""
        return self.restoring.get(key, default)

    def part(self, name: str, fn: Callable[[], State]) -> None:
        """Register a stage's live state (``fn()`` gives its keys, prefixed with ``name``)."""
        self.parts[name] = fn

    def counted(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items``, counting them. A restore whose state says ``replay: r`` drops the
        first r (they were yielded after the state was taken, see below).

        When :attr:`ship` (a WebLoader's worker), each item goes out as :class:`Shipped`
        with a state: the whole state with the first item and every :data:`SHIP_EVERY`-th,
        and in between only ``{"replay": r, ...}``, the items since the last whole one, so
        that a worker does not encode its shuffle buffer for every batch. A loader's state is
        the last whole state plus ``replay``; a restore replays those few items from it."""
        for _ in range(int(self.restoring.get("replay", 0))):
            if next(items, _END) is _END:
                return
            self.yielded += 1
        if not self.ship:
            for item in items:
                self.yielded += 1
                yield item
            return
        shipped = self._shipped(items)
        yield from shipped if self.outgoing is None else self.outgoing(shipped)

    def _shipped(self, items: Iterator[Any]) -> Iterator[Shipped]:
        since = SHIP_EVERY
        for item in items:
            self.yielded += 1
            if since >= SHIP_EVERY:
                since = 0
                yield Shipped(item, self.state_dict())
                continue
            since += 1
            yield Shipped(item, {"replay": since, "worker": self.info.worker,
                                 "yielded": self.yielded, "left": self._left()})

    def _left(self) -> int:
        return self.limit - self.yielded if self.limit >= 0 else -1

    # -- the protocol ------------------------------------------------------------------------

    def state_dict(self) -> State:
        """This process's position: a flat dict of ints and strings (with ``slots``, the
        states of the saved workers it plays, after a resume on another shape)."""
        info = self.info
        if self.slotted is not None:
            return self._played_state()
        state: State = {
            "version": STATE_VERSION, "kind": self.kind, "fingerprint": self.fingerprint,
            "seed": self.seed, "epoch": self.epoch, "yielded": self.yielded,
            "left": self._left(),
            "rank": info.rank, "world_size": info.world_size, "worker": info.worker,
            "num_workers": info.num_workers,
        }
        if self.unsupported:
            state["unsupported"] = self.unsupported
        if self.stages:
            state["stages"] = self.stages
        for fn in self.parts.values():
            state.update(fn())
        return state

    def _played_state(self) -> State:
        from .slots import slot_of

        slots = []
        for saved in self.slotted or []:
            j = slot_of(saved)
            book = self.slot_books.get(j)
            slots.append(book.state_dict() if book is not None and j in self.slot_started
                         else saved)
        info = self.info
        return self.playing_state(info.rank, info.world_size, info.worker, info.num_workers,
                                  self.epoch, slots,
                                  -1 if self.slot_left is None else self.slot_left)

    def playing_state(self, rank: int, world_size: int, worker: int, num_workers: int,
                      epoch: int, slots: list[State], left: int) -> State:
        """The state of a worker of this dataset that plays ``slots`` (saved workers'
        states), with ``left`` items of its quota (-1: none)."""
        return {"version": STATE_VERSION, "kind": self.kind, "fingerprint": self.fingerprint,
                "seed": self.seed, "epoch": epoch, "rank": rank, "world_size": world_size,
                "worker": worker, "num_workers": num_workers, "slots": slots, "left": left}

    def load_state_dict(self, state: Mapping[str, Any], *, on_mismatch: str = "raise") -> None:
        """Resume from ``state`` at the next iteration (in this process, or in the workers it
        is pickled to). A state with ``workers`` holds one state per DataLoader worker."""
        if on_mismatch not in ("raise", "reseed"):
            raise ConfigError(f"on_mismatch={on_mismatch!r}: 'raise' or 'reseed'")
        if not isinstance(state, Mapping):
            raise ResumeError(f"a state_dict is a dict, got {type(state).__name__}",
                              field="state")
        from .slots import plain_states

        self.on_mismatch = on_mismatch
        state = self._adapted(state)
        for one in plain_states(state):
            if one and one.get("fresh"):
                continue
            if one and one.get("fingerprint") != self.fingerprint:  # a changed spec: say so now
                self._check_kind(one)
                self._mismatch("fingerprint", one.get("fingerprint"), self.fingerprint)
                if on_mismatch == "reseed":
                    break
            if one and one.get("seed") != self.seed:
                if self.seed_chosen:
                    self._mismatch("seed", one.get("seed"), self.seed)
                    if on_mismatch == "reseed":
                        return
                else:
                    self.seed = int(one["seed"])  # no seed was chosen: take the saved one
        self.pending = dict(state)


class Shipped:
    """An item sent from a DataLoader worker with the state after it."""

    __slots__ = ("item", "state")

    def __init__(self, item: Any, state: State) -> None:
        self.item = item
        self.state = state
