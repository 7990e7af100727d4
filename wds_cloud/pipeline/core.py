"""Pipeline (the torch-free base of ``wds_cloud.DataPipeline``) and curried stages, with
webdataset 1.0's API.

A :class:`DataPipeline` is a source followed by stages. Each epoch it invokes the source to
get an iterator and hands that iterator to the next stage, and so on; whatever the last stage
returns is the epoch's stream of samples. A stage is any of:

* an iterable (a list, an IterableDataset, another pipeline): used as-is in first position;
* a :class:`PipelineStage`: its ``run(source)`` is called each epoch (it may keep state);
* a callable ``f(source) -> iterable``, typically made by a :func:`pipelinefilter`.

This module imports neither torch nor any I/O module. ``DataPipeline`` is a plain class with a
cooperative ``__init__`` and no metaclass, so the torch layer can combine it with
``torch.utils.data.IterableDataset`` (a subclass with both bases) without conflict.

Unlike webdataset, ``with_length`` keeps the pipeline picklable (the length is plain data, not a
patched class) and :class:`with_epoch` and :func:`repeatedly` behave as their documentation says.
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import reprlib
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import ConfigError
from .shards import WorkerInfoSource, resolve_worker_info
from .stagecheck import check_stages, describe_stages

__all__ = [
    "MockDataset",
    "Pipeline",
    "PipelineStage",
    "pipelinefilter",
    "repeatedly",
    "stage",
    "with_epoch",
    "with_length",
]

log = logging.getLogger(__name__)


class PipelineStage:
    """Base of stages that keep state between epochs (e.g. an epoch counter).

    A subclass defines ``run(source) -> iterator``; :class:`DataPipeline` calls it once per
    epoch with the previous stage's iterator. Subclasses written for webdataset that define
    ``invoke`` instead keep working: ``run`` forwards to ``invoke``. Calling a stage is the
    same as calling ``run``, so stages compose like plain functions.
    """

    def run(self, *args: Any, **kw: Any) -> Any:
        """Return this stage's output for one epoch; by default forwards to ``invoke``."""
        return self.invoke(*args, **kw)

    def invoke(self, *args: Any, **kw: Any) -> Any:
        """webdataset's name for :meth:`run`; a subclass overrides one of the two."""
        raise NotImplementedError(f"{type(self).__name__} must define run(source)")

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self.run(*args, **kw)


class stage(PipelineStage):
    """A picklable partial stage: ``stage(f, *args, **kw)(data) == f(data, *args, **kw)``.

    This is what a :func:`pipelinefilter` returns when given its options; it holds the
    function and its arguments as plain data, so it pickles whenever they do.
    """

    def __init__(self, f: Callable[..., Any], /, *args: Any, **kw: Any) -> None:
        if not callable(f):
            raise ConfigError(f"stage: {f!r} is not callable; pass a function f(data, ...)")
        self.f = f
        self.args = args
        self.kw = kw

    def run(self, data: Any) -> Any:
        """Apply the function to ``data`` with the stored arguments."""
        return self.f(data, *self.args, **self.kw)

    def __repr__(self) -> str:
        name = getattr(self.f, "__name__", repr(self.f)).lstrip("_")
        return f"<{name} {self.args} {self.kw}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # `@pipelinefilter def f(data, ...)` hides f behind its curried form under f's own
        # name, so pickle cannot find f by name; pickle the curried form instead.
        curried = _global(self.f)
        if type(self) is stage and isinstance(curried, _CurriedFilter) and curried.f is self.f:
            return (_restage, (curried, self.args, self.kw))
        return super().__reduce_ex__(protocol)


def _global(obj: Any) -> Any:
    """What the module-level name of ``obj`` (its module and qualname) refers to now."""
    found = sys.modules.get(getattr(obj, "__module__", None) or "")
    for part in (getattr(obj, "__qualname__", None) or "<none>").split("."):
        found = getattr(found, part, None)
    return found


def _restage(curried: _CurriedFilter, args: tuple[Any, ...], kw: dict[str, Any]) -> stage:
    return stage(curried.f, *args, **kw)


class _CurriedFilter:
    """The result of :func:`pipelinefilter`: call it with options to get a :class:`stage`."""

    def __init__(self, f: Callable[..., Any]) -> None:
        self.f = f
        functools.update_wrapper(self, f)

    def __call__(self, *args: Any, **kw: Any) -> stage:
        return stage(self.f, *args, **kw)

    def __reduce__(self) -> Any:
        if _global(self) is self:  # used as a decorator: pickle by name
            return self.__qualname__
        return (_CurriedFilter, (self.f,))

    def __repr__(self) -> str:
        return f"<pipelinefilter {getattr(self.f, '__name__', self.f)}>"


