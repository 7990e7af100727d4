"""webdataset's module path ``webdataset.multi``: ``MultiLoader``, a loader without torch.

``workers`` processes each iterate the dataset, with ``WORKER``/``NUM_WORKERS`` set in their
environment (so ``split_by_worker`` gives each its share of the shards, as in a DataLoader),
and send their samples, pickled, to the loader, which yields them as they arrive. webdataset
sent them through a ZMQ socket (``pyzmq``); here they go through a ``multiprocessing`` queue,
so nothing else needs installing. Unlike webdataset, a worker that dies without finishing
raises ``RuntimeError`` instead of leaving the loader waiting, and nothing is printed
(``verbose`` logs at INFO).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["EOF", "MultiLoader", "all_pids", "reader", "the_protocol"]

log = logging.getLogger(__name__)

#: the pickle protocol samples are sent with
the_protocol = pickle.HIGHEST_PROTOCOL
#: every worker process started by a MultiLoader and still referenced
all_pids: weakref.WeakSet[Any] = weakref.WeakSet()
_POLL = 1.0  # seconds between checks that the workers are alive while none sends


class EOF:
    """The message a worker sends when its dataset is exhausted (``index``: which worker)."""

    index: int

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def reader(dataset: Iterable[Any], sockname: Any, index: int, num_workers: int) -> None:
    """Body of worker ``index`` of ``num_workers``: iterate ``dataset`` and put each sample,
    pickled, on the queue ``sockname`` (webdataset: the name of a ZMQ socket), then an
    :class:`EOF`. Sets ``WORKER``/``NUM_WORKERS`` in this (child) process's environment, for
    code that reads them, and :data:`wds_cloud.pytorch.loader_worker`, which a dataset built
    before the worker started (with the parent's settings) consults."""
    from . import pytorch

    os.environ["WORKER"] = str(index)
    os.environ["NUM_WORKERS"] = str(num_workers)
    pytorch.loader_worker = (index, num_workers)
    for sample in dataset:
        sockname.put(pickle.dumps(sample, protocol=the_protocol))
    sockname.put(pickle.dumps(EOF(index=index), protocol=the_protocol))


class MultiLoader:
    """Iterate ``dataset`` in ``workers`` processes, yielding their samples as they come.

    Each pass (``iter``) starts the workers afresh, first killing those of an earlier pass
    unless ``nokill``. ``prefix`` named webdataset's ZMQ sockets; it is kept, unused.
    """

    def __init__(self, dataset: Iterable[Any], workers: int = 4, verbose: bool = False,
                 nokill: bool = False, prefix: str = "/tmp/_multi-") -> None:
        self.dataset = dataset
        self.workers = workers
        self.verbose = verbose
        self.pids: list[Any] = []
        self.socket: Any = None
        self.nokill = nokill
        self.prefix = prefix

    def kill(self) -> None:
        """Stop the workers of the current pass."""
        for pid in self.pids:
            if pid is None:
                continue
            log.info("MultiLoader: killing %s", pid)
            pid.kill()
            pid.join(1.0)
        self.pids = []
        if self.socket is not None:
            self.socket.close()
        self.socket = None

    def __iter__(self) -> Iterator[Any]:
        if not self.nokill:
            self.kill()
        self.socket = mp.Queue(maxsize=1000)  # webdataset's ZMQ high-water mark
        self.pids = [mp.Process(target=reader, args=(self.dataset, self.socket, i, self.workers))
                     for i in range(self.workers)]
        all_pids.update(self.pids)
        for pid in self.pids:
            pid.start()
        while self.pids.count(None) < len(self.pids):
            try:
                data = self.socket.get(timeout=_POLL)
            except queue.Empty:
                self._check_workers()
                continue
            sample = pickle.loads(data)
            if isinstance(sample, EOF):
                if self.verbose:
                    log.info("MultiLoader: worker %d finished", sample.index)
                self.pids[sample.index].join(1.0)
                self.pids[sample.index] = None
            else:
                yield sample

    def _check_workers(self) -> None:
        for index, pid in enumerate(self.pids):
            if pid is not None and pid.exitcode not in (None, 0):
                code = pid.exitcode
                self.kill()
                raise RuntimeError(f"MultiLoader: worker {index} exited with status {code} "
                                   "before finishing its dataset")
