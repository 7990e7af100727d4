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
from pathlib import Path
from typing import Any

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
    "openers": (lambda: registry._lock, _open),
    "fsspec's event loop": (_fsspec_lock, _loop),
}


def _exit_status_of_a_child(release: threading.Event, thread: threading.Thread,
                             use: Callable[[], bool]) -> int:
    """Forks now: the child runs ``use`` (exit status 0 if it returns true, -14 if it hangs
    for 10 s); then lets ``thread`` go, and returns the child's status."""
    pid = os.fork()
    if pid == 0:
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
    return os.waitstatus_to_exitcode(status)


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
    status = _exit_status_of_a_child(release, thread, use)
    assert status == 0, f"the child's use of the {lock} lock"


def test_a_child_forked_while_a_thread_makes_a_routers_cache_can_make_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's ``functools.cached_property`` holds one lock for every instance of the
    class while one computes: a DataLoader worker forked while a thread of the parent made its
    router's shard cache (a dataset read in a thread, through the cache) waited forever for
    its own router's, at its first shard."""
    from wds_cloud.cache import ShardCache
    from wds_cloud.router import Router
    from wds_cloud.settings import Settings

    made = ShardCache.from_settings
    holding, release = threading.Event(), threading.Event()

    def slow(settings: Settings, **kwargs: Any) -> Any:
        if threading.current_thread().name == "holder":
            holding.set()
            release.wait(10)
        return made(settings, **kwargs)

    monkeypatch.setattr(ShardCache, "from_settings", slow)
    settings = Settings.from_env({"WDS_CACHE": str(tmp_path / "cache")})
    thread = threading.Thread(target=lambda: Router(settings).cache(), name="holder",
                              daemon=True)
    thread.start()
    assert holding.wait(10)
    status = _exit_status_of_a_child(release, thread,
                                     lambda: Router(settings).cache() is not None)
    assert status == 0, "the child's router never made its cache"


def test_workers_start_after_an_import_under_way_in_another_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WebLoader forks its workers once the imports other threads have under way are done
    (``settle_imports``), and its workers import that module too. The hang this guards
    against was seen only in a crossing script (the parent reading through the cache in a
    thread as a WebLoader started: a worker waited forever in ``_ModuleLock.acquire`` for
    ``wds_cloud.cache``, 6 runs of 6; 0 of 4 with ``settle_imports``); this simpler module did
    not hang without it on Python 3.11.7, so here it checks the path, not the hang."""
    import importlib
    import sys

    from shardgen import write_tar

    import wds_cloud as wds

    (tmp_path / "slowly_imported.py").write_text(
        "import time\nstarted = True\ntime.sleep(1.0)\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slowly_imported", raising=False)
    urls = [write_tar(tmp_path / f"s{s}.tar", [(f"k{s}{i}", {"txt": b"x"}) for i in range(2)])
            for s in range(2)]
    thread = threading.Thread(target=importlib.import_module, args=("slowly_imported",),
                              daemon=True)
    thread.start()
    while "slowly_imported" not in sys.modules:  # under way in that thread
        pass

    def value(sample: dict[str, Any]) -> int:
        return int(importlib.import_module("slowly_imported").VALUE)

    loader = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False).map(value),
                           batch_size=None, num_workers=2, timeout=20)
    assert list(loader) == [7] * 4
    thread.join(10)