def pipelinefilter(f: Callable[..., Any]) -> Callable[..., stage]:
    """Curry ``f(data, *args, **kw)`` into ``pf(*args, **kw)(data)``.

    The curried result and the stages it makes pickle as long as ``f`` is defined at module
    level (also as ``@pipelinefilter def f(data, ...)``, which webdataset cannot pickle) and
    the arguments pickle.
    """
    return _CurriedFilter(f)


class Pipeline:
    """A source followed by stages; iterating it runs one (or more) epochs.

    ``DataPipeline(source, stage1, [stage2, stage3], ...)``: lists are flattened one level and
    ``None`` is skipped (inside lists too), so a list of samples as the source is written
    ``DataPipeline([samples], ...)``, as in webdataset. The pipeline is mutable like
    webdataset's (``append``, ``with_epoch``, ``repeat`` and ``with_length`` change it and
    return it); ``compose`` returns a copy.
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__()
        if kw:
            raise ConfigError(
                f"DataPipeline takes stages as positional arguments only; got keyword "
                f"argument(s) {sorted(kw)}"
            )
        self.pipeline: list[Any] = []
        self.repetitions: int = 1
        self.nsamples: int = -1
        #: ``(units, multiple)`` of a per-rank epoch (``with_epoch(nbatches=...)``): each
        #: worker yields its share of ``units``, times ``multiple`` items
        self.rank_epoch: tuple[int, int] | None = None
        self.size: int | None = None
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, list):
                self.pipeline.extend(a for a in arg if a is not None)
            else:
                self.pipeline.append(arg)

    def invoke(self, f: Any, *args: Any, **kw: Any) -> Any:
        """Run one stage: iterate a source, ``run`` a PipelineStage or call a callable."""
        if not args and not kw and hasattr(f, "__iter__"):
            if isinstance(f, (str, bytes)):
                raise ConfigError(
                    f"DataPipeline source {f!r} is a string, not a stream of items; wrap shard "
                    f"URLs in SimpleShardList(...) or use WebDataset(...)"
                )
            return iter(f)
        if isinstance(f, PipelineStage):
            return f.run(*args, **kw)
        if callable(f):
            return f(*args, **kw)
        if isinstance(f, list):
            return iter(f)
        raise ConfigError(
            f"{f!r} is not a valid pipeline stage: expected an iterable source, a "
            f"PipelineStage or a callable taking an iterator"
        )

    def iterator1(self) -> Iterator[Any]:
        """Return an iterator through one epoch of the pipeline."""
        if not self.pipeline:
            raise ConfigError("DataPipeline has no stages (was it closed?); give it a source")
        source = self.invoke(self.pipeline[0])
        for step in self.pipeline[1:]:
            source = self.invoke(step, source)
        return iter(source)

    def iterator(self) -> Iterator[Any]:
        """Yield ``self.repetitions`` epochs in a row; stop early at an empty epoch."""
        for epoch in range(self.repetitions):
            it = self.iterator1()
            for first in it:
                yield first
                break
            else:
                log.debug("epoch %d of %r produced no samples; not repeating", epoch, self)
                return
            yield from it

    #: where this pipeline runs (rank, worker), for per-rank epochs; ``None``: the
    #: environment only (the torch layer and ``WebDataset`` ask torch too)
    worker_info: WorkerInfoSource = None

    #: the resumable state of this pipeline (:mod:`wds_cloud.pipeline.state`), if it has one
    book: Any = None

    def __iter__(self) -> Iterator[Any]:
        book = self.book
        if book is not None:
            book.stages = describe_stages(self.pipeline)
            info = resolve_worker_info(self.worker_info)
            book.begin(info)
            if book.slotted is not None:  # resumed on another shape: play saved workers
                return self._played(book, info)
            self._begin(book)
        source = self.iterator1() if self.repetitions == 1 else self.iterator()
        count = self.nsamples if self.rank_epoch is None else self._worker_share()
        if book is None:
            return itertools.islice(source, count) if count > 0 else source
        if count > 0:
            book.limit = count
            count -= book.yielded  # resumed: what is left of this epoch
            if self.unbounded:  # a slot played to a quota of its player's (slots.play)
                return book.counted(source)
            if count <= 0:  # resumed after its last item: the epoch is over
                self._complete(book)
                return iter(())
            source = itertools.islice(source, count)
        return book.counted(source)

    def _played(self, book: Any, info: Any) -> Iterator[Any]:
        from .slots import play, quota

        yield from play(self, book.slotted, info, quota(self, book, info))
        self._complete(book)

    #: go on past this worker's share of the epoch (a slot of :mod:`.slots` in a quota)
    unbounded = False

    def _share_of(self, info: Any) -> int:
        """The items of one epoch of the worker ``info`` (``with_epoch``)."""
        if self.rank_epoch is None:
            return self.nsamples
        units, multiple = self.rank_epoch
        share = units // info.num_workers + (info.worker < units % info.num_workers)
        return share * multiple

    def _begin(self, book: Any) -> None:
        """A resumable iteration starts (``book`` holds what it resumes from): subclasses
        restore what their stages keep outside the book."""

    def _complete(self, book: Any) -> None:
        """The iteration resumed had yielded all its items: subclasses count it as run, so
        that the next one is the next epoch."""

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration under way stands (PyTorch's ``Stateful`` protocol): a flat
        dict of ints and strings; see :mod:`wds_cloud.pipeline.state`. A pipeline that cannot
        resume says why in ``unsupported`` (and :meth:`load_state_dict` refuses it)."""
        if self.book is None:
            return {"version": 1, "kind": type(self).__name__,
                    "unsupported": f"{type(self).__name__} keeps no resumable state (WebDataset "
                                   "and spec datasets do)"}
        state: dict[str, Any] = self.book.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, on_mismatch: str = "raise") -> None:
        """Resume from ``state`` at the next iteration (here, or in the DataLoader workers
        this pipeline is handed to): exactly, or :class:`~wds_cloud.errors.ResumeError`
        naming what differs (``on_mismatch="reseed"``: go on with fresh streams)."""
        if self.book is None:
            from ..errors import ResumeError

            raise ResumeError(f"{type(self).__name__} keeps no resumable state; WebDataset and "
                              "spec datasets do", field="kind")
        self._check_stages(state)
        self.book.load_state_dict(state, on_mismatch=on_mismatch)
        self._adopt_seed(self.book.seed)

    def _check_stages(self, state: dict[str, Any]) -> None:
        """Refuse a state whose stages changed in a way a restore cannot honour; log the
        changes it honours (see :mod:`wds_cloud.pipeline.stagecheck`)."""
        from .slots import plain_states

        now = describe_stages(self.pipeline)
        for one in plain_states(state):
            if one and one.get("stages"):
                notes = check_stages(one["stages"], now,
                                     buffered=bool(one.get("shuffle.buffer")),
                                     replayed="workers" in state or "slots" in state)
                for note in notes:
                    log.info("resuming %s: %s", type(self).__name__, note)
                return

    def _adopt_seed(self, seed: int) -> None:
        """Use ``seed`` (a loaded state's, when no seed was chosen)."""

    def _worker_share(self) -> int:
        """This worker's items of a per-rank epoch: ``units`` split as evenly as can be over
        the rank's workers (the first ``units % workers`` take one more), times ``multiple``."""
        assert self.rank_epoch is not None
        return self._share_of(resolve_worker_info(self.worker_info))

    def __len__(self) -> int:
        if self.size is None:
            raise TypeError(
                f"{type(self).__name__} has no length; an iterable dataset has none unless "
                f"you declare one with .with_length(n)"
            )
        return self.size

    def __bool__(self) -> bool:
        # defining __len__ would otherwise make `if pipeline:` raise or be False
        return True

    def stage(self, i: int) -> Any:
        """Return stage ``i``."""
        return self.pipeline[i]

    def append(self, f: Any) -> None:
        """Append a stage (changes this pipeline)."""
        self.pipeline.append(f)

    def compose(self, *args: Any) -> Pipeline:
        """Return a copy of this pipeline with the stages appended."""
        result = copy.copy(self)
        result.pipeline = [*self.pipeline, *args]
        return result

    def with_length(self, n: int, silent: bool = False) -> Pipeline:
        """Declare ``len(self) == n``; the epoch itself does not change. Returns ``self``."""
        if not silent:
            warnings.warn(
                ".with_length() only sets the value of __len__ for training environments "
                "that need one; it does not change the number of samples in an epoch",
                stacklevel=2,
            )
        self.size = int(n)
        return self

    def with_epoch(self, *args: int, nsamples: int | None = None, nbatches: int | None = None,
                   batch_size: int | None = None) -> Pipeline:
        """Cut the data (repeated as needed) into epochs. Returns ``self``.

        ``with_epoch(n)`` (positional, webdataset's meaning): each iteration yields ``n``
        items; with DataLoader workers, each worker's copy yields ``n`` (``with_epoch(n, m)``:
        ``max(n, m)``).

        ``with_epoch(nbatches=N)``: per **rank**, N batches in all, split over the rank's
        DataLoader workers (worker ``w`` of ``W`` yields ``N // W + (w < N % W)``), so the
        DataLoader yields exactly N batches on every rank whatever ``num_workers`` is and DDP
        never waits at the epoch's end. The pipeline batches itself (a ``batched`` stage
        before this) unless ``batch_size=B`` says the DataLoader does: each worker then
        yields ``B`` samples per batch of its share. ``nsamples=S`` (with ``batch_size=B``)
        is ``nbatches=S // B``; without ``batch_size``, S items split the same way.
        """
        self.repetitions = sys.maxsize
        if nsamples is None and nbatches is None:
            if not args or len(args) > 2:
                raise ConfigError("with_epoch(n): give the items per iteration, or "
                                  "nbatches=N (per rank)")
            self.nsamples, self.rank_epoch = max(args), None
            return self
        if args:
            raise ConfigError("with_epoch: give n (per worker) or nbatches=/nsamples= (per "
                              "rank), not both")
        if nsamples is not None and nbatches is not None:
            raise ConfigError("with_epoch: give nbatches= or nsamples=, not both")
        for name, value in (("nsamples", nsamples), ("nbatches", nbatches),
                            ("batch_size", batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"with_epoch({name}={value!r}): give an integer >= 1")
        if nbatches is not None:
            units = nbatches
        else:
            assert nsamples is not None
            units = nsamples // batch_size if batch_size else nsamples
            if units < 1:
                raise ConfigError(f"with_epoch(nsamples={nsamples}, batch_size={batch_size}): "
                                  "less than one batch per rank")
        self.nsamples, self.rank_epoch = -1, (units, batch_size or 1)
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> Pipeline:
        """Repeat ``nepochs`` times (forever if ``nepochs <= 0``), at most ``nbatches`` items.

        Unlike webdataset, ``nbatches`` is honoured for ``nepochs == 1`` too. Returns ``self``.
        """
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        return self

    def close(self) -> None:
        """Close every stage that has a ``close`` method and drop the stages."""
        for step in self.pipeline:
            close = getattr(step, "close", None)
            if callable(close):
                close()
        self.pipeline = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(reprlib.repr(s) for s in self.pipeline)})"


