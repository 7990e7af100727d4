"""The on-disk shard cache in one process, against real servers (nginx, rclone s3, the fault
proxy): hits and misses counted by the server itself, names, streaming while filling, failed
fills, revalidation, verify, the size bound, shards in use, local paths, settings, pickling."""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cachetools import (
    DiskSampler,
    cache_files,
    make_shard,
    sample_digest,
    settled,
    settled_log,
    shard_gets,
)
from stores.base import Store
from stores.nginx import HttpStore, NginxServer

import wds_cloud as wds
from wds_cloud.cache import ShardCache
from wds_cloud.cache import admin as cacheadmin
from wds_cloud.cache.layout import CacheLayout, footprint
from wds_cloud.errors import CacheError, TransferError
from wds_cloud.settings import Settings

StoreFactory = Callable[[str], Store]
ProxyFactory = Callable[..., Any]
KiB = 2**10


def _seed(store: Store, count: int, *, samples: int = 4, size: int = 16 * KiB,
          prefix: str = "shard") -> tuple[list[str], list[str], int]:
    """``count`` shards named ``{prefix}-NN.tar``: their keys, every sample key in order, and
    the size of one shard."""
    keys, expected, nbytes = [], [], 0
    for k in range(count):
        data, names = make_shard(f"{prefix}{k:02d}", samples, size)
        keys.append(f"{prefix}-{k:02d}.tar")
        store.put(keys[-1], data)
        expected += names
        nbytes = len(data)
    return keys, expected, nbytes


def _read(urls: list[str], **kw: Any) -> list[dict[str, Any]]:
    samples = list(wds.WebDataset(urls, shardshuffle=False, **kw))
    assert all(ok for _, ok in map(sample_digest, samples))
    return samples


def _keys(samples: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in samples]


def _path(store: HttpStore, key: str) -> str:
    return f"/{store.directory}/{key}"


def _bytes(store: HttpStore, key: str) -> bytes:
    """The object as nginx serves it, read from its root (a GET would show in the log)."""
    return (store.server.root / store.directory / key).read_bytes()


# -- 1, 2: hits, misses, buckets -------------------------------------------------------------

def test_a_miss_makes_one_get_and_a_hit_none(nginx_server: NginxServer, tmp_path: Path) -> None:
    store = nginx_server.new_store()
    keys, expected, _ = _seed(store, 3)
    urls = [store.url(k) for k in keys]
    cache = tmp_path / "cache"

    first = _read(urls, cache_dir=str(cache))
    log = settled_log(nginx_server)
    assert _keys(first) == expected
    assert [shard_gets(log, _path(store, k)) for k in keys] == [1, 1, 1]
    assert len(settled(cache)) == 3

    second = _read(urls, cache_dir=str(cache))
    assert _keys(second) == expected
    log = settled_log(nginx_server)
    assert [shard_gets(log, _path(store, k)) for k in keys] == [1, 1, 1]  # no request at all
    local = {s["__local_path__"] for s in second}
    assert local == {str(cache / "data" / name) for name in cache_files(cache)}
    for key in keys:  # the entries hold the original bytes
        name = CacheLayout(str(cache)).name_for(store.url(key))
        assert (cache / "data" / name).read_bytes() == _bytes(store, key)


def test_a_cache_directory_removed_between_two_runs_is_made_again(
        nginx_server: NginxServer, tmp_path: Path) -> None:
    """A user deletes the cache (or a part of it) between two runs in one process: the next
    run reads the store again and fills the directory anew, as on a first run. Without
    ``locks/`` the entries are still hits; without ``locks/`` and ``meta/`` they are not
    (no record), and are dropped and downloaded again."""
    store = nginx_server.new_store()
    keys, expected, _ = _seed(store, 2)
    urls = [store.url(k) for k in keys]
    cache = tmp_path / "cache"
    assert _keys(_read(urls, cache_dir=str(cache))) == expected
    assert len(settled(cache)) == 2
    gets = 1
    for removed, fetched in (((cache,), True), ((cache / "locks",), False),
                             ((cache / "data",), True), ((cache / "locks", cache / "meta"), True)):
        for directory in removed:
            shutil.rmtree(directory)
        assert _keys(_read(urls, cache_dir=str(cache))) == expected
        assert len(settled(cache)) == 2
        gets += fetched  # without "locks" the entries are still there: hits
        log = settled_log(nginx_server)
        assert [shard_gets(log, _path(store, k)) for k in keys] == [gets, gets], removed


