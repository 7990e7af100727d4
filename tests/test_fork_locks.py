"""A DataLoader worker forked while a thread of the parent holds one of wds_cloud's
process-wide locks: the child inherits the lock held, by a thread it does not have. Each such
lock is renewed in the child; the child's first use of it then comes back.

Seen: a WebLoader epoch that never ended while a thread of the parent polled
``wds.io_stats()`` (the counters' lock). The opener registry's lock is held while the first
``s3://`` URL of a process imports s3fs (~0.4 s), by a read-ahead thread of the parent when
the parent reads as a loader starts its workers; so is fsspec's, while that thread makes
fsspec's event loop (fsspec's own fork hook misses it)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from wds_cloud.io import registry
from wds_cloud.stores import aio, iostats


def _count() -> bool:
    iostats.count_io("forked", requests=3)
    return iostats.source_stats()["forked"]["requests"] == 3


def _open() -> bool:
    return registry.get_opener("/tmp/x.tar") is registry.get_opener("/tmp/y.tar")


def _fsspec_lock() -> AbstractContextManager[object]:
    from fsspec import asyn

    aio.guard_forks()  # what wds_cloud does before it makes its first filesystem
    return asyn.get_lock()


def _loop() -> bool:
    from fsspec import asyn

    return asyn.get_loop().is_running()


CASES: dict[str, tuple[Callable[[], AbstractContextManager[object]], Callable[[], bool]]] = {
    "counters": (iostats._locked, _count),
    "openers": (registry._renewed, _open),
    "fsspec's event loop": (_fsspec_lock, _loop),
}


@pytest.mark.parametrize("lock", sorted(CASES))
def test_a_child_forked_while_a_thread_holds_a_lock_can_take_it(lock: str) -> None:
    held, use = CASES[lock]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with held():
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: uses the lock and says how it went by its exit status
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a hang ends it (status -14)
            signal.alarm(10)
            code = 0 if use() else 2
        finally:
            os._exit(code)
    release.set()
    thread.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the child's use of the {lock} lock"