class with_epoch(PipelineStage):
    """Iterate ``dataset`` continuously, cutting it into epochs of ``length`` samples.

    Each ``iter()`` yields the next ``length`` samples, resuming where the previous epoch
    stopped and restarting ``dataset`` when it runs out (an empty dataset ends the epoch).
    The live iterator is not pickled: a copy sent to a worker starts from the beginning.
    Used as a stage, ``run(source)`` does the same on ``source``.
    """

    def __init__(self, dataset: Iterable[Any], length: int) -> None:
        self.dataset = dataset
        self.length = length
        self.source: Iterator[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["source"] = None
        return state

    def __iter__(self) -> Iterator[Any]:
        return self.invoke(self.dataset)

    def invoke(self, dataset: Iterable[Any]) -> Iterator[Any]:
        """Yield the next ``length`` samples of ``dataset``."""
        for _ in range(self.length):
            if self.source is None:
                self.source = iter(dataset)
            try:
                sample = next(self.source)
            except StopIteration:
                self.source = iter(dataset)
                try:
                    sample = next(self.source)
                except StopIteration:
                    self.source = None
                    return
            yield sample


class with_length(PipelineStage):
    """Iterate ``dataset`` unchanged, declaring ``len() == length`` (picklable)."""

    def __init__(self, dataset: Iterable[Any], length: int) -> None:
        self.dataset = dataset
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)

    def invoke(self, dataset: Iterable[Any]) -> Iterator[Any]:
        """Return an iterator over ``dataset``."""
        return iter(dataset)

    def __len__(self) -> int:
        return self.length


