"""Everything that knows about PyTorch; the only module of wds_cloud that imports torch.

torch is never imported at module import time, and only :class:`WebLoader` imports it: building
and iterating datasets never does, and everything works without torch installed (as a single
process):

* :func:`worker_info` finds the rank and worker: ``RANK``/``WORLD_SIZE`` and
  ``WORKER``/``NUM_WORKERS`` from :class:`~wds_cloud.settings.Settings` first (as webdataset),
  then ``torch.distributed`` and ``torch.utils.data.get_worker_info()``. It only asks torch when
  torch is already imported in this process (a process that has not imported torch can be
  neither a DataLoader worker nor part of an initialized process group), so it never pays for
  importing torch.
* ``split_by_node``, ``split_by_worker``, ``single_node_only``, ``ResampledShards`` and
  ``resampled`` bind the helpers of :mod:`wds_cloud.pipeline.shards` (``node_share``,
  ``worker_share``, ``require_single_node``, ``ShardResampler``, ``resample_items``) to
  :func:`worker_info`; the shard-list names of :mod:`wds_cloud.pipeline.shards` are re-exported
  so this module can stand in for webdataset's ``shardlists``.
* IterableDataset, without importing torch: see :mod:`wds_cloud.torch_datasets`. Constructing
  a :class:`DataPipeline` (so ``WebDataset``, ``FluidWrapper``, ``MultiShardSample``,
  ``WebLoader``) or ``ResampledShards``, unpickling one (in a DataLoader worker started with
  ``spawn``), or looking up a dataset class on ``wds_cloud`` calls
  :func:`register_torch_datasets`; ``import wds_cloud`` does not.
* :class:`WebLoader` is webdataset's: a pipeline (with the fluid methods) whose source is a
  ``DataLoader``. Before each pass over the DataLoader it calls ``set_epoch(epoch)`` on the
  dataset, so workers started afresh each epoch (``persistent_workers=False``) see the epoch.
  Its :meth:`WebLoader.io_stats` sums the remote I/O counters of its workers, which
  ``wds.io_stats()`` (per process) cannot see.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from .errors import ConfigError, MissingDependencyError, ResumeError
from .pipeline import core as pipeline
from .pipeline import shards
from .pipeline.directory import DirectoryShardList
from .pipeline.fluid import FluidInterface
from .pipeline.shards import (
    SimpleShardList,
    WorkerInfo,
    WorkerInfoSource,
    derive_seed,
    non_empty,
    shardspec,
)
from .pipeline.slots import slot_of
from .pipeline.state import STATE_VERSION
from .settings import Settings
from .torch_datasets import TorchDataset, register_torch_datasets

__all__ = [
    "DataPipeline",
    "DirectoryShardList",
    "ResampledShards",
    "SimpleShardList",
    "WebLoader",
    "WorkerInfo",
    "derive_seed",
    "non_empty",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "register_torch_datasets",
    "resampled",
    "set_epoch",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "worker_info",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


def _loaded(name: str) -> Any:
    """Module ``name`` if this process has imported it (``None`` also when it is blocked with
    ``sys.modules[name] = None``). Never imports: a process that has not imported torch is
    neither a DataLoader worker nor in a process group, and must not pay for torch."""
    return sys.modules.get(name)


def _node_from_torch(group: object) -> tuple[int, int]:
    dist = _loaded("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    group = group if group is not None else dist.group.WORLD
    return dist.get_rank(group=group), dist.get_world_size(group=group)


#: ``(worker, num_workers)`` of this process when it is a worker of a
#: :class:`wds_cloud.multi.MultiLoader` (which sets it, as torch sets its worker info in a
#: DataLoader worker); ``None`` otherwise
loader_worker: tuple[int, int] | None = None


def _worker_from_torch() -> tuple[int, int, int | None]:
    data = _loaded("torch.utils.data")
    info = None if data is None else data.get_worker_info()
    if info is None:
        return (*loader_worker, None) if loader_worker is not None else (0, 1, None)
    return info.id, info.num_workers, info.seed


def worker_info(settings: Settings | None = None, *, group: object = None) -> WorkerInfo:
    """Where this code runs: rank/world size, DataLoader worker/count and torch's worker seed.

    Rank and world size come from ``RANK``/``WORLD_SIZE`` when both are set, else from
    ``torch.distributed`` (process ``group``, default WORLD) when initialized, else 0/1. Worker
    and count come from ``WORKER``/``NUM_WORKERS`` when both are set, else from the DataLoader
    (or the :class:`~wds_cloud.multi.MultiLoader`) this process is a worker of.
    ``settings`` defaults to ``Settings.from_env()``.
    """
    if shards.playing is not None:  # a saved worker's slot, played here (pipeline/slots.py)
        return shards.playing
    s = Settings.from_env() if settings is None else settings
    if s.rank is not None and s.world_size is not None:
        rank, world_size = s.rank, s.world_size
    else:
        rank, world_size = _node_from_torch(group)
    worker, num_workers, seed = _worker_from_torch()
    if s.worker is not None and s.num_workers is not None:
        worker, num_workers = s.worker, s.num_workers
    return WorkerInfo(rank, world_size, worker, num_workers, seed)


def pytorch_worker_info(group: object = None) -> tuple[int, int, int, int]:
    """webdataset's ``utils.pytorch_worker_info``: ``(rank, world_size, worker, num_workers)``
    of this process, found as :func:`worker_info` finds them (``RANK``/``WORLD_SIZE``, else
    ``torch.distributed`` in process ``group``; ``WORKER``/``NUM_WORKERS``, else the
    DataLoader worker), read now."""
    info = worker_info(group=group)
    return info.rank, info.world_size, info.worker, info.num_workers


def pytorch_worker_seed(group: object = None) -> int:
    """webdataset's ``utils.pytorch_worker_seed``: ``rank * 1000 + worker``."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker


