"""The shard cache across processes, against real servers (nginx, and the fault proxy for a slow
server): DataLoader workers over two epochs, separate processes sharing one download, SIGKILL at
random points, a reader taking over from a killed download, and eviction sparing what is read.

The children are tests/cache/cacheprocs/child.py, driven line by line over stdin/stdout by
tests/cache/cacheprocs/driver.py; every child is killed when its test ends (and gets SIGKILL if the
test process dies)."""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cacheprocs.child import members_digest
from cacheprocs.driver import WAIT, Child, Children, Spawn, let_go, release
from cachetools import cache_files, wait_for
from shardgen import write_tar
from stores import FaultProxy, HttpStore, NginxServer

import wds_cloud as wds
from wds_cloud.cache import ShardCache
from wds_cloud.cache import admin as cacheadmin
from wds_cloud.cache.layout import CacheLayout

Sample = tuple[str, str, str]  # (url, key, digest of its members)


# -- shards ----------------------------------------------------------------------------------


def as_sample(sample: dict[str, Any]) -> Sample:
    return sample["__url__"], sample["__key__"], members_digest(sample)


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
                out[(base.url(key), name, members_digest(dict(members)))] += 1
        return out

    def sha(self, base: HttpStore) -> dict[str, str]:
        return {base.url(k): hashlib.sha256(b).hexdigest() for k, b in self.blobs.items()}


def shard_gets(nginx: NginxServer, store: HttpStore) -> list[tuple[str, str, int]]:
    """(method, uri, status) of every request nginx logged under ``store``'s directory."""
    prefix = f"/{store.directory}/"
    return [(e.method, e.uri, e.status) for e in nginx.access_log() if e.uri.startswith(prefix)]


def proxied_reads(proxy: FaultProxy) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in proxy.requests() if r.path.endswith(".tar")]


def check_entries(root: Path, shards: Shards, base: HttpStore) -> set[str]:
    """Every file in ``data/`` is the entry of one of the shards and holds exactly its bytes;
    ``verify`` finds nothing wrong. Returns the names present."""
    layout = CacheLayout(str(root))
    names = {layout.name_for(base.url(k)): k for k in shards.keys}
    present = set(cache_files(root))
    for name in present:
        assert name in names, f"data/{name} is no entry of this dataset"
        assert (root / "data" / name).read_bytes() == shards.blobs[names[name]], (
            f"data/{name} differs from {names[name]}")
    _, problems = cacheadmin.verify(ShardCache(root), remove=False)
    assert problems == []
    return present


def leftovers(root: Path) -> list[str]:
    """Downloads in progress (or stale ones) and temporary files anywhere in the cache."""
    found = [f"partial/{n}" for n in cache_files(root, "partial")]
    for sub in ("data", "meta", "locks"):
        found += [f"{sub}/{n}" for n in cache_files(root, sub) if n.endswith(".tmp")]
    return sorted(found)


# -- children --------------------------------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(mode, cache, urls, *, expect=None, first=0, verbose=True) -> Child``."""
    with Children(tmp_path) as children:
        yield children.spawn


def samples_of(child: Child) -> Counter[Sample]:
    out: Counter[Sample] = Counter()
    for line in child.lines:
        if line.startswith("sample "):
            _, url, key, dig = line.split(" ")
            out[(url, key, dig)] += 1
    return out


def published(cache: Path, n: int) -> None:
    """Wait until ``n`` entries are published. A fill thread publishes its entry a moment after
    the reader got the last byte, and a process that exits at once may lose it (a daemon
    thread; reported), so children are let go only after this."""
    wait_for(lambda: len(cache_files(cache)) >= n, f"{n} entries are published",
             timeout=WAIT)


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
    wait_for(lambda: len(shard_gets(nginx_server, store)) >= 16, "nginx logged 16 requests",
             timeout=WAIT)
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
    release(*children)
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


@pytest.mark.slow
def test_sigkill_at_random_points_never_leaves_a_corrupt_entry(
    nginx_server: NginxServer, fault_proxy: Callable[..., FaultProxy], spawn: Spawn,
    tmp_path: Path,
) -> None:
    """14 trials: a child reads 4 shards (in a random order) through the cache from a slow
    server and is SIGKILLed at a random moment, from before its first byte to after everything
    was published (and once while a download is seen under way). After each kill every entry
    is byte-identical to its shard and ``verify`` finds nothing; half the entries are then
    evicted so the next child downloads again. A child never reads a wrong byte (it checks
    each shard's SHA-256). Afterwards a normal run yields every sample, and nothing of the
    dead processes is left after ``recover``."""
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
    for trial in range(14):
        child = spawn("shards", cache, rng.sample(urls, len(urls)), expect=expect,
                      verbose=False)
        child.expect("ready")
        started = time.monotonic()
        child.send()
        if trial == 1:  # a whole run, killed only once all is published; it sets the horizon
            child.expect("done")
            horizon = time.monotonic() - started
            published(cache, 4)
        elif trial == 2:  # killed while a download is surely under way (whatever the load)
            deadline = time.monotonic() + 60
            while not any(not n.endswith(".json") for n in cache_files(cache, "partial")):
                assert time.monotonic() < deadline, "no download ever under way"
                time.sleep(0.005)
        elif trial > 2:
            time.sleep(rng.uniform(0.0, horizon))  # the kill point (trial 0: at once)
        child.kill()
        bad = [line for line in child.lines if line.startswith("BAD")]
        assert bad == [], f"trial {trial}: the child read a corrupt shard: {bad}"
        progress.append(sum(line.startswith("ok ") for line in child.lines))
        killed_filling += any(not n.endswith(".json") for n in cache_files(cache, "partial"))
        present = check_entries(cache, shards, via)
        for name in rng.sample(sorted(present), len(present) // 2):
            ShardCache(cache).evict(name)
    assert progress[0] < 4 and progress[1] == 4  # killed before the end, and after it
    assert killed_filling > 0

    final = spawn("samples", cache, urls, verbose=False)
    release(final)
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
    wait_for(lambda: proxy.stats()["faults"].get("stall", 0) == 1, "A's download stalls",
             timeout=WAIT)

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