class MockDataset:
    """Yield the same ``sample`` ``length`` times (for tests and benchmarks)."""

    def __init__(self, sample: Any, length: int) -> None:
        self.sample = sample
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        return itertools.repeat(self.sample, self.length)

    def __len__(self) -> int:
        return self.length


def _guess_batchsize(batch: Any) -> int:
    return len(batch[0])


def repeatedly(
    source: Iterable[Any],
    nepochs: int | None = None,
    nbatches: int | None = None,
    nsamples: int | None = None,
    batchsize: Callable[[Any], int] = _guess_batchsize,
) -> Iterator[Any]:
    """Iterate ``source`` again and again (e.g. a DataLoader), yielding its items.

    Stops after ``nepochs`` passes, ``nbatches`` items or ``nsamples`` samples (counted with
    ``batchsize(item)``, by default ``len(item[0])``), whichever comes first; and, unlike
    webdataset, after a pass that yields nothing (an exhausted iterator would loop forever).
    """
    epoch = batches = total = 0
    while nepochs is None or epoch < nepochs:
        empty = True
        for item in source:
            empty = False
            yield item
            batches += 1
            if nbatches is not None and batches >= nbatches:
                return
            if nsamples is not None:
                total += batchsize(item)
                if total >= nsamples:
                    return
        if empty:
            return
        epoch += 1
