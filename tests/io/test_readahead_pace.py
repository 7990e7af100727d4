"""Read-ahead pre-reads only while that pays, on real servers: from nginx on loopback (its
connections keep up with their consumer) it never starts, or stops; when the fault proxy serves
each connection at 8 MB/s, it starts and pre-reads the shards already opened ahead too.

The speeds are real; only the bar is lowered (``FAST_READS`` 100 MB/s, windows of 1 MiB) so
that both links are far from it on a loaded machine.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.handlers import reraise_exception
from wds_cloud.io import Pace, ReadAhead, ReadAheadStats, pace
from wds_cloud.io.prefetched import prefetched_stream
from wds_cloud.reading import ShardOpener, read_shards
from wds_cloud.router import Router
from wds_cloud.settings import Settings
from wds_cloud.tar.shardloop import samples_from_shards

MiB = 1 << 20
SHARDS = 8
SHARE = MiB  # max_bytes 2 MiB over depth 2; each shard is 3 MiB: 2 MiB are read after it


@pytest.fixture(autouse=True)
def _bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pace, "FAST_READS", 100 * 10**6)
    monkeypatch.setattr(pace, "WINDOW", MiB)


@pytest.fixture(scope="module")
def served(nginx_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[str]]:
    """Eight shards of three 1 MiB samples on nginx: the store and the shards' names."""
    store = nginx_server.new_store()
    directory = tmp_path_factory.mktemp("pace")
    names = []
    for s in range(SHARDS):
        samples = [(f"s{s}_{i}", {"bin": os.urandom(MiB)}) for i in range(3)]
        store.put(f"p-{s}.tar", Path(write_tar(directory / f"p-{s}.tar", samples)).read_bytes())
        names.append(f"p-{s}.tar")
    return store, names


def _epoch(urls: list[str], on_sample: Callable[[str], bool | None] = lambda key: None, *,
           pace: Pace | None = None, opener: Callable[[str], Any] = wds.gopen,
           ) -> tuple[list[str], ReadAheadStats]:
    """The keys of one epoch over ``urls`` through a ReadAhead (``on_sample(key)`` true: stop
    there, as a ``break``), and its counters after it closed."""
    keys = []
    with ReadAhead(opener, depth=2, max_bytes=2 * SHARE, pace=pace) as ahead:
        for sample in samples_from_shards(ahead.sources([{"url": u} for u in urls]),
                                          reraise_exception, open_stream=ahead.open):
            keys.append(sample["__key__"])
            if on_sample(sample["__key__"]):
                break
    return keys, ahead.stats


def _keys() -> list[str]:
    return [f"s{s}_{i}" for s in range(SHARDS) for i in range(3)]


def test_connections_that_keep_up_are_not_pre_read(served: tuple[Any, list[str]]) -> None:
    store, names = served
    keys, stats = _epoch([store.url(n) for n in names])
    assert keys == _keys()
    assert not stats.pre_reading and stats.turns == 0
    # every shard opened once: ahead, or by the consumer if it asked before a thread got to it
    assert stats.opened_ahead + stats.direct == SHARDS and stats.bytes_prefetched == 0


def test_pre_reading_stops_when_connections_keep_up(served: tuple[Any, list[str]]) -> None:
    """A pace that starts pre-reading (as a caller may give) stops at the first fast window."""
    store, names = served
    keys, stats = _epoch([store.url(n) for n in names], pace=Pace(pays=True))
    assert keys == _keys()
    assert not stats.pre_reading and stats.turns == 1 and stats.topped_up == 0
    # the shards opened before the first shard's reads were judged are pre-read, no other
    assert stats.opened_ahead + stats.direct == SHARDS
    assert 0 < stats.bytes_prefetched <= 3 * SHARE


def test_slow_connections_are_pre_read(
    served: tuple[Any, list[str]], fault_proxy: Callable[..., Any],
) -> None:
    store, names = served
    proxy = fault_proxy(store, conn_rate=8 * 10**6)
    keys, stats = _epoch([f"{proxy.url}/{store.directory}/{n}" for n in names])
    assert keys == _keys()
    assert stats.turns >= 1  # on, once the first shard's reads were slow
    assert stats.topped_up >= 1  # the shards opened ahead by then: pre-read after all
    assert stats.bytes_prefetched >= SHARE


def test_pre_reading_starts_when_the_link_slows(
    served: tuple[Any, list[str]], fault_proxy: Callable[..., Any],
) -> None:
    store, names = served
    proxy = fault_proxy(store)

    def slow_down(key: str) -> None:
        if key == "s2_0":  # no pre-reading so far: slow down every connection
            proxy.configure(conn_rate=8 * 10**6)

    keys, stats = _epoch([f"{proxy.url}/{store.directory}/{n}" for n in names], slow_down)
    assert keys == _keys()
    # on (and maybe off and on again: a shard whose bytes waited in the kernel's buffers
    # while the one before was read comes fast, even at 8 MB/s)
    assert stats.turns >= 1
    # and shards were pre-read: those opened while it was off (topped up) or, when it turned
    # on before the next ones were opened (which the load decides), those
    assert stats.bytes_prefetched >= SHARE


