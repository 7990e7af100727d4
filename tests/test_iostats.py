"""The I/O and per-source counters when the garbage collector closes a reader in the middle of a
count: a generator left in a reference cycle is closed at whatever allocation comes next, also
one made while this thread holds the counters' lock, and its ``finally`` counts too (a spec
mix counts the samples of its last block, a shard stream its bytes). That once hung a test
for 300 s: the lock was taken twice by one thread."""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from wds_cloud.stores import iostats


def _reader(source: str) -> Iterator[int]:
    try:
        yield 1
    finally:
        iostats.count_source(source, samples=1)
        iostats.count_io(source, requests=2)


def _abandoned(source: str) -> None:
    """A started reader that only the collector can free (a cycle holds it)."""
    gen = _reader(source)
    next(gen)
    cycle: list[object] = [gen]
    cycle.append(cycle)


class _Collecting(dict):  # type: ignore[type-arg]
    """The per-source table, where a count for ``at`` (or reading the table) allocates and so
    collects."""

    def __init__(self, table: dict[str, Any], at: str) -> None:
        super().__init__(table)
        self.at = at

    def get(self, key: str, default: Any = None) -> Any:
        if key == self.at:
            gc.collect()
        return super().get(key, default)

    def items(self) -> Any:
        gc.collect()
        return super().items()


@pytest.mark.parametrize("inside", ["count_source", "source_stats"])
def test_a_count_made_while_counting_is_neither_a_hang_nor_lost(
        inside: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = iostats.io_stats()["requests"]
    monkeypatch.setattr(iostats, "_by_source", _Collecting(iostats._by_source, "counting"))
    gc.collect()
    _abandoned("closed-by-gc")
    thread = threading.Thread(target=getattr(iostats, inside),
                              args=("counting",) if inside == "count_source" else (),
                              kwargs={"samples": 5} if inside == "count_source" else {},
                              daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), f"a count made inside {inside} waits for itself"
    stats = dict(iostats._by_source)
    assert stats["closed-by-gc"][iostats.SOURCE_FIELDS.index("samples")] == 1
    assert stats["closed-by-gc"][iostats.SOURCE_FIELDS.index("requests")] == 2
    if inside == "count_source":
        assert stats["counting"][iostats.SOURCE_FIELDS.index("samples")] == 5
    assert iostats.io_stats()["requests"] - before == 2


def test_a_child_forked_while_another_thread_counts_can_count() -> None:
    """A DataLoader worker forked while a thread of the parent (read-ahead, a cache fill, a
    monitor polling ``io_stats()``) holds the counters' lock inherits the lock held, by a thread
    it does not have: its first count waited forever (seen: a WebLoader epoch that never
    ended while a thread polled ``wds.io_stats()``)."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with iostats._locked():
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: counts, reads them, and says so by its exit status
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a hang ends it (status -14)
            signal.alarm(10)
            iostats.count_io("forked", requests=3)
            code = 0 if iostats.source_stats()["forked"]["requests"] == 3 else 2
        finally:
            os._exit(code)
    release.set()
    thread.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's count never came back"
