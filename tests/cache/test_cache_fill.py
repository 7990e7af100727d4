"""Regression tests for the shard cache's fill path (wds_cloud/cache/fill.py and tee.py),
against nginx and the fault proxy: the downloading reader tees the store's stream into a
:class:`Fill`, the thread that reads each piece writes it and publishes the entry after the
last one, readers elsewhere follow the growing file, a ``wds-cache-pump`` thread pulls the
rest when followers wait on an idle reader, and a reader closing within ``FINISH_TAIL`` of the
end pulls it itself.

1. a tar shard whose zero padding (after the end-of-archive blocks) comes late: the reader
   stops at the end-of-archive, the download still finishes, is published byte-exact, and a
   second epoch asks the server for nothing; a reader closing near the end pulls the rest
   itself and has published the entry when its close returns;
2. a reader closing far from the end with nobody along: the download is dropped, nothing is
   left behind and the entry's lock is free;
3. a full disk (``RLIMIT_FSIZE`` in a child): the reader gets every byte, uncached, from one
   GET; nothing is published and nothing is left in ``partial/``; the same while the pump
   runs ahead of the failing disk (the reader then asks the store again from its byte);
4. follower liveness: a downloading process that stays idle with its stream open does not hold
   up another process reading the same shard: the pump finishes the one GET; and a reader
   closing far from the end while another process reads along does not drop the download;
5. ``wait_downloads(0)`` is False while this process downloads, True once it is published;
6. a piece is in the file when its reader gets it, and the read of the last byte publishes;
   the entry's blocks are allocated when its download starts (its size still grows).

The children are ``sys.executable`` running tests/cache/cacheprocs/child.py (driven line by line by
tests/cache/cacheprocs/driver.py), or a few lines given with ``-c`` (run with a timeout); each is
killed when its test ends, and those driven line by line also get SIGKILL if the test process
dies.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import random
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest
from cacheprocs.driver import WAIT, Children, Spawn, let_go, release
from cachetools import cache_files, settled_log, shard_gets, wait_for
from stores import FaultProxy, HttpStore, NginxServer
from stores.procs import child_env

import wds_cloud as wds
from wds_cloud.cache import ShardCache, wait_downloads
from wds_cloud.cache import admin as cacheadmin
from wds_cloud.cache.fill import WRITE_BYTES
from wds_cloud.cache.layout import CacheLayout, preallocate
from wds_cloud.cache.tee import FINISH_TAIL

MiB = 1 << 20


# -- helpers ---------------------------------------------------------------------------------


def can_preallocate(directory: Path) -> bool:
    """Whether the cache's preallocation works in ``directory`` (Linux, a filesystem with
    ``fallocate``): a probe file gets its blocks and keeps its size 0."""
    probe = directory / "preallocate-probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        preallocate(fd, MiB)
        st = os.fstat(fd)
        return st.st_size == 0 and st.st_blocks * 512 >= MiB
    finally:
        os.close(fd)
        probe.unlink()


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_with_tail(samples: list[tuple[str, dict[str, bytes]]], total: int) -> bytes:
    """A tar archive written by Python's tarfile (members, two zero blocks, padding to a
    record), then zero blocks up to ``total`` bytes: trailing zeros any tar reader accepts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    assert len(data) % 512 == 0 and total % 512 == 0 and total >= len(data)
    return data + bytes(total - len(data))


def stall_fraction(seed: int) -> float:
    """Where the fault proxy (seeded with ``seed``, only ``stall`` set) pauses the body of the
    first response it plans, as a fraction of its length: one draw for ``stall_rate``, then
    ``uniform(0.1, 0.9)`` (tests/stores/faultproxy.py ``_plan``)."""
    rng = random.Random(seed)
    rng.random()
    return rng.uniform(0.1, 0.9)


def layout(root: Path) -> CacheLayout:
    return CacheLayout(str(root))


def entry_bytes(root: Path, url: str) -> bytes:
    return (root / "data" / layout(root).name_for(url)).read_bytes()


