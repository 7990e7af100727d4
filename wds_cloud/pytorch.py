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
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from .dataloader import EpochedLoader, ReportIO
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
from .settings import Settings
from .shipping import Unship
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


def in_worker() -> bool:
    """Whether this process is a DataLoader (or MultiLoader) worker, whose items are pickled
    for the trip to the process that iterates the loader."""
    data = _loaded("torch.utils.data")
    return (data is not None and data.get_worker_info() is not None) \
        or loader_worker is not None


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
        # items made in the dataset (batch_size=None) go in groups when small and quick:
        # torch's own batching asks the dataset for one item at a time
        group = ship and loader.batch_size is None
        if loader.num_workers > 0:  # each worker packs its items, with its state if it ships
            loader.collate_fn = Unship(loader.collate_fn)
        self._io_counters: Any = None
        if loader.num_workers > 0:
            import multiprocessing

            context = loader.multiprocessing_context or multiprocessing.get_context()
            width = len(IO_FIELDS) + len(self._sources) * len(SOURCE_FIELDS)
            self._io_counters = context.RawArray("q", loader.num_workers * width)
            loader.worker_init_fn = ReportIO(self._io_counters, loader.worker_init_fn, ship,
                                              self._sources, group=group)
        epoched = EpochedLoader(loader)
        epoched.grouped = group
        # small items get more in flight per worker (EpochedLoader._deepened), unless the
        # caller chose how many
        epoched.deepen = loader.num_workers > 0 and kw.get("prefetch_factor") is None
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
    def _epoched(self) -> EpochedLoader:
        source = self.pipeline[0]
        epoched: EpochedLoader = getattr(source, "epoched", source)  # (slots=: canonical)
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