def _source(worker_info_arg: WorkerInfoSource, group: object = None) -> WorkerInfoSource:
    if worker_info_arg is not None:
        if group is not None:
            raise ConfigError("give a process group or worker_info=, not both")
        return worker_info_arg
    if group is None:
        return worker_info
    return functools.partial(worker_info, group=group)


def split_by_node(
    src: Iterable[T], group: object = None, *, worker_info: WorkerInfoSource = None
) -> Iterator[T]:
    """Keep every ``world_size``-th item starting at this node's rank (see :func:`worker_info`)."""
    return shards.node_share(src, worker_info=_source(worker_info, group))


def split_by_worker(src: Iterable[T], *, worker_info: WorkerInfoSource = None) -> Iterator[T]:
    """Keep every ``num_workers``-th item starting at this DataLoader worker's id."""
    return shards.worker_share(src, worker_info=_source(worker_info))


def single_node_only(
    src: Iterable[T], group: object = None, *, worker_info: WorkerInfoSource = None
) -> Iterator[T]:
    """Pass items through; raise ConfigError when running on more than one node."""
    return shards.require_single_node(src, worker_info=_source(worker_info, group))


def resampled(
    n: int = sys.maxsize, *, seed: int | None = None, worker_info: WorkerInfoSource = None
) -> pipeline.stage:
    """Stage: collect the input, then yield ``n`` items drawn with replacement.

    See :func:`wds_cloud.pipeline.shards.resample_items`; the worker comes from :func:`worker_info`.
    """
    return pipeline.stage(shards.resample_items, n, seed=seed, worker_info=_source(worker_info))


class DataPipeline(TorchDataset, pipeline.Pipeline):
    """webdataset's ``DataPipeline``: a torch ``IterableDataset`` whenever torch is imported,
    before or after it is built; it never imports torch itself.

    Same as :class:`wds_cloud.pipeline.Pipeline`, plus :func:`register_torch_datasets` when
    constructed or unpickled, and :meth:`set_epoch`.
    """

    #: rank and worker from torch (and the environment), for per-rank epochs
    worker_info = staticmethod(worker_info)

    def __init__(self, *args: Any, **kw: Any) -> None:
        register_torch_datasets()
        super().__init__(*args, **kw)

    def set_epoch(self, epoch: int) -> None:
        """Tell each stage that keeps epochs (shard lists, shuffles) that the next is ``epoch``."""
        for stage in self.pipeline:
            set_epoch(stage, epoch)