def read_all(stream: BinaryIO, piece: int = MiB) -> bytes:
    parts = []
    while chunk := stream.read(piece):
        parts.append(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class Shard:
    """A shard's bytes, put under ``key`` into a new store of the nginx server ``server``."""

    server: NginxServer
    store: HttpStore
    key: str
    source: bytes

    @property
    def url(self) -> str:
        return self.store.url(self.key)

    def gets(self) -> int:
        """GETs of it in nginx's own log (every request that ended before this call)."""
        return shard_gets(settled_log(self.server), f"/{self.store.directory}/{self.key}")


def put_shard(server: NginxServer, key: str, source: bytes) -> Shard:
    store = server.new_store()
    store.put(key, source)
    return Shard(server, store, key, source)


def assert_published(cache: Path, url: str, data: bytes) -> None:
    """This process's downloads end, and leave the cache holding one entry, ``url``'s, with
    exactly ``data``, and nothing in ``partial/``."""
    assert wait_downloads(WAIT)
    assert cache_files(cache) == [layout(cache).name_for(url)]
    assert cache_files(cache, "partial") == []
    assert entry_bytes(cache, url) == data


@dataclass(frozen=True)
class Ran:
    """What a ``-c`` child printed; ``why`` goes with an assertion about it."""

    lines: list[str]
    stderr: str
    why: str


def run_full_disk(script: str, url: str, cache: Path, *args: object) -> Ran:
    """Run ``script`` (argv: ``url``, ``cache``, a 1 MiB file-size limit, ``args``) in a child
    with the cache's lines on its stderr; it must exit 0 within ``WAIT`` seconds."""
    done = subprocess.run(
        [sys.executable, "-c", script, url, str(cache), str(MiB), *map(str, args)],
        capture_output=True,
        text=True, timeout=WAIT, env=child_env({"WDS_VERBOSE_CACHE": "1"}))
    why = f"stdout {done.stdout!r}; stderr tail:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, why
    return Ran(done.stdout.splitlines(), done.stderr, why)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(mode, cache, urls, *, expect=None, first=0) -> Child`` (a child.py process, with
    the cache's lines on its stderr); every child is killed when the test ends."""
    with Children(tmp_path) as children:
        yield children.spawn


# -- 1. the tail after the end-of-archive comes late -----------------------------------------


def test_late_tail_after_end_of_archive_is_published(
    nginx_server: NginxServer, fault_proxy: Callable[..., FaultProxy], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tar reader stops at the end-of-archive blocks, ``FINISH_TAIL`` or less before the
    end, while the rest of the response (zero padding) is held up by the server: the download
    still finishes from the same response (one GET), the entry is published byte-identical to
    the source, and a second epoch makes no request at all.

    Pre-reading is turned off (``WDS_READAHEAD_BYTES=0``) so that the reader, not read-ahead,
    reads the shard: it asks for 1 MiB at a time, which holds all the members and the
    end-of-archive; the proxy pauses the body well after that first MiB (its seed is chosen
    for it), so the reader closes the stream with 0.75 MiB still to come."""
    rng = random.Random(1)
    samples = [(f"s{i:02d}", {"bin": rng.randbytes(40_000), "txt": f"s{i:02d}".encode()})
               for i in range(4)]
    total = MiB + 3 * MiB // 4
    data = tar_with_tail(samples, total)
    assert data[MiB - 1024:] == bytes(total - MiB + 1024)  # members and end-of-archive < 1 MiB
    assert total - MiB <= FINISH_TAIL
    shard = put_shard(nginx_server, "late/tail-000.tar", data)
    seed = next(s for s in range(10_000) if 0.75 <= stall_fraction(s) <= 0.88)
    proxy = fault_proxy(shard.store, stall=1.5, seed=seed, only_paths=re.escape(f"/{shard.key}"))
    url = shard.store.proxied(proxy).url(shard.key)
    cache = tmp_path / "cache"
    monkeypatch.setenv("WDS_READAHEAD_BYTES", "0")
    dataset = wds.WebDataset(url, cache_dir=str(cache), shardshuffle=False)

    want = [(key, members["bin"]) for key, members in samples]
    assert [(s["__key__"], s["bin"]) for s in dataset] == want
    assert proxy.stats()["faults"].get("stall") == 1  # the pause happened, in this response
    assert_published(cache, url, data)
    assert cacheadmin.verify(ShardCache(cache), remove=False) == (1, [])
    assert shard.gets() == 1  # the tail came from the same response

    assert [(s["__key__"], s["bin"]) for s in dataset] == want  # epoch 2: from the cache
    assert shard.gets() == 1
    assert [(r.method, r.path) for r in proxy.requests()] == [
        ("GET", f"/{shard.store.directory}/{shard.key}")]


# -- 2. a reader closing far from the end ----------------------------------------------------


@pytest.mark.parametrize("left", [1, 300_000, FINISH_TAIL])
def test_reader_closing_near_the_end_pulls_the_rest_itself(
    nginx_server: NginxServer, tmp_path: Path, thread_starts: list[str], left: int,
) -> None:
    """A reader closing ``left`` bytes (at most ``FINISH_TAIL``) before the end pulls them in
    the closing thread, with no pump thread to start and wait for: the entry is published,
    byte-exact, when ``close`` returns, from the one GET."""
    shard = put_shard(nginx_server, f"near/end-{left}.tar", blob(3 * MiB, 9))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"
    stream = wds.gopen(url, cache_dir=str(cache))
    head = b""
    while len(head) < len(source) - left:
        head += stream.read(len(source) - left - len(head))
    stream.close()
    assert head == source[:-left]
    assert "wds-cache-pump" not in thread_starts
    assert_published(cache, url, source)
    assert wait_downloads(0)
    assert shard.gets() == 1


@pytest.mark.parametrize("read", [0, 100_000])
def test_a_stream_only_read_ahead_stops_its_download(
        nginx_server: NginxServer, tmp_path: Path, read: int) -> None:
    """A shard a read-ahead opened (and pre-read ``read`` bytes of) and dropped unread is
    closed with ``close_unread()``: its download stops, even within ``FINISH_TAIL`` of the end
    (a small shard), leaving no entry and no partial file, its lock free; a later read fills
    it normally."""
    shard = put_shard(nginx_server, f"ahead/shard-{read}.tar", blob(FINISH_TAIL // 2, 4))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"
    stream = wds.gopen(url, cache_dir=str(cache))
    assert len(stream.read(read)) == read
    stream.close_unread()  # type: ignore[attr-defined]
    assert wait_downloads(WAIT)
    assert cache_files(cache) == [] and cache_files(cache, "partial") == []
    assert layout(cache).lock_free(layout(cache).name_for(url))
    with wds.gopen(url, cache_dir=str(cache)) as stream:
        assert read_all(stream) == source
    assert_published(cache, url, source)


def test_reader_closing_early_drops_the_download(nginx_server: NginxServer,
                                                 tmp_path: Path) -> None:
    """Read 1 MiB of a 16 MiB shard through the cache and close, nobody reading along: the
    download is dropped (no entry, nothing in ``partial/``) and its lock is free; the next
    open downloads and publishes it normally."""
    shard = put_shard(nginx_server, "early/shard-000.tar", blob(16 * MiB, 2))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"

    stream = wds.gopen(url, cache_dir=str(cache))
    head = b""
    while len(head) < MiB:
        head += stream.read(MiB - len(head))
    stream.close()
    assert head == source[:MiB]
    assert wait_downloads(WAIT)
    assert cache_files(cache) == []
    assert cache_files(cache, "partial") == []
    assert layout(cache).lock_free(layout(cache).name_for(url))

    with wds.gopen(url, cache_dir=str(cache)) as stream:
        assert read_all(stream) == source
    assert_published(cache, url, source)
    assert shard.gets() == 2  # the dropped one and the one that filled


# -- 3. the disk fills up mid-download -------------------------------------------------------

_FULL_DISK = """\
import hashlib, resource, signal, sys
import wds_cloud as wds
from wds_cloud.cache import wait_downloads
url, cache, limit, piece = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
h, n = hashlib.sha256(), 0
with wds.gopen(url, cache_dir=cache) as stream:
    while chunk := stream.read(piece):
        h.update(chunk)
        n += len(chunk)
print("sha", h.hexdigest(), n, flush=True)
print("settled", wait_downloads(30), flush=True)
"""


@pytest.mark.parametrize(("size", "piece"),
                         [(4 * MiB, MiB), (4 * MiB, 100_000), (MiB + 300_000, MiB)])
def test_write_failure_drops_the_entry_and_the_reader_goes_on(
    nginx_server: NginxServer, tmp_path: Path, size: int, piece: int,
) -> None:
    """A child whose files may not grow past 1 MiB (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored: a
    write past it fails with ``EFBIG``, as on a full disk) reads a shard through the cache,
    ``piece`` bytes at a time: the write fails in the middle of the shard, in the middle of
    pieces of 100 KB written together, or when the entry ends (its last 300,000 bytes, held
    until then). The child gets every byte from its one GET and exits 0; nothing is
    published and nothing is left in ``partial/``. The parent then fills the entry
    normally."""
    shard = put_shard(nginx_server, f"full/shard-{size}-{piece}.tar", blob(size, 3))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"
    ran = run_full_disk(_FULL_DISK, url, cache, piece)
    why = ran.why
    assert f"sha {sha(source)} {len(source)}" in ran.lines, why
    assert "settled True" in ran.lines, why
    assert "cache abandon" in ran.stderr, why  # a fill was started, then dropped
    assert "File too large" in ran.stderr, why  # because of the failed write
    assert cache_files(cache) == [], why
    assert cache_files(cache, "meta") == [], why
    assert cache_files(cache, "partial") == [], why
    assert shard.gets() == 1  # the reader went on with the same response

    assert cacheadmin.recover(ShardCache(cache)) == 0  # nothing stale either
    with wds.gopen(url, cache_dir=str(cache)) as stream:
        assert read_all(stream) == source
    assert wait_downloads(WAIT)
    assert entry_bytes(cache, url) == source


_FULL_DISK_PUMPING = """\
import hashlib, resource, signal, sys
import wds_cloud as wds
from wds_cloud.cache import wait_downloads
url, cache, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
with wds.gopen(url, cache_dir=cache) as a:
    head = a.read(65536)
    with wds.gopen(url, cache_dir=cache) as b:
        print("B", hashlib.sha256(b.read()).hexdigest(), flush=True)
    try:
        print("A", hashlib.sha256(head + a.read()).hexdigest(), flush=True)
    except Exception as exc:
        print("A failed:", type(exc).__name__, exc, flush=True)
print("settled", wait_downloads(30), flush=True)
"""


def test_write_failure_while_pumping_the_reader_goes_on(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    """As above, but reader A stays idle after 64 KiB while reader B (same process) reads along,
    so A's pump pulls ahead of the disk when the write fails: A must still get the rest of
    its shard (uncached), not an error, and nothing may be published."""
    source = blob(8 * MiB, 6)
    url = put_shard(nginx_server, "full/pumped-000.tar", source).url
    cache = tmp_path / "cache"
    ran = run_full_disk(_FULL_DISK_PUMPING, url, cache)
    why = ran.why
    assert f"B {sha(source)}" in ran.lines, why
    assert cache_files(cache) == [], why
    assert f"A {sha(source)}" in ran.lines, why
    assert "settled True" in ran.lines, why
    assert cache_files(cache, "partial") == [], why


# -- 4. an idle downloader does not hold up its followers ------------------------------------


def test_idle_downloader_does_not_hold_up_a_follower(
    nginx_server: NginxServer, spawn: Spawn, tmp_path: Path,
) -> None:
    """Process A opens a shard through the cache (it downloads it), reads 64 KiB and then holds
    the stream open without reading. Process B reads the whole shard through the same cache:
    it reads along A's download and completes byte-exact while A is alive and idle (A's pump
    pulls the rest); nginx saw one GET; the entry is published by A; A then reads the rest of
    its stream from the file, byte-exact."""
    shard = put_shard(nginx_server, "idle/shard-000.tar", blob(8 * MiB, 4))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"

    a = spawn("hold", cache, [url], first=64 * 1024)
    a.expect("got 65536")
    b = spawn("shards", cache, [url], expect={url: sha(source)})
    release(b)
    b.expect("ok 0")  # B read the whole shard, its SHA-256 right
    b.expect("done")
    assert a.proc.poll() is None and a.lines == ["open", "got 65536"]  # A alive, still idle
    assert "cache follow" in b.stderr(), b.stderr()[-3000:]  # B read along A's download
    let_go(b)

    name = layout(cache).name_for(url)
    wait_for(lambda: cache_files(cache) == [name], "A's download to be published")
    assert entry_bytes(cache, url) == source
    assert shard.gets() == 1

    a.send()  # A reads the rest of its stream
    assert a.expect("sha ") == f"sha {sha(source)}"
    let_go(a)
    assert cache_files(cache, "partial") == []
    assert shard.gets() == 1


def held_by_someone(path: Path) -> bool:
    """Whether some process holds a ``flock`` on ``path`` (probed without keeping a lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_closing_early_with_a_follower_finishes_the_download(
    nginx_server: NginxServer, spawn: Spawn, tmp_path: Path,
) -> None:
    """This process downloads a 16 MiB shard and closes its stream after a few MiB at most,
    as soon as another process reads along: the download is not dropped; the follower gets
    every byte, the entry is published by this process, and nginx saw one GET.

    This reader keeps reading small pieces until the follower holds its lock, so that it is
    rarely idle long enough for the writer to start the pump first: its close usually starts
    the pump itself (either way the close must not cancel the download)."""
    shard = put_shard(nginx_server, "along/shard-000.tar", blob(16 * MiB, 7))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"
    b = spawn("shards", cache, [url], expect={url: sha(source)})
    b.expect("ready")

    stream = wds.gopen(url, cache_dir=str(cache))
    part = cache / "partial" / layout(cache).name_for(url)
    head = b""
    try:
        b.send()
        while not held_by_someone(part) and len(head) < len(source) - 2 * FINISH_TAIL:
            head += stream.read(4096)
            time.sleep(0.005)  # pacing only: the follower is waited for by its lock
    finally:
        stream.close()
    assert head == source[:len(head)]
    b.expect("ok 0")
    b.expect("done")
    assert "cache follow" in b.stderr(), b.stderr()[-3000:]
    let_go(b)
    assert_published(cache, url, source)
    assert shard.gets() == 1


# -- 5. wait_downloads -----------------------------------------------------------------------


def test_wait_downloads_reports_downloads_in_progress(
    nginx_server: NginxServer, fault_proxy: Callable[..., FaultProxy], tmp_path: Path,
) -> None:
    """``wait_downloads(0)`` is False while this process's download of a shard from a slow
    server is under way; ``wait_downloads(timeout)`` waits for it to be published (the shard
    is read in another thread) and returns True, and so does ``wait_downloads(0)`` after."""
    shard = put_shard(nginx_server, "wait/shard-000.tar", blob(3 * MiB, 5))
    source = shard.source
    proxy = fault_proxy(shard.store, stall=1.0, only_paths=re.escape(f"/{shard.key}"))
    url = shard.store.proxied(proxy).url(shard.key)
    cache = tmp_path / "cache"

    stream = wds.gopen(url, cache_dir=str(cache))
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(read_all(stream)), daemon=True)
    try:
        assert not wait_downloads(0)  # opened, nothing read yet: the download is under way
        assert cache_files(cache) == []
        reader.start()
        assert wait_downloads(WAIT)
        assert cache_files(cache) == [layout(cache).name_for(url)]
        reader.join(WAIT)
        assert got == [source]
    finally:
        stream.close()
    assert wait_downloads(0)
    assert proxy.stats()["faults"].get("stall") == 1
    assert entry_bytes(cache, url) == source
    assert cache_files(cache, "partial") == []


# -- 6. a forked child does not keep its parent's entries locked -----------------------------


def test_a_forked_child_does_not_keep_the_parents_download_locked(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    """A DataLoader worker is forked while this process downloads a shard (it holds the entry's
    lock). The child inherits the lock's descriptor; it must close its copy, or the entry
    would stay locked until the child exits, and every reader would wait on a download that
    nobody makes. Here the parent drops its download while the child lives: the lock is free,
    and the next reader downloads the shard."""
    import multiprocessing

    shard = put_shard(nginx_server, "fork/shard-000.tar", blob(4 * MiB, 9))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"
    layout = CacheLayout(str(cache))
    stream = wds.gopen(url, cache_dir=str(cache))
    assert stream.read(64 * 1024) == source[: 64 * 1024]
    assert not layout.lock_free(layout.name_for(url))  # downloading: locked
    forked = multiprocessing.get_context("fork")
    ready, release = forked.Event(), forked.Event()

    def child_runs() -> None:
        ready.set()  # past the fork and its after-fork handlers
        release.wait(WAIT)

    child = forked.Process(target=child_runs)
    child.start()
    try:
        assert ready.wait(WAIT)  # (until it has run them, it holds the lock as its parent does)
        stream.close()  # far from the end, nobody along: the download is dropped
        assert wait_downloads(WAIT)
        assert layout.lock_free(layout.name_for(url)), "the forked child holds the entry's lock"
        with wds.gopen(url, cache_dir=str(cache)) as again:
            assert again.read() == source
        assert wait_downloads(WAIT)
        assert len(cache_files(cache)) == 1
    finally:
        release.set()
        child.join(WAIT)


# -- 6. the reading thread writes --------------------------------------------------------------


@pytest.mark.parametrize("how", ["read", "readinto"])
def test_what_its_reader_gets_is_in_the_file_at_once_or_soon(
    nginx_server: NginxServer, tmp_path: Path, how: str,
) -> None:
    """The thread that reads a piece from the store writes it: there is no writer to wait
    for. A piece read into the caller's buffer (``readinto``) is in the file under
    ``partial/`` when the read returns; pieces returned as ``bytes`` (which nobody can change)
    are written together once about ``WRITE_BYTES`` of them are read, so the file lags the
    reader by less than that. The read that gets the last byte has published the entry,
    with no ``wait_downloads``."""
    shard = put_shard(nginx_server, f"inline/{how}-000.tar", blob(4 * MiB + 1000, 8))
    url, source, cache = shard.url, shard.source, tmp_path / "cache"
    name = layout(cache).name_for(url)
    allocates = can_preallocate(tmp_path)
    lags = set()
    with wds.gopen(url, cache_dir=str(cache)) as stream:
        got = b""
        buffer = bytearray(MiB // 3)
        while len(got) < len(source):
            if how == "read":
                got += stream.read(MiB // 3)
            else:
                got += buffer[:stream.readinto(buffer)]
            if len(got) < len(source):
                part = (cache / "partial" / name).read_bytes()
                assert part == got[:len(part)]
                lags.add(len(got) - len(part))
                if allocates:  # the blocks of the whole entry, from the start
                    stat = (cache / "partial" / name).stat()
                    assert stat.st_blocks * 512 >= len(source) > stat.st_size
        assert got == source
        assert cache_files(cache) == [name]  # published by that last read
        assert wait_downloads(0)
        assert stream.read(MiB) == b""
    assert max(lags) < WRITE_BYTES
    if how == "readinto":
        assert lags == {0}
    assert entry_bytes(cache, url) == source
    assert cache_files(cache, "partial") == []
    assert cacheadmin.verify(ShardCache(cache), remove=False) == (1, [])
