"""Reading shards, bound to the router: the opener a dataset carries into its workers, the
stage that turns shard items into samples keeping its place (for resumable state), and a
shard list's resumable shuffle.

Part of the composition root (with :mod:`wds_cloud.dataset` and
:mod:`wds_cloud.specdataset`): it binds layer 2's readers and state to
:class:`~wds_cloud.router.Router`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .errors import WdsCloudError
from .handlers import Handler
from .io import get_opener
from .io.pace import Pace
from .io.readahead import ReadAhead
from .pipeline import core as pipeline
from .pipeline.rng import SHUFFLE, KeyedRandom
from .pipeline.shufflestate import ResumableShuffle
from .pipeline.state import Ref, ResumeBook, refetch, track_shards
from .pytorch import in_worker
from .router import Router
from .settings import Settings
from .tar.shardloop import ShardCursor, samples_from_shards
from .urls import split_scheme

__all__ = ["ReaderShuffle", "ShardOpener", "ShardReader", "read_shards"]

Sample = dict[str, Any]


@dataclass(frozen=True)
class ShardOpener:
    """Opens shards for reading with one :class:`Settings` and per-scheme ``storage_options``
    (a picklable value, taken to DataLoader workers). :meth:`samples` reads a stream
    of sources with the next ``settings.readahead`` shards opened in the background.

    The :class:`~wds_cloud.router.Router` (parsed rewrite rules, AIStore mapping, shard cache)
    is built once per process, on the first open: never pickled, and built anew in a forked
    or spawned DataLoader worker."""

    settings: Settings = field(default_factory=Settings)
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    url_to_name: Callable[[str], str] | None = None
    #: members of local and cached shards as ``memoryview`` slices of a map of the file (in
    #: the process that iterates the dataset; ``bytes`` in DataLoader workers)
    zero_copy: bool = False
    _router: list[tuple[int, Router]] = field(default_factory=list, init=False, repr=False,
                                              compare=False)

    @property
    def router(self) -> Router:
        """This process's router (built on first use)."""
        pid = os.getpid()
        if not self._router or self._router[0][0] != pid:
            self._router[:] = [(pid, Router(self.settings, self.storage_options,
                                            self.url_to_name))]
        return self._router[0][1]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_router": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __deepcopy__(self, memo: dict[int, Any]) -> ShardOpener:
        # a deep copy of its dataset (a slot played, pipeline/slots.py) shares it, and with
        # it this process's router: one client per store and one cache, not one per copy
        return self

    def __call__(self, url: str, **kw: Any) -> BinaryIO:
        return self.router.open(url, "rb", **kw)

    def prepare(self, urls: Iterable[str]) -> None:
        """Load the openers that ``urls`` need (the first URL of each scheme), and with them
        their libraries (s3fs, gcsfs, ...), in this process; nothing is opened. DataLoader
        workers forked from here then inherit the imports instead of each worker doing them
        again (about 0.5 s of CPU a library, in every worker of every epoch; spawned workers
        import them anyway). Best effort: a URL that cannot be resolved, or a library that is
        missing, is left for the read to report as it would have."""
        seen: set[str] = set()
        for url in urls:
            scheme = "-" if url == "-" else split_scheme(url)[0]
            if scheme in seen:
                continue
            seen.add(scheme)
            try:
                get_opener(url if url == "-" else self.router.resolve(url))
            except (WdsCloudError, ImportError, ValueError):
                continue

    def costs_round_trip(self, url: str) -> bool:
        """Whether opening ``url`` ahead pays (see :meth:`Router.costs_round_trip`)."""
        return self.router.costs_round_trip(url)

    def pace(self) -> Pace:
        """The pace a new read-ahead starts from (see :meth:`Router.pace`)."""
        return self.router.pace()

    def samples(
        self, src: Iterable[Sample], handler: Handler, select_files: Any, rename_files: Any,
        *, share: int = 1, cursor: ShardCursor | None = None,
    ) -> Iterator[Sample]:
        """Samples of the shards of ``src``; ``share``: how many such streams one process
        reads at once (a spec's sources), which split the read-ahead between them;
        ``cursor`` keeps the position (for resumable state)."""
        # in a DataLoader worker views would be pickled (and torch's default_convert would
        # turn each into a list of ints): the members are bytes there
        zero_copy = self.zero_copy and not in_worker()
        return read_shards(self, self.settings, src, handler, select_files, rename_files,
                           share=share, cursor=cursor, zero_copy=zero_copy)