class ResampledShards(TorchDataset, shards.ShardResampler):
    """:class:`~wds_cloud.pipeline.shards.ShardResampler` with the rank and worker from
    :func:`worker_info`.

    The stream is different for each rank, worker and epoch; see
    :mod:`wds_cloud.pipeline.shards` for how epochs survive DataLoader workers that are
    restarted every epoch.
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        nshards: int = sys.maxsize,
        seed: int = 0,
        worker_seed: Callable[[], int] | None = None,
        deterministic: bool = False,
        max_urls: int = int(1e6),
        empty_check: bool = True,
        *,
        worker_info: WorkerInfoSource = None,
        url_vars: Mapping[str, str] | None = None,
    ) -> None:
        register_torch_datasets()
        super().__init__(
            urls, nshards, seed, worker_seed, deterministic, max_urls, empty_check,
            worker_info=_source(worker_info), url_vars=url_vars,
        )


def set_epoch(obj: object, epoch: int) -> None:
    """Tell ``obj`` (a dataset, pipeline or stage) that the next iteration is epoch ``epoch``.

    Calls ``obj.set_epoch`` if it has one; otherwise walks a pipeline's stages and tells each.
    webdataset's ``detshuffle`` stage (which counts epochs itself) is set so that its next run
    is ``epoch``.
    """
    method = getattr(obj, "set_epoch", None)
    if callable(method):
        method(epoch)
        return
    from .pipeline.filters import detshuffle

    if isinstance(obj, detshuffle):
        obj.epoch = epoch - 1
        return
    stages = getattr(obj, "pipeline", None)
    if isinstance(obj, pipeline.Pipeline) and isinstance(stages, list):
        for stage in stages:
            set_epoch(stage, epoch)


class _EpochedLoader:
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

    def __iter__(self) -> Iterator[Any]:
        dataset = self.loader.dataset
        set_epoch(dataset, self.epoch)
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
        it = iter(self.loader)
        book = getattr(dataset, "book", None)
        if book is not None and workers:
            book.pending = None  # handed to the workers now; later passes start afresh
        out = self._counted(it) if not workers else self._unshipped(it, resume is not None)
        return out if self.reporting is None else _reported(out, *self.reporting)

    def _counted(self, it: Iterator[Any]) -> Iterator[Any]:
        for item in it:
            self.yielded += 1
            yield item

    def _unshipped(self, it: Iterator[Any], resumed: bool) -> Iterator[Any]:
        """Items without their states; after a restore, in the order the uninterrupted run
        had: round robin from the worker after the last one that yielded."""
        if not resumed:
            for shipped in it:
                yield self._take(shipped)
            return
        workers = self.loader.num_workers
        queues: list[deque[Any]] = [deque() for _ in range(workers)]
        exhausted = {w for w, st in enumerate(self.states) if st and st.get("left") == 0}
        turn = (self.last_worker + 1) % workers
        for shipped in it:
            queues[_worker_of(shipped)].append(shipped)
            while len(exhausted) < workers:
                if turn in exhausted:
                    turn = (turn + 1) % workers
                    continue
                if not queues[turn]:
                    break
                item = queues[turn].popleft()
                if item.state.get("left") == 0:
                    exhausted.add(turn)
                yield self._take(item)
                turn = (turn + 1) % workers
        while any(queues):  # the end: what is left, in turn
            if queues[turn]:
                yield self._take(queues[turn].popleft())
            turn = (turn + 1) % workers

    def _take(self, shipped: Any) -> Any:
        from .pipeline.state import Shipped

        self.yielded += 1
        if not isinstance(shipped, Shipped):
            return shipped
        worker = _worker_of(shipped)
        state = shipped.state
        if "played" in state:  # saved workers' slots, played by this worker
            played = self.played.setdefault(worker, {})
            for slot, one in state["played"].items():
                played[slot] = _went_on(played.get(slot), one)
            self.played_left[worker] = int(state.get("left", -1))
            self.last_worker = worker
            return shipped.item
        self.states[worker] = _went_on(self.states[worker], state)
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
        here = worker_info()
        return {"version": 1, "kind": "WebLoader", "epoch": max(self.current, 0),
                "yielded": self.yielded, "num_workers": workers,
                "batch_size": self.loader.batch_size, "last_worker": self.last_worker,
                "rank": here.rank, "world_size": here.world_size, "workers": states}

    def _playing_state(self, worker: int, played: dict[int, Any]) -> dict[str, Any]:
        """The state of a worker that plays saved workers' slots (as its dataset's book would
        give it, :meth:`~wds_cloud.pipeline.state.ResumeBook.state_dict`)."""
        book = self.loader.dataset.book
        here = worker_info()
        return {"version": STATE_VERSION, "kind": book.kind, "fingerprint": book.fingerprint,
                "seed": book.seed, "epoch": max(self.current, 0), "rank": here.rank,
                "world_size": here.world_size, "worker": worker,
                "num_workers": self.loader.num_workers,
                "slots": [played[slot] for slot in sorted(played)],
                "left": self.played_left.get(worker, -1)}

    def load_state_dict(self, state: dict[str, Any], *, on_mismatch: str) -> None:
        if state.get("kind") not in ("WebLoader", "merged"):
            raise ResumeError(f"not a WebLoader's state (kind {state.get('kind')!r})",
                              field="kind")
        here, workers = worker_info(), self.loader.num_workers
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


class _Unship:
    """A WebLoader's ``collate_fn`` in its workers: collates the items (sent with their
    worker's state: the batch goes with the state after its last item) and packs the result
    for the trip to the main process (see :class:`_Packed`)."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, data: Any) -> Any:
        from .pipeline.state import Shipped

        if isinstance(data, Shipped):
            return _Packed(Shipped(self.collate(data.item), _after([data.state])))
        if isinstance(data, list) and data and isinstance(data[-1], Shipped):
            return _Packed(Shipped(self.collate([d.item for d in data]),
                                   _after([d.state for d in data])))
        return _Packed(self.collate(data))