def test_a_prefetched_stream_tells_the_pace_of_its_raw_reads(tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 5)
    path = tmp_path / "f"
    path.write_bytes(data)
    told: list[tuple[int, float]] = []
    with open(path, "rb") as raw:
        first = raw.read(MiB)
        stream = prefetched_stream(raw, deque([first]), None, lambda: None,
                                   on_pace=lambda n, s: told.append((n, s)))
        got = b"".join(iter(lambda: stream.read(700_000), b""))
    assert got == data
    assert sum(n for n, _ in told) == len(data) - MiB  # the reads after the pre-read bytes
    assert all(s >= 0 for _, s in told)


def test_no_pace_no_wrapper(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    drained: list[bool] = []
    with open(path, "rb") as raw:
        assert prefetched_stream(raw, deque(), None, lambda: drained.append(True)) is raw
        wrapped = prefetched_stream(raw, deque(), None, lambda: drained.append(True),
                                    on_pace=lambda n, s: None)
        assert wrapped is not raw and wrapped.read() == b"x" * 10
    assert drained == [True, True]  # told at once either way: nothing was pre-read


def test_stopping_while_shards_are_topped_up_closes_them(
    served: tuple[Any, list[str]], fault_proxy: Callable[..., Any],
) -> None:
    """A break with shards queued for, or in the middle of, a top-up: every stream opened is
    closed, and no read-ahead thread is left (a top-up read is closed from aside)."""
    store, names = served
    proxy = fault_proxy(store)
    opened: list[Any] = []

    def opener(url: str) -> Any:
        stream = wds.gopen(url)
        opened.append(stream)
        return stream

    def slow_down_then_stop(key: str) -> bool:
        if key == "s1_0":
            proxy.configure(conn_rate=4 * 10**6)
        return key == "s5_1"

    _, stats = _epoch([f"{proxy.url}/{store.directory}/{n}" for n in names],
                      slow_down_then_stop, opener=opener)
    assert stats.turns >= 1
    assert opened and all(stream.closed for stream in opened)
    deadline = time.monotonic() + 5
    while any(t.name.startswith("wds-readahead") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "read-ahead threads left after close"
        time.sleep(0.02)


def test_an_epoch_starts_at_the_pace_the_last_one_ended(
    served: tuple[Any, list[str]], fault_proxy: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dataset's epochs in one process: each read-ahead starts at the verdict of the last
    one (its router keeps it): pre-reading from the first shard on after an epoch whose
    reads turned it on, without after one whose reads turned it off."""
    store, names = served
    proxy = fault_proxy(store)
    opener = ShardOpener(Settings(readahead=2, readahead_bytes=2 * SHARE))
    slow = [{"url": f"{proxy.url}/{store.directory}/{n}"} for n in names]
    fast = [{"url": store.url(n)} for n in names]
    handed: list[tuple[bool, Pace]] = []  # each pace handed out, and how it started
    hand_out = Router.pace

    def recorded(router: Router) -> Pace:
        pace = hand_out(router)
        handed.append((pace.pays, pace))
        return pace

    monkeypatch.setattr(Router, "pace", recorded)

    def epoch(items: list[dict[str, str]]) -> tuple[bool, bool]:
        """Whether it started pre-reading, and its verdict."""
        keys = [s["__key__"] for s in read_shards(opener, opener.settings, items,
                                                  reraise_exception, None, None)]
        assert keys == _keys()
        started, pace = handed[-1]
        return started, pace.verdict

    assert epoch(fast) == (False, False)
    # a link of 16 MB/s shared by all connections: the kernel cannot hold the shards opened
    # ahead while the consumer reads (as it does at 8 MB/s per connection, shards this small)
    proxy.configure(rate=16 * 10**6)
    assert epoch(slow) == (False, True)
    assert epoch(slow) == (True, True)
    assert epoch(fast) == (True, False)
    assert epoch(fast) == (False, False)
    assert len(handed) == 5


def test_shards_the_consumer_opens_before_a_thread_does_are_judged_too(
    served: tuple[Any, list[str]], fault_proxy: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer faster than the read-ahead threads opens the shards it asks for itself; their
    reads are timed like the others. (Before, only shards a thread had opened were: over a slow
    link a consumer that opened every other shard itself, and found the rest already in the
    kernel's buffers, never saw a slow read, and pre-reading never started.) Here no thread
    ever gets to a shard."""
    monkeypatch.setattr(ReadAhead, "_work", lambda self: None)
    store, names = served
    proxy = fault_proxy(store, conn_rate=8 * 10**6)
    keys, stats = _epoch([f"{proxy.url}/{store.directory}/{n}" for n in names[:4]])
    assert keys == _keys()[:12]
    assert stats.direct == 4 and stats.opened_ahead == 0
    assert stats.turns >= 1 and stats.pre_reading
