"""The I/O and per-source counters when the garbage collector closes a reader in the middle of a
count: a generator left in a reference cycle is closed at whatever allocation comes next, also
one made while this thread holds the counters' lock, and its ``finally`` counts too (a spec
mix counts the samples of its last block, a shard stream its bytes). That once hung a test
for 300 s: the lock was taken twice by one thread."""

from __future__ import annotations

import gc
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