def test_a_lock_the_cache_cannot_make_is_a_cache_error_naming_it(
        nginx_server: NginxServer, tmp_path: Path) -> None:
    """Not a missing shard: the error names the file in the cache that could not be made."""
    store = nginx_server.new_store()
    keys, _, _ = _seed(store, 1)
    cache = tmp_path / "cache"
    layout = CacheLayout(str(cache))
    layout.ensure()
    lock = Path(layout.lock_path(layout.name_for(store.url(keys[0]))))
    lock.mkdir()  # a directory where the lock file goes
    with pytest.raises(CacheError, match=re.escape(str(lock))):
        _read([store.url(keys[0])], cache_dir=str(cache))


def test_same_named_shards_of_two_buckets(
    store_factory: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    one, two = store_factory("s3"), store_factory("s3")
    one.apply_env(monkeypatch)
    expected_one: list[str] = []
    expected_two: list[str] = []
    for k in range(2):  # identical names, different content
        data, names_one = make_shard(f"a{k:02d}", 4, 16 * KiB)
        one.put(f"shard-{k:02d}.tar", data)
        data, names_two = make_shard(f"b{k:02d}", 4, 16 * KiB)
        two.put(f"shard-{k:02d}.tar", data)
        expected_one += names_one
        expected_two += names_two
    cache = tmp_path / "cache"
    names = [f"shard-{k:02d}.tar" for k in range(2)]
    for _ in range(2):  # filling, then from the cache
        for store, expected in ((one, expected_one), (two, expected_two)):
            got = _read([store.url(n) for n in names], cache_dir=str(cache),
                        storage_options=store.storage_options)
            assert _keys(got) == expected
    entries = settled(cache)
    assert len(entries) == 4
    assert sorted(re.sub(r"\.[0-9a-f]{16}\.", ".", e) for e in entries) == sorted(names * 2)


# -- 3: names ------------------------------------------------------------------------------

WEIRD = [
    "http://h/d/../../../../etc/passwd",
    "http://h/d/..",
    "http://h/d/shard.tar/..",
    "http://h/d/%2E%2E%2F%2E%2E%2Fescape.tar",
    "http://h/d/a%2F..%2F..%2Fb.tar",
    "s3://bucket/" + "x" * 400 + ".tar",
    "s3://bucket/shard." + "e" * 300,
    "http://h/d/shard.tar?sig=abc/../../x&y=/etc",
    "gs://b/\u00e9t\u00e9/\u5f71\u50cf-0001.tar",
    "http://h/d/\x00nul.tar",
    "/abs/local/../path/shard.tar",
    "..",
    "/",
    "",
]


@pytest.mark.parametrize("url", WEIRD)
def test_no_url_names_a_file_outside_the_cache(url: str, tmp_path: Path) -> None:
    layout = CacheLayout(str(tmp_path / "cache"))
    for to_name in (None, lambda u: "../../../outside", lambda u: "/etc/passwd", lambda u: ".."):
        name = layout.name_for(url, to_name)
        assert "/" not in name and "\x00" not in name and name not in (".", "..")
        assert len(name.encode()) <= 255
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name)
        for path in (layout.data(name), layout.meta(name), layout.part(name),
                     layout.lock_path(name)):
            assert os.path.dirname(os.path.normpath(path)) in {
                os.path.join(layout.root, sub) for sub in ("data", "meta", "partial", "locks")}


