"""The shard cache across processes, against real servers (nginx, and the fault proxy for a slow
server): DataLoader workers over two epochs, separate processes sharing one download, SIGKILL at
random points, a reader taking over from a killed download, and eviction sparing what is read.

The children are tests/cacheprocs/child.py, driven line by line over stdin/stdout; every child
is killed when its test ends (and gets SIGKILL if the test process dies)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from shardgen import write_tar
from stores import FaultProxy, HttpStore, NginxServer
from stores.procs import child_env

import wds_cloud as wds
from wds_cloud import cacheadmin
from wds_cloud.cache import ShardCache
from wds_cloud.cachelayout import CacheLayout

CHILD = Path(__file__).with_name("cacheprocs") / "child.py"
WAIT = 60.0  # seconds any awaited condition may take on a loaded machine before the test fails

Sample = tuple[str, str, str]  # (url, key, digest of its members)


# -- shards ----------------------------------------------------------------------------------


def digest(sample: dict[str, Any]) -> str:
    """The SHA-256 of a sample's members in the order of their names (as child.py computes)."""
    h = hashlib.sha256()
    for name in sorted(k for k in sample if not k.startswith("__")):
        h.update(name.encode() + b"\0" + sample[name] + b"\0")
    return h.hexdigest()


def as_sample(sample: dict[str, Any]) -> Sample:
    return sample["__url__"], sample["__key__"], digest(sample)


class Shards:
    """``n`` tar shards put into ``store`` under ``data/``: their keys, bytes and samples."""

    def __init__(self, store: HttpStore, tmp: Path, n: int, *, per_shard: int, size: int) -> None:
        self.store = store
        self.keys = [f"data/shard-{k:03d}.tar" for k in range(n)]
        self.blobs: dict[str, bytes] = {}
        self.members: dict[str, list[tuple[str, dict[str, bytes]]]] = {}
        rng = random.Random(n * 1000 + size)
        for k, key in enumerate(self.keys):
            samples = [(f"s{k:03d}-{i:03d}", {"bin": rng.randbytes(size),
                                              "cls": str(i).encode()})
                       for i in range(per_shard)]
            path = write_tar(tmp / f"src-{k}.tar", samples)
            self.blobs[key] = Path(path).read_bytes()
            self.members[key] = samples
            store.put(key, self.blobs[key])

    def samples(self, base: HttpStore) -> Counter[Sample]:
        """Every sample once, with the URLs of ``base`` (the store, or the store via a proxy)."""
        out: Counter[Sample] = Counter()
        for key, samples in self.members.items():
            for name, members in samples:
                out[(base.url(key), name, digest(dict(members)))] += 1
        return out

    def sha(self, base: HttpStore) -> dict[str, str]:
        return {base.url(k): hashlib.sha256(b).hexdigest() for k, b in self.blobs.items()}


def shard_gets(nginx: NginxServer, store: HttpStore) -> list[tuple[str, str, int]]:
    """(method, uri, status) of every request nginx logged under ``store``'s directory."""
    prefix = f"/{store.directory}/"
    return [(e.method, e.uri, e.status) for e in nginx.access_log() if e.uri.startswith(prefix)]


def proxied_reads(proxy: FaultProxy) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in proxy.requests() if r.path.endswith(".tar")]


def ls(path: Path) -> list[str]:
    """The names in directory ``path`` ([] before the cache made it)."""
    return os.listdir(path) if path.exists() else []


def check_entries(root: Path, shards: Shards, base: HttpStore) -> set[str]:
    """Every file in ``data/`` is the entry of one of the shards and holds exactly its bytes;
    ``verify`` finds nothing wrong. Returns the names present."""
    layout = CacheLayout(str(root))
    names = {layout.name_for(base.url(k)): k for k in shards.keys}
    present = set(ls(root / "data"))
    for name in present:
        assert name in names, f"data/{name} is no entry of this dataset"
        assert (root / "data" / name).read_bytes() == shards.blobs[names[name]], (
            f"data/{name} differs from {names[name]}")
    _, problems = cacheadmin.verify(ShardCache(root), remove=False)
    assert problems == []
    return present


def leftovers(root: Path) -> list[str]:
    """Downloads in progress (or stale ones) and temporary files anywhere in the cache."""
    found = [f"partial/{n}" for n in ls(root / "partial")]
    for sub in ("data", "meta", "locks"):
        found += [f"{sub}/{n}" for n in ls(root / sub) if n.endswith(".tmp")]
    return sorted(found)