def _after(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The state after the last of a batch's items, from the states sent with each (see
    :meth:`~wds_cloud.pipeline.state.ResumeBook.counted`): the last whole state among them
    with the count of items since (``replay``) of the last; for items of slots played
    (:mod:`wds_cloud.pipeline.slots`), that of each slot, under ``played``."""
    if "slot" not in states[-1]:
        return _last_of(states)
    by_slot: dict[int, list[dict[str, Any]]] = {}
    for state in states:
        by_slot.setdefault(int(state["slot"]), []).append(state["state"])
    return {"worker": states[-1]["worker"], "left": states[-1].get("left", -1),
            "played": {slot: _last_of(seq) for slot, seq in by_slot.items()}}


def _last_of(states: list[dict[str, Any]]) -> dict[str, Any]:
    last = states[-1]
    if "replay" not in last:
        return last
    whole = next((s for s in reversed(states) if "replay" not in s), None)
    return last if whole is None else {**whole, "replay": last["replay"], "left": last["left"]}


def _went_on(before: dict[str, Any] | None, state: dict[str, Any]) -> dict[str, Any]:
    """A worker's (or slot's) state after ``state`` came: a count of items since the last
    whole state goes with that whole state."""
    if "replay" in state and "fingerprint" not in state:
        return {**(before or {}), "replay": state["replay"], "left": state["left"]}
    return state


#: CPU tensors up to this many bytes travel inside the pickle of their batch
INLINE_TENSOR_BYTES = 64 << 10


class _Packed:
    """What a WebLoader's worker puts on the DataLoader's queue: ``item``, pickled so that
    small CPU tensors travel as their bytes. torch's own pickling of a tensor for another
    process puts its storage in shared memory and sends a file descriptor through a socket
    connection of its own (with an authentication challenge): about 2 ms per tensor here,
    where a batch of 64 numbers took 17 µs as bytes. Larger tensors go torch's way (one copy
    less). Unpickled in the main process, it is the item itself."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        import io

        buffer = io.BytesIO()
        _pickler(buffer).dump(self.item)
        return _unpacked, (buffer.getvalue(),)


