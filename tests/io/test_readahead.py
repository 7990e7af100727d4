"""Read-ahead of the next shards, on real local tar files and a slow opener of our own.

The slow opener wraps the local opener: it sleeps before opening (or before the first byte) and
records every open, every read done by a read-ahead thread and every close, so the tests can
check the contract without timing anything.
"""

from __future__ import annotations

import gc
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

from wds_cloud.errors import OpenError, ShardNotFoundError
from wds_cloud.handlers import reraise_exception
from wds_cloud.io import LocalOpener, Pace
from wds_cloud.io.readahead import ReadAhead, ReadAheadStats
from wds_cloud.tar.shardloop import samples_from_shards

THREAD = "wds-readahead"


def _pre_reading() -> Pace:
    """A pace that pre-reads from the start, not only once reads are slow: these tests are of
    pre-reading itself (their shards are too small to turn it off)."""
    return Pace(pays=True)
SHARD_SIZE = 6 * 40_000  # about: 6 samples of 40 kB


def _make_shards(directory: Path, count: int) -> list[str]:
    urls = []
    for s in range(count):
        samples = [(f"s{s:02d}_{i:02d}", {"bin": os.urandom(40_000), "txt": f"{s}/{i}".encode()})
                   for i in range(6)]
        urls.append(write_tar(directory / f"shard-{s:02d}.tar", samples))
    return urls


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    return _make_shards(tmp_path, 8)


class Tracked:
    """A local file stream that records reads made by read-ahead threads and its closing."""

    def __init__(self, raw: Any, owner: SlowOpener) -> None:
        self.raw, self.owner = raw, owner
        self.local_path = raw.local_path
        self.closed = False
        self.ahead = 0  # bytes read by a read-ahead thread
        self.first = True

    def __enter__(self) -> Tracked:  # a shard opened directly is used like any stream
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self, n: int) -> None:
        if threading.current_thread().name.startswith(THREAD):
            with self.owner.lock:
                self.ahead += n
                self.owner.in_flight += n
                self.owner.peak = max(self.owner.peak, self.owner.in_flight)

    def _before_read(self) -> None:
        if self.first:
            self.first = False
            time.sleep(self.owner.first_byte_delay)
        if self.owner.fail_after is not None and self.raw.tell() >= self.owner.fail_after:
            raise ConnectionResetError("connection reset by the test")
        if self.owner.stall is not None:
            self.owner.stall.wait()  # like a socket read that only a close interrupts
            if self.closed:
                raise ValueError("read of closed file")

    def read(self, size: int = -1) -> bytes:
        self._before_read()
        if self.owner.fail_after is not None:
            size = min(size if size >= 0 else 1 << 30, self.owner.fail_after - self.raw.tell())
        data: bytes = self.raw.read(size)
        self._count(len(data))
        return data

    def handed_out(self) -> None:
        """The consumer got this stream: its pre-read bytes no longer count as ahead."""
        with self.owner.lock:
            self.owner.in_flight -= self.ahead
            self.ahead = 0

    def close(self) -> None:
        self.handed_out()
        self.closed = True
        if self.owner.stall is not None:
            self.owner.stall.set()
        self.raw.close()


class TrackedInto(Tracked):
    """A :class:`Tracked` stream with ``readinto``: read-ahead then reads into buffers of its
    own, which it records (``SlowOpener(readinto=True)``)."""

    def readinto(self, buffer: Any) -> int:
        self._before_read()
        view = memoryview(buffer).cast("B")
        if threading.current_thread().name.startswith(THREAD):
            with self.owner.lock:
                self.owner.buffers.append(view.obj)
        if self.owner.fail_after is not None:
            view = view[:max(0, self.owner.fail_after - self.raw.tell())]
        n: int = self.raw.readinto(view)
        self._count(n)
        return n


