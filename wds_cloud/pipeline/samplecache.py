"""Sample caches: the first epoch's samples, kept and replayed in later epochs (webdataset
1.0.2's ``Cached`` and ``LMDBCached``, re-exported by :mod:`wds_cloud.pipeline.filters`).

Not the shard cache (:mod:`wds_cloud.cache`), which keeps the bytes of shards.
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from ..errors import ConfigError, MissingDependencyError
from .core import PipelineStage

__all__ = ["Cached", "LMDBCached"]


class Cached(PipelineStage):
    """Keep the first complete epoch's samples in memory and replay them afterwards.

    As webdataset's: an epoch that stops early records nothing; the recording is per process
    (each DataLoader worker records its own share of the samples).
    """

    def __init__(self) -> None:
        self.cached: list[Any] | None = None

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """Yield ``source`` (recording it) the first time, the recording afterwards."""
        if self.cached is not None:
            yield from self.cached
            return
        recording: list[Any] = []
        for sample in source:
            recording.append(sample)
            yield sample
        self.cached = recording


_DONE = b"_"  # webdataset's key marking a complete recording
#: (pid, real path) -> lmdb.Environment: the databases open in this process
_OPEN: dict[tuple[int, str], Any] = {}


class LMDBCached(PipelineStage):
    """Record the first complete epoch's samples in the LMDB database ``fname`` (a directory)
    and replay them from it in later epochs, also in later runs: webdataset 1.0.2's stage.

    ``map_size``: the bytes the database may grow to; ``pickler``: what turns samples into
    bytes and back (anything with ``dumps``/``loads``, default :mod:`pickle`); ``chunksize``:
    samples written per transaction. Needs ``lmdb`` (``pip install 'wds-cloud[lmdb]'``),
    checked when the stage is built; :class:`~wds_cloud.errors.MissingDependencyError` if
    missing. The database is opened when the stage first runs in a process, so the stage can
    be pickled into DataLoader workers.

    Replay comes in the order of the first epoch (webdataset's keyed the records by
    ``__key__``, so replay came sorted by key and samples sharing a key were lost); databases
    written by webdataset are read too. A recording that stops early is not marked complete:
    the next epoch clears it and records afresh. One writer per database: with several
    DataLoader workers, give each its own ``fname``. Replay unpickles (with the default
    ``pickler``): read only databases you wrote.
    """

    def __init__(self, fname: str, map_size: int | float = 1e12, pickler: Any = pickle,
                 chunksize: int = 500) -> None:
        _import_lmdb()
        if chunksize < 1:
            raise ConfigError(f"LMDBCached: chunksize must be >= 1, got {chunksize!r}")
        self.fname = os.fspath(fname)
        self.map_size = int(map_size)
        self.pickler = pickler
        self.chunksize = int(chunksize)
        self._db: tuple[int, Any] | None = None  # (pid, lmdb.Environment), per process

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_db": None}
        if isinstance(self.pickler, ModuleType):  # modules do not pickle: their name does
            state["pickler"] = ("module", self.pickler.__name__)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        pickler = state["pickler"]
        if isinstance(pickler, tuple) and pickler[:1] == ("module",):
            state["pickler"] = importlib.import_module(pickler[1])
        self.__dict__.update(state)

    def db(self) -> Any:
        """This process's ``lmdb.Environment`` on ``fname`` (opened on first use, and shared
        by the stages on the same database: lmdb refuses to open one twice in a process)."""
        pid = os.getpid()
        if self._db is None or self._db[0] != pid:
            key = (pid, os.path.realpath(self.fname))
            env = _OPEN.get(key)
            if env is None:
                env = _OPEN[key] = _import_lmdb().open(self.fname, map_size=self.map_size)
            self._db = (pid, env)
        return self._db[1]

    def is_complete(self) -> bool:
        """Whether a complete epoch has been recorded."""
        with self.db().begin(write=False) as txn:
            return txn.get(_DONE) is not None

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """Replay the recording if it is complete, else yield ``source`` while recording it."""
        db = self.db()
        if self.is_complete():
            with db.begin(write=False) as txn:
                for key, value in txn.cursor():
                    if key != _DONE:
                        yield self.pickler.loads(value)
            return
        with db.begin(write=True) as txn:
            txn.drop(db.open_db(), delete=False)  # what an interrupted recording left
        chunk: list[tuple[bytes, bytes]] = []
        for i, sample in enumerate(source):
            chunk.append((b"%020d" % i, self.pickler.dumps(sample)))  # sorts as written
            if len(chunk) >= self.chunksize:
                self._put(chunk)
                chunk = []
            yield sample
        self._put([*chunk, (_DONE, b"1")])

    def _put(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.db().begin(write=True) as txn:
            for key, value in items:
                txn.put(key, value)

    def __repr__(self) -> str:
        return f"LMDBCached({self.fname!r}, map_size={self.map_size})"


def _import_lmdb() -> Any:
    try:
        return importlib.import_module("lmdb")
    except ImportError as exc:
        raise MissingDependencyError("LMDBCached", "lmdb", "lmdb") from exc