def _unpacked(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


def _pickler(buffer: Any) -> Any:
    """torch's pickler for another process, with small CPU tensors as their bytes."""
    import copyreg
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # registers torch's reducers with ForkingPickler

    pickler = ForkingPickler(buffer, 5)
    table = dict(copyreg.dispatch_table)
    table.update(getattr(ForkingPickler, "_extra_reducers", {}))
    torch_reduce = table.get(torch.Tensor)

    def reduce(tensor: Any) -> Any:
        nbytes = tensor.numel() * tensor.element_size()
        if (type(tensor) is torch.Tensor and tensor.device.type == "cpu"
                and tensor.layout == torch.strided and not tensor.requires_grad
                and not tensor.is_quantized and nbytes <= INLINE_TENSOR_BYTES):
            import ctypes

            dense = tensor.contiguous()
            return _small_tensor, (ctypes.string_at(dense.data_ptr(), nbytes), tensor.dtype,
                                   tuple(tensor.shape))
        if torch_reduce is not None:
            return torch_reduce(tensor)
        return tensor.__reduce_ex__(5)

    table[torch.Tensor] = reduce
    pickler.dispatch_table = table
    return pickler


def _small_tensor(data: bytes, dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _ReportIO:
    """A WebLoader's ``worker_init_fn``: the worker also adds its remote I/O counts to its slots
    of ``counters`` (shared memory the loader reads) and, with ``ship``, makes its copy of the
    dataset send its resumable state along with each item (the dataset in the main process
    keeps yielding plain items); then the user's ``init`` runs."""

    def __init__(self, counters: Any, init: Callable[[int], Any] | None,
                 ship: bool = False, sources: tuple[str, ...] = ()) -> None:
        self.counters = counters
        self.init = init
        self.ship = ship
        self.sources = sources  # a spec's sources: counted per source too

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
        if self.init is not None:
            self.init(worker_id)


class WebLoader(DataPipeline, FluidInterface):
    """``torch.utils.data.DataLoader(*args, **kw)`` with webdataset's fluid methods.

    As in webdataset, this is a pipeline whose source is the DataLoader, so
    ``loader.unbatched().shuffle(1000).batched(64)`` re-batches in the main process. Each
    pass over the DataLoader is an epoch: before its workers start, ``set_epoch(epoch)`` is
    called on the dataset (see :func:`set_epoch`), counting from 0 (or from the value given to
    :meth:`set_epoch`). ``.dataloader`` is the wrapped DataLoader.

    :meth:`io_stats` is what its workers read and wrote remotely: each worker adds its counts
    to a slot of shared memory (through the DataLoader's ``worker_init_fn``, which still runs
    the one given).

    ``slots=S``: the dataset is read as ``S`` canonical slots and batched in the main
    process, so the global batches are the same on any shape (:mod:`wds_cloud.canonical`).
    A state saved by any shape loads into any other (:func:`~wds_cloud.pipeline.slots.
    merge_state_dicts` joins the ranks' states).
    """

    def __init__(self, *args: Any, stats_every: int | None = None, slots: int | None = None,
                 **kw: Any) -> None:
        try:
            from torch.utils.data import DataLoader  # the one place a dataset imports torch
        except ImportError as exc:
            raise MissingDependencyError("WebLoader", "torch", "torch") from exc
        register_torch_datasets()  # before DataLoader sees the dataset (built without torch?)
        from .stores.iostats import IO_FIELDS, SOURCE_FIELDS

        if slots is not None:  # the workers send samples; batches are made here
            if len(args) > 1:
                raise ConfigError("WebLoader(dataset, slots=..., batch_size=...): give the "
                                  "DataLoader's other arguments by keyword with slots")
            batch_size, collate = kw.pop("batch_size", 1), kw.pop("collate_fn", None)
            if collate is None:
                from torch.utils.data import default_collate as collate
            kw["batch_size"] = None
        loader = DataLoader(*args, **kw)
        spec = getattr(loader.dataset, "spec", None)
        self._sources = tuple(s.name for s in spec.sources) if spec is not None else ()
        ship = getattr(loader.dataset, "book", None) is not None and loader.num_workers > 0
        if loader.num_workers > 0:  # each worker packs its items, with its state if it ships
            loader.collate_fn = _Unship(loader.collate_fn)
        self._io_counters: Any = None
        if loader.num_workers > 0:
            import multiprocessing

            context = loader.multiprocessing_context or multiprocessing.get_context()
            width = len(IO_FIELDS) + len(self._sources) * len(SOURCE_FIELDS)
            self._io_counters = context.RawArray("q", loader.num_workers * width)
            loader.worker_init_fn = _ReportIO(self._io_counters, loader.worker_init_fn, ship,
                                              self._sources)
        epoched = _EpochedLoader(loader)
        if slots is None:
            super().__init__(epoched)
        else:
            from .canonical import CanonicalLoader

            super().__init__(CanonicalLoader(epoched, slots, batch_size, collate))
        if stats_every is not None:
            if isinstance(stats_every, bool) or not isinstance(stats_every, int) \
                    or stats_every < 1:
                raise ConfigError(f"WebLoader(stats_every={stats_every!r}): a number of "
                                  "batches >= 1")
            from .sourcestats import log_stats

            self._epoched.reporting = (stats_every,
                                       lambda: log_stats(self.stats(all_ranks=False)))

    def io_stats(self) -> dict[str, float]:
        """The remote I/O counters of ``wds.io_stats()`` (requests, retries, resumes,
        bytes read, failures, uploads, cache hits, shards, gets, and ``gets_per_shard``)
        summed over this loader's DataLoader workers and every epoch so far. What the main
        process does itself, and all the loading when ``num_workers=0``, is counted by
        ``wds.io_stats()`` instead."""
        from .sourcestats import gather
        from .stores.iostats import with_gets_per_shard

        counters = self._io_counters if self._io_counters is not None else []
        totals = gather(counters, self.dataloader.num_workers, self._sources, all_ranks=False)[0]
        return with_gets_per_shard(totals)

    def stats(self, *, all_ranks: bool = True) -> dict[str, Any]:
        """What the job saw, per spec source: ``{"samples", "ranks", "io", "sources": {name:
        {"samples", "shards", "requests", "bytes_read", "cache_hits", "retries", "resumes",
        "failures", "share", "configured"}}}``, summed over the DataLoader workers and every
        epoch so far, and with ``all_ranks`` over the ranks of ``torch.distributed`` when it
        is initialised (a collective: every rank calls it). ``share`` is a source's part of
        the samples its mix gave, ``configured`` what the spec asks for (with weight schedules,
        their mean over those samples). ``num_workers=0``: this process's counts. See
        :mod:`wds_cloud.sourcestats`."""
        from .sourcestats import loader_stats

        return loader_stats(self, self._io_counters, self._sources, all_ranks=all_ranks)

    @property
    def dataloader(self) -> Any:
        """The wrapped ``torch.utils.data.DataLoader``."""
        return self._epoched.loader

    @property
    def _epoched(self) -> _EpochedLoader:
        source = self.pipeline[0]
        epoched: _EpochedLoader = getattr(source, "epoched", source)  # (slots=: canonical)
        return epoched

    def set_epoch(self, epoch: int) -> None:
        """Number the next pass over the DataLoader ``epoch`` (e.g. when resuming)."""
        self._epoched.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands after the last batch it yielded (PyTorch's ``Stateful``
        protocol): the pass, the batches yielded in it, which worker yielded last, and each
        worker's dataset state as of its last batch yielded (batches prefetched but not yet
        yielded are not in it: they are produced again after a restore)."""
        if len(self.pipeline) > 1:
            raise ResumeError("a WebLoader with stages of its own (e.g. .unbatched()."
                              "shuffle(...)) keeps them out of its state; resume the loader "
                              "without them", field="stages")
        state: dict[str, Any] = self.pipeline[0].state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, on_mismatch: str = "raise") -> None:
        """Make the next pass continue where ``state`` stood: the batches after it equal
        those of the uninterrupted run (same dataset, seed, world size, workers, batch size
        and unchanged objects), or :class:`~wds_cloud.errors.ResumeError` names what
        differs."""
        self.pipeline[0].load_state_dict(dict(state), on_mismatch=on_mismatch)


#: webdataset's ``webdataset.pytorch`` names: torch's classes, or empty stand-ins without torch
_TORCH_NAMES = {"DataLoader": "torch.utils.data", "IterableDataset": "torch.utils.data",
                "TorchTensor": "torch"}


def __getattr__(name: str) -> Any:
    # imported when looked up, never with this module (``import wds_cloud`` stays torch-free)
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    try:
        attr = "Tensor" if name == "TorchTensor" else name
        value = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError:  # as webdataset: empty classes when torch is not installed
        value = type(name, (), {"__doc__": f"Empty stand-in for torch's {name} (no torch)."})
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_NAMES))