class SlowOpener:
    """``open_stream`` for tests: the local opener, slowed down, recording what happens."""

    def __init__(self, *, delay: float = 0.0, first_byte_delay: float = 0.0,
                 fail_after: int | None = None, stall: bool = False,
                 readinto: bool = False) -> None:
        self.delay, self.first_byte_delay, self.fail_after = delay, first_byte_delay, fail_after
        self.readinto = readinto  # whether its streams have ``readinto``
        self.buffers: list[Any] = []  # what read-ahead threads read into, in order
        self.stall = threading.Event() if stall else None
        self.lock = threading.Lock()
        self.events: list[tuple[str, str]] = []  # ("open", url) / ("asked", url), in order
        self.streams: list[Tracked] = []
        self.in_flight = 0
        self.peak = 0

    def __call__(self, url: str) -> Tracked:
        with self.lock:
            self.events.append(("open", url))
        time.sleep(self.delay)
        stream = (TrackedInto if self.readinto else Tracked)(LocalOpener().open(url, "rb"), self)
        with self.lock:
            self.streams.append(stream)
        return stream

    def opens(self) -> list[str]:
        return [url for what, url in self.events if what == "open"]


def _asking(ra: ReadAhead, opener: SlowOpener) -> Any:
    """``ra.open`` that records when the consumer asks for a shard and what it gets."""
    def open_stream(url: str) -> Any:
        with opener.lock:
            opener.events.append(("asked", url))
        stream = ra.open(url)
        stream.handed_out()  # the Tracked stream's, or forwarded to it by the wrapper
        return stream
    return open_stream


def _with_readahead(sources: list[dict[str, Any]], opener: SlowOpener, *, depth: int,
                    max_bytes: int, handler: Any = reraise_exception,
                    ras: list[ReadAhead] | None = None) -> Iterator[dict[str, Any]]:
    """The composition the lead wires into compat."""
    with ReadAhead(opener, depth=depth, max_bytes=max_bytes, pace=_pre_reading()) as ra:
        if ras is not None:
            ras.append(ra)
        yield from samples_from_shards(ra.sources(sources), handler,
                                         open_stream=_asking(ra, opener))


def _baseline(sources: list[dict[str, Any]], handler: Any = reraise_exception) -> list[Any]:
    return list(samples_from_shards(sources, handler, open_stream=SlowOpener()))