# -- children --------------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Child:
    """One tests/cacheprocs/child.py process; its stdout lines are collected by a thread."""

    def __init__(self, argv: list[str], *, env: dict[str, str], stderr: Path) -> None:
        self.stderr_path = stderr
        self.mode = argv[2]
        with open(stderr, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                text=True, bufsize=1, preexec_fn=_die_with_parent)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def _fail(self, why: str) -> None:
        pytest.fail(f"child {self.mode} (pid {self.proc.pid}) {why}; stdout "
                    f"{self.lines[-5:]}; stderr tail:\n{self.stderr()[-3000:]}", pytrace=False)

    def expect(self, prefix: str, timeout: float = WAIT) -> str:
        """The next stdout line starting with ``prefix`` (earlier lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"did not print {prefix!r} within {timeout:g} s")
            if line is None:
                self._queue.put(None)
                self._fail(f"exited ({self.proc.wait()}) before printing {prefix!r}")
            elif line.startswith(prefix):
                return line

    def send(self, line: str = "go") -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def finish(self, timeout: float = WAIT) -> int:
        """Wait for the child to exit; its exit status (all its stdout is in ``lines``)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"did not exit within {timeout:g} s")
        self._reader.join(timeout)
        return code

    def kill(self) -> int:
        """SIGKILL (a no-op if it has exited), and reap it: its locks are free afterwards."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.finish()


Spawn = Callable[..., Child]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(mode, cache, urls, *, expect=None, first=0, verbose=True) -> Child``."""
    children: list[Child] = []

    def make(mode: str, cache: Path, urls: list[str], *, expect: dict[str, str] | None = None,
             first: int = 0, verbose: bool = True) -> Child:
        n = len(children)
        urls_file = tmp_path / f"urls-{n}.json"
        urls_file.write_text(json.dumps(urls))
        argv = [sys.executable, str(CHILD), mode, "--cache", str(cache), "--urls", str(urls_file),
                "--first", str(first)]
        if expect is not None:
            expect_file = tmp_path / f"expect-{n}.json"
            expect_file.write_text(json.dumps(expect))
            argv += ["--expect", str(expect_file)]
        env = child_env({"WDS_VERBOSE_CACHE": "1" if verbose else "0"})
        children.append(Child(argv, env=env, stderr=tmp_path / f"child-{n}.err"))
        return children[-1]

    yield make
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait()
        for stream in (child.proc.stdin, child.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def samples_of(child: Child) -> Counter[Sample]:
    out: Counter[Sample] = Counter()
    for line in child.lines:
        if line.startswith("sample "):
            _, url, key, dig = line.split(" ")
            out[(url, key, dig)] += 1
    return out


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}", pytrace=False)
        time.sleep(0.02)


def published(cache: Path, n: int) -> None:
    """Wait until ``n`` entries are published. A fill thread publishes its entry a moment after
    the reader got the last byte, and a process that exits at once may lose it (a daemon
    thread; reported), so children are let go only after this."""
    wait_until(lambda: len(ls(cache / "data")) >= n, f"{n} entries are published")


def let_go(*children: Child) -> None:
    """Tell children that wait for a last line to exit; each must exit with status 0."""
    for child in children:
        child.send("exit")
    for child in children:
        assert child.finish() == 0, child.stderr()[-3000:]