def test_names_are_readable_and_keyed_by_the_whole_url(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    store = nginx_server.new_store()
    data, expected = make_shard("q", 3, 4 * KiB)
    store.put("shard-000007.tar", data)
    store.put("sub/\u00e9t\u00e9 0001.tar", data)
    cache, outside = tmp_path / "deep" / "cache", tmp_path
    before = {p for p in outside.rglob("*")}
    urls = [store.url("shard-000007.tar"), store.url("shard-000007.tar?v=1"),
            store.url("shard-000007.tar?v=2"), store.url("sub/../shard-000007.tar"),
            store.url("sub%2F..%2Fshard-000007.tar"), store.url("sub/\u00e9t\u00e9 0001.tar")]
    for url in urls:
        assert _keys(_read([url], cache_dir=str(cache))) == expected
    entries = settled(cache)
    assert len(entries) == len(urls)  # the query and every spelling make their own entry
    assert sum(e.startswith("shard-000007.") and e.endswith(".tar") for e in entries) == 4
    assert any("0001" in e for e in entries)
    created = {p for p in outside.rglob("*")} - before
    assert all(cache in p.parents or p == cache or p in cache.parents for p in created)


# -- 4, 5: streaming while filling, failed fills ----------------------------------------------

def test_samples_stream_before_the_entry_is_published(
    nginx_server: NginxServer, fault_proxy: ProxyFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The proxy pauses the body for 3 s somewhere after its first 10 %: the first sample
    arrives while the download sits in partial/ and data/ is empty."""
    store = nginx_server.new_store()
    data, expected = make_shard("slow", 64, 64 * KiB)  # 4 MiB: the pause is past 400 KiB
    store.put("slow.tar", data)
    proxy = fault_proxy(store, stall=3.0, stall_rate=1.0, only_paths="slow")
    via = store.proxied(proxy)
    monkeypatch.setenv("WDS_READAHEAD", "0")  # no pre-read: the reader asks for what it needs
    cache = tmp_path / "cache"
    it = iter(wds.WebDataset([via.url("slow.tar")], shardshuffle=False, cache_dir=str(cache)))
    first = next(it)
    assert first["__key__"] == expected[0] and sample_digest(first)[1]
    assert cache_files(cache) == []  # not published
    partial = [n for n in cache_files(cache, "partial") if not n.endswith(".json")]
    assert len(partial) == 1
    assert (cache / "partial" / partial[0]).stat().st_size < len(data)
    rest = list(it)
    assert [first["__key__"], *_keys(rest)] == expected
    assert all(sample_digest(s)[1] for s in rest)
    assert settled(cache) == partial
    assert (cache / "data" / partial[0]).read_bytes() == data
    assert proxy.stats()["faults"].get("stall") == 1
    assert [r.method for r in proxy.requests()] == ["GET"]


def test_a_truncated_fill_never_publishes(
    nginx_server: NginxServer, fault_proxy: ProxyFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = nginx_server.new_store()
    keys, _, _ = _seed(store, 1, samples=16, size=64 * KiB)
    proxy = fault_proxy(store, truncate=1.0)
    via = store.proxied(proxy)
    monkeypatch.setenv("WDS_RETRIES", "0")  # the short body is not resumed
    cache = tmp_path / "cache"
    with pytest.raises(TransferError):
        list(wds.WebDataset([via.url(keys[0])], shardshuffle=False, cache_dir=str(cache)))
    assert proxy.stats()["faults"].get("truncate") == 1
    assert settled(cache) == [] and cache_files(cache, "meta") == []
    # the same through gopen: the error reaches the reader, nothing is published
    with pytest.raises(TransferError), wds.gopen(via.url(keys[0]), cache_dir=str(cache)) as f:
        f.read()
    assert settled(cache) == []
    # once the store answers in full, the entry is filled
    proxy.configure(truncate=0.0)
    with wds.gopen(via.url(keys[0]), cache_dir=str(cache)) as f:
        assert f.read() == _bytes(store, keys[0])
    assert len(settled(cache)) == 1


# -- 6, 7: revalidation and verification ------------------------------------------------------

def _replace(store: HttpStore, key: str, data: bytes, mtime: int) -> None:
    """New content for ``key``; nginx's ETag (mtime and size) changes with it."""
    store.put(key, data)
    path = store.server.root / store.directory / key
    os.utime(path, (mtime, mtime))


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_revalidation_fetches_a_changed_object(
    how: str, nginx_server: NginxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = nginx_server.new_store()
    old, old_keys = make_shard("old", 3, 4 * KiB)
    new, new_keys = make_shard("new", 5, 4 * KiB)
    _replace(store, "s.tar", old, 1_600_000_000)
    url, cache = store.url("s.tar"), tmp_path / "cache"
    assert _keys(_read([url], cache_dir=str(cache))) == old_keys
    assert len(settled(cache)) == 1
    _replace(store, "s.tar", new, 1_700_000_000)
    # without revalidation the cached bytes are served as they are: no request is made
    assert _keys(_read([url], cache_dir=str(cache))) == old_keys
    assert shard_gets(settled_log(nginx_server), _path(store, "s.tar")) == 1
    if how == "argument":
        kw: dict[str, Any] = {"cache_revalidate": True}
    else:
        monkeypatch.setenv("WDS_CACHE_REVALIDATE", "1")
        kw = {}
    assert _keys(_read([url], cache_dir=str(cache), **kw)) == new_keys
    assert shard_gets(settled_log(nginx_server), _path(store, "s.tar")) == 2
    [entry] = settled(cache)
    assert (cache / "data" / entry).read_bytes() == new
    assert cacheadmin.entries(ShardCache(cache))[0].size == len(new)
    # an unchanged object is served from the cache (the request to ask is closed unread)
    assert _keys(_read([url], cache_dir=str(cache), **kw)) == new_keys
    assert (cache / "data" / entry).read_bytes() == new


def test_verify_finds_flipped_and_truncated_entries(
    nginx_server: NginxServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    store = nginx_server.new_store()
    keys, expected, _ = _seed(store, 3)
    urls, cache = [store.url(k) for k in keys], tmp_path / "cache"
    _read(urls, cache_dir=str(cache))
    assert len(settled(cache)) == 3
    layout = CacheLayout(str(cache))
    flipped, cut, good = (cache / "data" / layout.name_for(u) for u in urls)
    raw = bytearray(flipped.read_bytes())
    raw[700] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    os.truncate(cut, cut.stat().st_size - 512)
    checked, problems = cacheadmin.verify(ShardCache(cache), remove=False)
    assert checked == 3
    assert {p.name: ("CRC" in p.why, "recorded" in p.why) for p in problems} == {
        flipped.name: (True, True), cut.name: (False, True)}
    assert flipped.exists() and cut.exists()
    # a hit on the truncated entry sees its size is wrong and fetches it again
    caplog.set_level(logging.WARNING, logger="wds_cloud.cache")
    with wds.gopen(urls[1], cache_dir=str(cache)) as f:
        assert f.read() == _bytes(store, keys[1])
    assert "invalid" in caplog.text and cut.name in caplog.text
    assert shard_gets(settled_log(nginx_server), _path(store, keys[1])) == 2
    assert cut.name in settled(cache) and cut.read_bytes() == _bytes(store, keys[1])
    checked, problems = cacheadmin.verify(ShardCache(cache))
    assert checked == 3 and [(p.name, p.removed) for p in problems] == [(flipped.name, True)]
    assert sorted(cache_files(cache)) == sorted([cut.name, good.name])
    assert cacheadmin.verify(ShardCache(cache)) == (2, [])
    (cache / "meta" / f"{good.name}.json").unlink()  # an entry without its record
    checked, problems = cacheadmin.verify(ShardCache(cache))
    assert [(p.name, p.why) for p in problems] == [(good.name, "no readable record")]
    assert _keys(_read(urls, cache_dir=str(cache))) == expected


# -- 8, 9, 10: the bound ---------------------------------------------------------------------

def test_disk_use_stays_under_the_bound(
    nginx_server: NginxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = nginx_server.new_store()
    keys, expected, size = _seed(store, 16, samples=16, size=64 * KiB)
    limit = int(0.3 * 16 * size)
    monkeypatch.setenv("WDS_VERBOSE_CACHE", "1")
    monkeypatch.setenv("WDS_READAHEAD", "2")  # fewer shards in use at once: room to evict
    caplog.set_level(logging.INFO, logger="wds_cloud.cache")
    cache = tmp_path / "cache"
    with DiskSampler(cache) as sampler:
        got = _read([store.url(k) for k in keys], cache_dir=str(cache), cache_size=limit)
    assert _keys(got) == expected
    assert sampler.samples >= 10
    assert limit // 2 < sampler.peak <= limit, sampler.peak_files  # up to the bound, no more
    assert sampler.total() <= limit
    evictions = [r for r in caplog.records if r.getMessage().startswith("cache evict")]
    assert len(evictions) >= 4
    assert 0 < len(settled(cache)) < 16


def test_a_shard_larger_than_the_cache_is_streamed(
    nginx_server: NginxServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    store = nginx_server.new_store()
    keys, expected, size = _seed(store, 2, samples=8, size=32 * KiB)
    cache = tmp_path / "cache"
    caplog.set_level(logging.WARNING, logger="wds_cloud.cache")
    got = _read([store.url(k) for k in keys], cache_dir=str(cache), cache_size=size // 2)
    assert _keys(got) == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all("larger than the whole cache" in w for w in warnings)  # once per shard
    assert sorted(w.split(" (", 1)[0] for w in warnings) == [store.url(k) for k in keys]
    assert settled(cache) == []


def test_a_shard_being_read_is_never_evicted(
    nginx_server: NginxServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    store = nginx_server.new_store()
    keys, _, size = _seed(store, 6, samples=4, size=64 * KiB)
    urls, cache = [store.url(k) for k in keys], tmp_path / "cache"
    limit = 2 * footprint(size) + footprint(size) // 2  # room for two entries
    caplog.set_level(logging.DEBUG, logger="wds_cloud.cache")
    with wds.gopen(urls[0], cache_dir=str(cache), cache_size=limit) as f:
        f.read()
    assert len(settled(cache)) == 1
    held_name = CacheLayout(str(cache)).name_for(urls[0])
    held = wds.gopen(urls[0], cache_dir=str(cache), cache_size=limit)  # a hit, kept open
    try:
        assert held.read(1000) == _bytes(store, keys[0])[:1000]
        for i, (url, key) in enumerate(zip(urls[1:], keys[1:], strict=True)):
            if i:  # the held entry is the least recently used: the first to go, were it free
                assert cacheadmin.entries(ShardCache(cache))[0].name == held_name
            with wds.gopen(url, cache_dir=str(cache), cache_size=limit) as f:
                assert f.read() == _bytes(store, key)
            assert held_name in settled(cache)
        assert held.read() == _bytes(store, keys[0])[1000:]
    finally:
        held.close()
    evicted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cache evict")]
    assert len(evicted) == 4 and not any(held_name in m for m in evicted)
    assert held_name in cache_files(cache) and len(cache_files(cache)) <= 2


# -- 11, 12, 13: local paths, settings, pickling ------------------------------------------------

def test_local_paths_are_cached_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "nas"
    src.mkdir()
    urls, expected = [], []
    for k in range(2):
        data, names = make_shard(f"l{k}", 3, 4 * KiB)
        (src / f"l-{k}.tar").write_bytes(data)
        urls.append(str(src / f"l-{k}.tar"))
        expected += names
    off, on, env = tmp_path / "off", tmp_path / "on", tmp_path / "env"
    assert _keys(_read(urls, cache_dir=str(off))) == expected
    assert settled(off) == []
    with wds.gopen(urls[0], cache_dir=str(off)) as f:
        assert f.read() == (src / "l-0.tar").read_bytes()
    assert cache_files(off) == []
    for _ in range(2):
        got = _read(urls, cache_dir=str(on), cache_local=True)
        assert _keys(got) == expected
        assert len(settled(on)) == 2
    assert {s["__local_path__"] for s in got} == {str(on / "data" / n) for n in cache_files(on)}
    monkeypatch.setenv("WDS_CACHE_LOCAL", "1")
    assert _keys(_read(urls, cache_dir=str(env))) == expected
    assert len(settled(env)) == 2
    # never a file inside the cache itself
    inner = str(env / "data" / cache_files(env)[0])
    assert not ShardCache(env, cache_local=True).wants(inner)


def test_sizes_from_the_environment() -> None:
    def size(text: str) -> int | None:
        return Settings.from_env({"WDS_CACHE_SIZE": text}).cache_size

    assert size("1e9") == 10**9
    assert size("50GB") == 50 * 10**9
    assert size("500MiB") == 500 * 2**20
    assert size("0") == 0
    assert ShardCache.from_settings(Settings(cache_dir="/x", cache_size=0)) is None


def test_environment_and_arguments(
    nginx_server: NginxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = nginx_server.new_store()
    keys, expected, size = _seed(store, 2)
    urls = [store.url(k) for k in keys]
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WDS_CACHE", "~/wds-cache")  # turns caching on; ~ expanded
    env_cache = home / "wds-cache"
    assert Settings.from_env().cache_dir == str(env_cache)
    assert _keys(_read(urls)) == expected
    assert len(settled(env_cache)) == 2
    with wds.gopen(store.url(keys[0])) as f:  # gopen too: a hit
        assert f.read() == _bytes(store, keys[0])
        assert getattr(f, "local_path", "").startswith(str(env_cache / "data"))
    # explicit arguments win: another directory ($VARS expanded), another size
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("WDS_CACHE_SIZE", "1KB")  # too small for any shard
    assert _keys(_read(urls, cache_dir="$SCRATCH/c")) == expected
    assert settled(tmp_path / "scratch" / "c") == []
    assert _keys(_read(urls, cache_dir="$SCRATCH/c", cache_size="10MB")) == expected
    assert len(settled(tmp_path / "scratch" / "c")) == 2
    with wds.gopen(urls[0], cache_dir="$SCRATCH/g", cache_size=10 * size) as f:
        assert f.read() == _bytes(store, keys[0])
    assert len(settled(tmp_path / "scratch" / "g")) == 1
    # cache_size=0 turns the cache off whatever WDS_CACHE says
    monkeypatch.setenv("WDS_CACHE", str(tmp_path / "zero"))
    monkeypatch.delenv("WDS_CACHE_SIZE")
    assert _keys(_read(urls, cache_size=0)) == expected
    with wds.gopen(urls[0], cache_size=0) as f:
        assert f.read() == _bytes(store, keys[0])
    assert not (tmp_path / "zero").exists()
    monkeypatch.setenv("WDS_CACHE_SIZE", "0")
    assert _keys(_read(urls)) == expected
    assert not (tmp_path / "zero").exists()


def test_verbose_cache_logs_each_event_once(
    nginx_server: NginxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = nginx_server.new_store()
    keys, _, size = _seed(store, 3, size=64 * KiB)
    urls = [store.url(k) for k in keys]
    monkeypatch.setenv("WDS_VERBOSE_CACHE", "1")
    monkeypatch.setenv("WDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WDS_CACHE_SIZE", str(2 * footprint(size) + footprint(size) // 2))
    caplog.set_level(logging.INFO, logger="wds_cloud.cache")
    for url in [*urls, urls[2]]:  # three misses (the third evicts the first), then a hit
        with wds.gopen(url) as f:
            f.read()
        assert CacheLayout(str(tmp_path / "cache")).name_for(url) in settled(tmp_path / "cache")
    events = [r.getMessage().split()[1] for r in caplog.records
              if r.name == "wds_cloud.cache" and r.levelno == logging.INFO]
    assert sorted(events) == sorted(["miss", "fill"] * 3 + ["evict", "hit"])
    hit = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("cache hit"))
    assert urls[2] in hit


def test_a_cached_dataset_pickles_and_feeds_workers(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    store = nginx_server.new_store()
    keys, expected, _ = _seed(store, 4, size=4 * KiB)
    urls, cache = [store.url(k) for k in keys], tmp_path / "cache"
    dataset = wds.WebDataset(urls, shardshuffle=False, cache_dir=str(cache), cache_size="1MB")
    again = pickle.loads(pickle.dumps(dataset))
    assert _keys(list(again)) == expected
    assert len(settled(cache)) == 4
    other = tmp_path / "workers"
    for _ in range(2):  # filling a second cache from two workers, then reading it warm
        loader = torch.utils.data.DataLoader(
            wds.WebDataset(urls, shardshuffle=False, cache_dir=str(other))
            .to_tuple("__key__", "txt"),
            batch_size=None, num_workers=2, multiprocessing_context="fork")
        got = [(key, txt.decode()) for key, txt in loader]
        assert sorted(got) == sorted((k, k) for k in expected)
        assert len(settled(other)) == 4
    log = settled_log(nginx_server)
    assert [shard_gets(log, _path(store, k)) for k in keys] == [2, 2, 2, 2]  # one per cache