def _threads_end() -> list[threading.Thread]:
    """The read-ahead threads still alive after a short grace period."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [t for t in threading.enumerate() if t.name.startswith(THREAD)]
        if not alive:
            return []
        alive[0].join(0.05)
    return [t for t in threading.enumerate() if t.name.startswith(THREAD)]


@pytest.mark.parametrize("readinto", [False, True], ids=["read", "readinto"])
@pytest.mark.parametrize(("depth", "max_bytes"),
                         [(1, 64 << 20), (2, 100_000), (3, 0), (8, 1 << 20)])
def test_same_samples_as_without_readahead_and_one_open_each(
        shards: list[str], depth: int, max_bytes: int, readinto: bool) -> None:
    sources = [{"url": u} for u in shards]
    opener = SlowOpener(delay=0.005, readinto=readinto)
    ras: list[ReadAhead] = []
    got = list(_with_readahead(sources, opener, depth=depth, max_bytes=max_bytes, ras=ras))
    assert got == _baseline(sources)
    assert [s["__local_path__"] for s in got[::6]] == [os.path.abspath(u) for u in shards]
    assert Counter(opener.opens()) == Counter(shards)
    assert all(s.closed for s in opener.streams)
    stats = ras[0].stats
    assert stats.opened_ahead + stats.direct == len(shards)
    assert stats.hits + stats.waits + stats.direct == len(shards)
    assert stats.discarded == 0 and stats.failed == 0
    assert (stats.bytes_prefetched > 0) == (max_bytes > 0)
    assert _threads_end() == []



def test_a_thread_waits_for_the_next_shard_rather_than_end(
        shards: list[str], thread_starts: list[str]) -> None:
    """A read-ahead thread that finds no shard to open waits for the next one instead of
    ending, so that the consumer does not start a thread for every shard: over 32 shards at
    most ``depth`` threads are started, and they end at close."""
    sources = [{"url": u} for u in shards * 4]
    opener = SlowOpener()
    got = list(_with_readahead(sources, opener, depth=2, max_bytes=1 << 20))
    assert got == _baseline(sources)
    assert Counter(opener.opens()) == Counter(shards * 4)
    assert 1 <= thread_starts.count(THREAD) <= 2
    assert _threads_end() == []


def test_only_urls_worth_it_are_opened_ahead(shards: list[str]) -> None:
    """``worth`` says which shards are opened ahead; the others are opened when asked for,
    and every shard still reads the same. (A shard worth it that the consumer asks for before a
    thread got to it is opened then: seen on a loaded machine.)"""
    sources = [{"url": u} for u in shards]
    remote = set(shards[1::2])
    opener = SlowOpener(delay=0.005)
    with ReadAhead(opener, depth=3, max_bytes=1 << 20, worth=remote.__contains__,
                   pace=_pre_reading()) as ra:
        got = list(samples_from_shards(ra.sources(sources), reraise_exception,
                                             open_stream=_asking(ra, opener)))
        stats = ra.stats
    assert got == _baseline(sources)
    assert Counter(opener.opens()) == Counter(shards)
    assert stats.opened_ahead + stats.direct == len(shards)
    assert 1 <= stats.opened_ahead <= len(remote)
    for url in set(shards) - remote:  # opened right after it was asked for, not before
        asked = opener.events.index(("asked", url))
        assert opener.events[asked + 1] == ("open", url)
        assert ("open", url) not in opener.events[:asked]


def test_sources_yields_the_items_themselves(shards: list[str]) -> None:
    items: list[Any] = [{"url": shards[0], "x": 1}, {"no": "url"}, shards[1], {"url": shards[2]}]
    opener = SlowOpener()
    with ReadAhead(opener, depth=2, max_bytes=1000, pace=_pre_reading()) as ra:
        out = []
        for item in ra.sources(items):
            out.append(item)
            url = item if isinstance(item, str) else item.get("url")
            if url is not None:
                with ra.open(url) as stream:
                    assert stream.read() == Path(url).read_bytes()
    assert [id(x) for x in out] == [id(x) for x in items]
    assert Counter(opener.opens()) == Counter(shards[:3])
    assert ra.stats.hits + ra.stats.waits + ra.stats.direct == 3


@pytest.mark.parametrize("readinto", [False, True], ids=["read", "readinto"])
def test_bytes_in_flight_stay_under_the_bound(shards: list[str], readinto: bool) -> None:
    max_bytes, depth = 150_000, 3
    opener = SlowOpener(delay=0.01, readinto=readinto)
    ras: list[ReadAhead] = []
    got = list(_with_readahead([{"url": u} for u in shards], opener, depth=depth,
                               max_bytes=max_bytes, ras=ras))
    assert len(got) == 6 * len(shards)
    assert opener.peak > 0  # pre-reading really happened in the background
    assert opener.peak <= max_bytes
    assert 0 < ras[0].stats.peak_bytes <= max_bytes
    assert ras[0].stats.bytes_prefetched <= len(shards) * (max_bytes // depth)


def test_open_errors_reach_the_handler_in_shard_order(shards: list[str]) -> None:
    urls = list(shards)
    urls[2] = urls[2] + ".missing"
    urls[5] = urls[5] + ".missing"
    sources = [{"url": u} for u in urls]

    def run(open_with_readahead: bool) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []

        def handler(exn: BaseException) -> bool:
            assert isinstance(exn, ShardNotFoundError)
            events.append(("error", exn.url))
            return True

        samples = (_with_readahead(sources, SlowOpener(delay=0.005), depth=2,
                                   max_bytes=1 << 20, handler=handler)
                   if open_with_readahead else
                   samples_from_shards(sources, handler, open_stream=SlowOpener()))
        events.extend(("sample", s["__key__"]) for s in samples)
        return sorted(events, key=lambda e: e[1])  # errors are logged as they happen

    plain, ahead = run(False), run(True)
    assert ahead == plain
    assert ("error", urls[2]) in ahead and ("error", urls[5]) in ahead


def test_open_error_is_raised_where_the_shard_is_asked_for(shards: list[str]) -> None:
    urls = [shards[0], shards[1] + ".missing", shards[2]]
    seen: list[str] = []
    with ReadAhead(SlowOpener(), depth=2, max_bytes=0) as ra:
        for item in ra.sources(urls):
            try:
                ra.open(item).close()
                seen.append("ok")
            except ShardNotFoundError as exc:
                assert exc.url == urls[1]
                seen.append("missing")
    assert seen == ["ok", "missing", "ok"]
    assert ra.stats.failed == 1


@pytest.mark.parametrize("readinto", [False, True], ids=["read", "readinto"])
@pytest.mark.parametrize("max_bytes", [200_000, 400_000])
def test_read_error_after_the_preread_bytes_matches_a_direct_read(
        shards: list[str], max_bytes: int, readinto: bool) -> None:
    """The stream breaks after 100 kB: after the pre-read (200 kB for 2 shards ahead) or in
    it (400 kB; with ``readinto``, in the middle of a piece, whose bytes before the break are
    served): either way the same samples and errors as without read-ahead."""
    sources = [{"url": u} for u in shards[:3]]
    fail_after = 100_000  # inside the third sample of each shard (42 kB each)

    def run(depth: int) -> list[Any]:
        events: list[Any] = []

        def handler(exn: BaseException) -> bool:
            assert isinstance(exn, OpenError) and "connection reset" in str(exn)
            events.append(("error", exn.url))
            return True

        opener = SlowOpener(fail_after=fail_after, readinto=readinto)
        for s in _with_readahead(sources, opener, depth=depth, max_bytes=max_bytes,
                                 handler=handler):
            events.append(("sample", s["__key__"], s["bin"]))
        assert all(s.closed for s in opener.streams)
        return events

    ahead = run(2)
    assert ahead == run(0)
    kinds = [e[0] for e in ahead]
    assert kinds.count("error") == 3 and kinds[0] == "sample" and kinds[-1] == "error"


def test_break_closes_every_prepared_stream(shards: list[str]) -> None:
    opener = SlowOpener(delay=0.02)
    samples = _with_readahead([{"url": u} for u in shards], opener, depth=3,
                              max_bytes=1 << 20)
    for i, _sample in enumerate(samples):
        if i == 8:  # in the second shard
            break
    del samples  # as a DataLoader worker does: the generator goes, nobody calls close()
    gc.collect()
    assert _threads_end() == []
    assert opener.streams and all(s.closed for s in opener.streams)
    opened = opener.opens()
    assert len(opened) == len(set(opened)) <= 2 + 3


def test_unconsumed_prepared_shard_is_closed_and_other_urls_open_directly(
        shards: list[str]) -> None:
    opener = SlowOpener()
    with ReadAhead(opener, depth=2, max_bytes=10_000, pace=_pre_reading()) as ra:
        for i, url in enumerate(ra.sources(shards[:4])):
            if i == 1:
                continue  # the prepared shard is never asked for
            stream = ra.open(shards[7] if i == 2 else url)
            stream.close()
    stats = ra.stats
    # shard 7 is opened directly; a prepared shard no thread has claimed yet is opened
    # directly too when asked for (that can happen to the first one)
    assert stats.discarded == 2 and stats.hits + stats.waits + stats.direct == 3
    assert shards[7] in opener.opens()
    assert set(Counter(opener.opens()).values()) == {1}
    assert set(opener.opens()) >= {shards[0], shards[3], shards[7]}
    assert all(s.closed for s in opener.streams)


def test_close_interrupts_a_stalled_read(shards: list[str]) -> None:
    opener = SlowOpener(stall=True)
    ra = ReadAhead(opener, depth=2, max_bytes=1 << 20, pace=_pre_reading())
    it = ra.sources(shards)
    next(it)
    while len(opener.streams) < 2:  # both threads are now stuck in a read
        time.sleep(0.01)
    it.close()
    assert _threads_end() == []
    assert all(s.closed for s in opener.streams)


@pytest.mark.parametrize("readinto", [False, True], ids=["read", "readinto"])
def test_prefetched_stream_reads_like_the_file(shards: list[str], readinto: bool) -> None:
    data = Path(shards[0]).read_bytes()
    for sizes in ([1, 511, 4096, 70_000, 1 << 20, -1], [100_000, 0, 3], [30_000] * 3):
        with ReadAhead(SlowOpener(readinto=readinto), depth=1, max_bytes=70_001,
                       pace=_pre_reading()) as ra:
            for url in ra.sources([shards[0]]):
                stream = ra.open(url)
                assert stream.local_path == os.path.abspath(url)  # type: ignore[attr-defined]
                assert stream.readable()
                parts = []
                for n in sizes:
                    buf = bytearray(max(n, 0))
                    if n > 0 and len(parts) % 2:
                        k = stream.readinto(buf)
                        parts.append(bytes(buf[:k]))
                    else:
                        parts.append(stream.read(n))
                parts.append(stream.read())
                assert stream.tell() == len(data)
                stream.close()
                assert stream.closed
        assert b"".join(parts) == data
        assert ra.stats.bytes_prefetched == 70_001


def test_preread_buffers_are_reused(tmp_path: Path) -> None:
    """Read-ahead reads into buffers it reuses once their bytes are consumed: over 12 shards,
    no more buffers than shards in flight, and every byte still the file's."""
    shards = _make_shards(tmp_path, 12)
    opener = SlowOpener(readinto=True)
    depth, share = 2, 100_000
    got = list(_with_readahead([{"url": u} for u in shards], opener, depth=depth,
                               max_bytes=depth * share))
    assert got == _baseline([{"url": u} for u in shards])
    # one piece each (100 kB < 1 MiB) for each shard pre-read; a shard the consumer takes
    # before its pre-read began (a busy machine) has none. More pieces than the buffers
    # allowed below: buffers were reused.
    assert len(opener.buffers) >= depth + 2, len(opener.buffers)
    distinct = {id(b) for b in opener.buffers}  # all kept alive by the list: ids are unique
    assert len(distinct) <= depth + 1, (len(distinct), len(opener.buffers))
    assert all(len(b) == share for b in opener.buffers)