# -- 1. DataLoader workers, two epochs -------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_four_workers_two_epochs_one_get_per_shard(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    """The issue's case: 4 DataLoader workers x 2 epochs over 16 remote shards with one cache
    directory. nginx's own log shows one GET per shard in all, nothing during epoch 2, and each
    epoch yields every sample exactly once, with its bytes."""
    store = nginx_server.new_store()
    shards = Shards(store, tmp_path, 16, per_shard=6, size=20_000)
    cache = tmp_path / "cache"
    dataset = wds.WebDataset([store.url(k) for k in shards.keys], cache_dir=str(cache),
                             shardshuffle=16, seed=7).map(as_sample)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=4)
    want = shards.samples(store)
    wanted_gets = sorted(("GET", f"/{store.directory}/{k}", 200) for k in shards.keys)

    first = Counter(tuple(s) for s in loader)
    assert first == want  # every sample once, its members byte-exact
    wait_until(lambda: len(shard_gets(nginx_server, store)) >= 16, "nginx logged 16 requests")
    assert sorted(shard_gets(nginx_server, store)) == wanted_gets

    second = Counter(tuple(s) for s in loader)
    assert second == want
    assert sorted(shard_gets(nginx_server, store)) == wanted_gets  # epoch 2 asked for nothing
    assert len(check_entries(cache, shards, store)) == 16
    assert leftovers(cache) == []


# -- 2. separate processes, one download per shard -------------------------------------------


def test_four_processes_share_one_download_per_shard(
    nginx_server: NginxServer, fault_proxy: Callable[..., FaultProxy], spawn: Spawn,
    tmp_path: Path,
) -> None:
    """4 processes released together each read all 16 shards (each in its own order) through
    one cache from a slow server: each shard is fetched once, the others read along, and every
    process gets every sample byte-exact."""
    store = nginx_server.new_store()
    shards = Shards(store, tmp_path, 16, per_shard=8, size=30_000)
    # every response starts 0.2 s late and pauses 0.4 s mid-body: downloads overlap
    proxy = fault_proxy(store, latency=0.2, stall=0.4)
    via = store.proxied(proxy)
    cache = tmp_path / "cache"
    urls = [via.url(k) for k in shards.keys]
    children = [spawn("samples", cache, random.Random(i).sample(urls, len(urls)))
                for i in range(4)]
    for child in children:
        child.expect("ready")  # imported and built its dataset; now waits on stdin
    for child in children:
        child.send()
    want = shards.samples(via)
    for child in children:
        child.expect("done")
        assert samples_of(child) == want
    published(cache, 16)
    let_go(*children)

    reads = proxied_reads(proxy)
    assert sorted(reads) == sorted(("GET", f"/{store.directory}/{k}") for k in shards.keys)
    assert sorted(m for m, _, _ in shard_gets(nginx_server, store)) == ["GET"] * 16
    # the downloads were shared while under way, not only after they were published
    assert sum(child.stderr().count("cache follow ") for child in children) > 0
    assert len(check_entries(cache, shards, via)) == 16
    assert leftovers(cache) == []


# -- 3. SIGKILL at random points -------------------------------------------------------------


def test_sigkill_at_random_points_never_leaves_a_corrupt_entry(
    nginx_server: NginxServer, fault_proxy: Callable[..., FaultProxy], spawn: Spawn,
    tmp_path: Path,
) -> None:
    """24 trials: a child reads 4 shards (in a random order) through the cache from a slow
    server and is SIGKILLed at a random moment, from before its first byte to after everything
    was published. After each kill every entry is byte-identical to its shard and ``verify``
    finds nothing; half the entries are then evicted so the next child downloads again. A
    child never reads a wrong byte (it checks each shard's SHA-256). Afterwards a normal run
    yields every sample, and nothing of the dead processes is left after ``recover``."""
    store = nginx_server.new_store()
    shards = Shards(store, tmp_path, 4, per_shard=4, size=100_000)
    proxy = fault_proxy(store, latency=0.05, stall=0.1)  # each download takes >= 0.15 s
    via = store.proxied(proxy)
    urls, expect = [via.url(k) for k in shards.keys], shards.sha(via)
    cache = tmp_path / "cache"
    rng = random.Random(20240611)
    horizon = 0.0
    progress = []  # how many shards each killed child had read completely
    killed_filling = 0  # kills that left a download behind
    for trial in range(24):
        child = spawn("shards", cache, rng.sample(urls, len(urls)), expect=expect,
                      verbose=False)
        child.expect("ready")
        started = time.monotonic()
        child.send()
        if trial == 1:  # a whole run, killed only once all is published; it sets the horizon
            child.expect("done")
            horizon = time.monotonic() - started
            published(cache, 4)
        elif trial > 1:
            time.sleep(rng.uniform(0.0, horizon))  # the kill point (trial 0: at once)
        child.kill()
        bad = [line for line in child.lines if line.startswith("BAD")]
        assert bad == [], f"trial {trial}: the child read a corrupt shard: {bad}"
        progress.append(sum(line.startswith("ok ") for line in child.lines))
        killed_filling += any(not n.endswith(".json") for n in ls(cache / "partial"))
        present = check_entries(cache, shards, via)
        for name in rng.sample(sorted(present), len(present) // 2):
            ShardCache(cache).evict(name)
    assert progress[0] < 4 and progress[1] == 4  # killed before the end, and after it
    assert killed_filling > 0

    final = spawn("samples", cache, urls, verbose=False)
    final.expect("ready")
    final.send()
    final.expect("done")
    assert samples_of(final) == shards.samples(via)
    published(cache, 4)
    let_go(final)
    assert len(check_entries(cache, shards, via)) == 4
    # a download of a killed child is replaced when its shard is fetched again (a record's
    # temporary file, if a kill landed while it was written, waits for recover())
    assert [p for p in leftovers(cache) if not p.endswith((".json", ".tmp"))] == []
    cacheadmin.recover(ShardCache(cache))
    assert leftovers(cache) == []
    meta = {n.removesuffix(".json") for n in os.listdir(cache / "meta")}
    assert meta == set(os.listdir(cache / "data"))
    assert len(check_entries(cache, shards, via)) == 4


# -- 4. a reader takes over a killed download ------------------------------------------------


def test_a_reader_takes_over_when_the_downloading_process_is_killed(
    nginx_server: NginxServer, fault_proxy: Callable[..., FaultProxy], spawn: Spawn,
    tmp_path: Path,
) -> None:
    """A starts downloading a shard from a server that pauses mid-body; B reads along the
    growing file; A is SIGKILLed; B goes on from where it was (a new request), gets every byte
    right, and the entry is published."""
    store = nginx_server.new_store()
    shards = Shards(store, tmp_path, 1, per_shard=4, size=1_000_000)
    proxy = fault_proxy(store, stall=20.0)  # the body pauses once, between 10 % and 90 %
    via = store.proxied(proxy)
    url, cache = via.url(shards.keys[0]), tmp_path / "cache"
    name = CacheLayout(str(cache)).name_for(url)
    part = cache / "partial" / name

    a = spawn("hold", cache, [url])
    a.expect("got")  # A opened the shard: its download runs in a thread of A
    assert "cache miss " in a.stderr()
    b = spawn("hold", cache, [url], first=65536)
    b.expect("got 65536")  # B read its first bytes from A's growing file
    assert "cache follow " in b.stderr()
    assert part.exists() and not (cache / "data" / name).exists()
    wait_until(lambda: proxy.stats()["faults"].get("stall", 0) == 1, "A's download stalls")

    proxy.configure(stall=0.0)  # B's own request will not pause
    a.kill()
    b.send()
    sha = b.expect("sha").split()[1]
    assert sha == hashlib.sha256(shards.blobs[shards.keys[0]]).hexdigest()
    assert "cache takeover " in b.stderr()
    published(cache, 1)
    let_go(b)
    assert check_entries(cache, shards, via) == {name}
    assert leftovers(cache) == []
    assert proxied_reads(proxy) == [("GET", f"/{store.directory}/{shards.keys[0]}")] * 2


# -- 5. eviction spares entries being read ---------------------------------------------------


def test_an_entry_read_by_another_process_is_not_evicted(
    nginx_server: NginxServer, spawn: Spawn, tmp_path: Path,
) -> None:
    """While another process reads an entry, neither ``evict`` nor ``prune`` removes it; the
    entries nobody reads go. Once the reader is done, it can be evicted."""
    store = nginx_server.new_store()
    shards = Shards(store, tmp_path, 3, per_shard=4, size=100_000)
    cache = tmp_path / "cache"
    urls = [store.url(k) for k in shards.keys]
    for url in urls:
        with wds.gopen(url, cache_dir=str(cache)) as stream:
            stream.read()
    names = [CacheLayout(str(cache)).name_for(u) for u in urls]
    published(cache, 3)
    assert check_entries(cache, shards, store) == set(names)

    reader = spawn("hold", cache, urls[:1], first=65536)
    reader.expect("got 65536")
    assert "cache hit " in reader.stderr()
    sc = ShardCache(cache)
    assert sc.evict(names[0]) == 0
    evicted, _ = cacheadmin.prune(sc, 0)
    assert sorted(evicted) == sorted(names[1:])
    assert os.listdir(cache / "data") == [names[0]]

    reader.send()
    sha = reader.expect("sha").split()[1]
    assert sha == hashlib.sha256(shards.blobs[shards.keys[0]]).hexdigest()
    let_go(reader)
    assert sc.evict(names[0]) > 0
    assert os.listdir(cache / "data") == []