def read_shards(
    open_stream: Callable[..., BinaryIO], settings: Settings, src: Iterable[Sample],
    handler: Handler, select_files: Any, rename_files: Any, *, share: int = 1,
    cursor: ShardCursor | None = None, zero_copy: bool = False,
) -> Iterator[Sample]:
    """Samples of the shards ``{"url": ...}`` of ``src`` opened with ``open_stream``, the
    next ``settings.readahead // share`` opened in the background: those whose first byte is
    a round trip away, when ``open_stream`` says which (``costs_round_trip(url)``), pre-read
    while that pays, from the pace ``open_stream.pace()`` gives if it has one."""
    depth = settings.readahead
    if depth and share > 1:
        depth = max(1, depth // share)
    max_bytes = settings.readahead_bytes // max(share, 1)
    worth = getattr(open_stream, "costs_round_trip", None)
    start = getattr(open_stream, "pace", None)
    with ReadAhead(open_stream, depth=depth, max_bytes=max_bytes, worth=worth,
                   pace=start() if callable(start) else None) as ahead:
        yield from samples_from_shards(ahead.sources(src), handler, select_files, rename_files,
                                       open_stream=ahead.open, cursor=cursor,
                                       zero_copy=zero_copy)


class ShardReader(pipeline.PipelineStage):
    """The stage reading shard items into samples, keeping its position in ``book``."""

    def __init__(self, opener: ShardOpener, handler: Handler, select_files: Any,
                 rename_files: Any, book: ResumeBook | None) -> None:
        self.opener, self.handler, self.book = opener, handler, book
        self.select_files, self.rename_files = select_files, rename_files
        self._cursor = ShardCursor()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cursor": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cursor = ShardCursor()

    def run(self, src: Iterable[Sample]) -> Iterator[Sample]:
        """Samples of the shard items of ``src``."""
        self._cursor = cursor = ShardCursor()
        if self.book is not None:
            src = track_shards(self.book, 0, cursor, src)
        return self.read(src, 0, cursor)

    def read(self, items: Iterable[Sample], i: int, cursor: ShardCursor) -> Iterator[Sample]:
        """Samples of ``items``, the position kept in ``cursor``."""
        return self.opener.samples(items, self.handler, self.select_files, self.rename_files,
                                   cursor=cursor)

    def last_ref(self) -> Ref:
        """The reference of the sample yielded last."""
        cursor = self._cursor
        ordinal, offset = cursor.last()
        return 0, cursor.started - 1, ordinal, offset

    def refetch(self, refs: list[Ref]) -> list[Sample]:
        """The samples of ``refs``, read again."""
        assert self.book is not None
        return refetch(self.book, refs, self.read)


class ReaderShuffle(pipeline.PipelineStage):
    """``WebDataset(urls).shuffle(n)``: a resumable buffer shuffle keyed by the seed, the
    iteration's epoch keys and the slot."""

    def __init__(self, reader: ShardReader, bufsize: int, initial: int) -> None:
        self.reader, self.bufsize, self.initial = reader, bufsize, initial

    def run(self, src: Iterable[Sample]) -> Iterator[Sample]:
        book = self.reader.book
        assert book is not None
        info, key = book.info, book.key  # the iteration's epoch keys, known at its start
        rng = KeyedRandom(book.seed, key[-1] if key else 0,
                          info.rank * info.num_workers + info.worker, SHUFFLE, *key[:-1])
        shuffle = ResumableShuffle(book, self.reader, self.bufsize, self.initial)
        return shuffle.run(src, rng)