@pytest.mark.parametrize("readinto", [False, True], ids=["read", "readinto"])
def test_a_shard_read_ahead_to_its_end_reads_to_its_end(shards: list[str], readinto: bool) -> None:
    """A pre-read that meets the end of the stream: every byte, then an empty read."""
    data = Path(shards[0]).read_bytes()
    with ReadAhead(SlowOpener(readinto=readinto), depth=1, max_bytes=1 << 20,
                   pace=_pre_reading()) as ra:
        for url in ra.sources([shards[0]]):
            with ra.open(url) as stream:
                assert stream.read() == data
                assert stream.read(10) == b""
                assert stream.readinto(bytearray(10)) == 0
        assert ra.stats.bytes_prefetched == len(data)


def test_a_share_above_a_mib_is_read_in_whole_mib(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    data = os.urandom(3 << 20)
    path.write_bytes(data)
    opener = SlowOpener(readinto=True)
    with ReadAhead(opener, depth=1, max_bytes=(5 << 20) // 2, pace=_pre_reading()) as ra:
        for url in ra.sources([str(path)]):
            with ra.open(url) as stream:
                assert stream.read() == data
        assert ra.stats.bytes_prefetched == 2 << 20  # 2.5 MiB rounded down
    assert {len(b) for b in opener.buffers} == {1 << 20}


def test_lookahead_is_bounded(shards: list[str]) -> None:
    depth = 2
    opener = SlowOpener(delay=0.05)
    ras: list[ReadAhead] = []
    got = list(_with_readahead([{"url": u} for u in shards], opener, depth=depth,
                               max_bytes=1 << 20, ras=ras))
    assert len(got) == 6 * len(shards)
    order = {event: i for i, event in enumerate(opener.events)}
    for k in range(len(shards) - depth - 1):
        assert order[("asked", shards[k])] < order[("open", shards[k + depth + 1])]
    stats = ras[0].stats
    assert stats.opened_ahead + stats.direct == len(shards)
    assert stats.opened_ahead >= len(shards) // 2  # in the background (bar a thread-start race)
    assert stats.waits + stats.hits + stats.direct == len(shards)


@pytest.mark.parametrize(("pays", "lead", "ahead"), [(False, 1, 1), (False, 3, 3),
                                                     (True, 1, 4)])
def test_shards_opened_ahead_are_the_lead_until_pre_reading_pays(
        shards: list[str], pays: bool, lead: int, ahead: int) -> None:
    """Each shard opened ahead is a GET: while the connections keep up only ``lead`` are, so
    that a run stopped after its first shard opened at most ``1 + lead``; ``depth`` once
    pre-reading pays."""
    pulled: list[str] = []

    def items() -> Iterator[dict[str, Any]]:
        for url in shards:
            pulled.append(url)
            yield {"url": url}

    opener = SlowOpener()
    with ReadAhead(opener, depth=4, max_bytes=1 << 20, pace=Pace(pays=pays), lead=lead) as ra:
        for item in ra.sources(items()):
            ra.open(item["url"]).close()
            break
    assert pulled == shards[:1 + ahead]
    assert set(opener.opens()) <= set(pulled)  # (one not yet opened at the break is not)


def test_a_shard_opened_ahead_and_dropped_is_closed_unread(shards: list[str]) -> None:
    """A stream the consumer never got is closed with its ``close_unread()`` (a cache fill
    stops there), one the consumer got with its own ``close()``."""
    closed: dict[str, str] = {}

    class Stream(io.BytesIO):
        def __init__(self, url: str) -> None:
            super().__init__(b"")
            self.url = url

        def close_unread(self) -> None:
            closed[self.url] = "unread"
            super().close()

        def close(self) -> None:
            closed.setdefault(self.url, "closed")
            super().close()

    with ReadAhead(Stream, depth=2, max_bytes=0) as ra:
        for item in ra.sources([{"url": u} for u in shards]):
            ra.open(item["url"]).close()
            break
    assert closed[shards[0]] == "closed"
    assert all(closed.get(u, "unread") == "unread" for u in shards[1:])


def test_depth_zero_is_a_plain_pass_through(shards: list[str]) -> None:
    opener = SlowOpener()
    items = [{"url": u} for u in shards[:3]]
    before = {t.ident for t in threading.enumerate()}
    with ReadAhead(opener, depth=0, max_bytes=1 << 20) as ra:
        out = []
        for item in ra.sources(items):
            out.append(item)
            stream = ra.open(item["url"])
            assert isinstance(stream, Tracked)  # the opener's own stream
            stream.close()
        assert {t.ident for t in threading.enumerate()} <= before
    assert [id(x) for x in out] == [id(x) for x in items]
    assert ra.stats == ReadAheadStats(direct=3)


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_bad_options_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="read-ahead"):
        ReadAhead(SlowOpener(), depth=bad, max_bytes=0)
    with pytest.raises(ValueError, match="read-ahead"):
        ReadAhead(SlowOpener(), depth=1, max_bytes=bad)


_EXIT_SCRIPT = """
import sys, time
sys.path[:0] = [{here!r}, {tests!r}]
from pathlib import Path
from test_readahead import SlowOpener, _make_shards, _with_readahead
urls = _make_shards(Path({tmp!r}), 6)
opener = SlowOpener(delay=0.3, first_byte_delay=0.3)
samples = _with_readahead([{{"url": u}} for u in urls], opener, depth=3, max_bytes=1 << 20)
for sample in samples:
    break  # threads are busy opening and pre-reading the next shards; no close()
print("done")
"""


def test_interpreter_exit_with_readahead_threads_busy(tmp_path: Path) -> None:
    here = Path(__file__).parent
    script = _EXIT_SCRIPT.format(here=str(here), tests=str(here.parent), tmp=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr, out.stdout) == (0, "", "done\n")
