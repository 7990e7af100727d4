"""webdataset's ``webdataset.cache`` names on our shard cache (wds_cloud/cache/webdataset.py),
compared with webdataset 1.0.2 where it has the behaviour: ``url_to_cache_name`` and
``pipe_cleaner`` results, ``check_tar_format``, signatures, ``FileCache`` and
``StreamingOpen`` over nginx and local files, ``cached_tarfile_to_samples`` against
webdataset's cached and streaming pipelines (over nginx and ``pipe:cat``). What is ours: names
that do not collide across buckets, one request per shard (counted in nginx's log), the size
bound, ``LRUCleanup`` keeping shards in use."""

from __future__ import annotations

import inspect
import io
import os
import pickle
import tarfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import webdataset
import webdataset.cache as wdscache
from cachetools import cache_files, make_shard, sample_digest, settled, settled_log, shard_gets
from stores.nginx import HttpStore, NginxServer

import wds_cloud as wds
from wds_cloud.cache import (
    FileCache,
    LRUCleanup,
    ShardCache,
    StreamingOpen,
    cached_tarfile_samples,
    cached_tarfile_to_samples,
    cached_url_opener,
    check_tar_format,
    pipe_cleaner,
    url_to_cache_name,
)
from wds_cloud.cache.layout import footprint
from wds_cloud.errors import CacheError, ShardFormatError, ShardNotFoundError

KiB = 2**10


def _seed(store: HttpStore, prefix: str, count: int = 2, *, size: int = 8 * KiB,
          stem: str = "shard") -> tuple[list[str], list[str]]:
    """``count`` shards ``{stem}-NN.tar`` in ``store``: their URLs and every sample key."""
    urls, keys = [], []
    for k in range(count):
        data, names = make_shard(f"{prefix}{k:02d}", 3, size)
        store.put(f"{stem}-{k:02d}.tar", data)
        urls.append(store.url(f"{stem}-{k:02d}.tar"))
        keys += names
    return urls, keys


def _gets(server: NginxServer, store: HttpStore, urls: list[str]) -> list[int]:
    log = settled_log(server)
    return [shard_gets(log, f"/{store.directory}/{u.rsplit('/', 1)[1]}") for u in urls]


def _content(samples: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Samples as (key, url, members) without ``__local_path__`` (each cache has its own)."""
    return [(s["__key__"], s["__url__"], sorted((k, v) for k, v in s.items()
                                                 if not k.startswith("__")))
            for s in samples]


# -- names, results and signatures as webdataset's ----------------------------------------------

URLS = ["http://h/a/b/shard-000001.tar", "https://h/x.tar?sig=1", "s3://bucket/dir/s.tar",
        "gs://b/d/e/f.tar.gz", "ais://b/o.tar", "file:///abs/dir/s.tar", "rel/dir/s.tar", "s.tar",
        "/abs/s.tar", "ftp://h/p/q.tar", "az://c/d/s.tar", "pipe:curl -s http://h/a.tar",
        "hdfs://nn/p/s.tar", "weird://h/a b/c{1..2}.tar", "http://h/", ""]


@pytest.mark.parametrize("url", URLS)
def test_url_to_cache_name_is_webdatasets(url: str) -> None:
    for ndir in (0, 1, 2):
        assert url_to_cache_name(url, ndir) == wdscache.url_to_cache_name(url, ndir)
    assert url_to_cache_name(url) == wdscache.url_to_cache_name(url)


SPECS = ["pipe:curl -s http://h/a/shard-0.tar", "pipe:curl -s -L https://h/b.tar?x=1",
         "pipe:gsutil cat gs://b/c.tar", "pipe:aws s3 cp s3://b/d.tar -",
         "pipe:ais get ais://b/o.tar -", "pipe:hdfs dfs -cat hdfs://nn/p.tar",
         "pipe:cat /data/x.tar", "pipe:curl -s ftp://h/x.tar", "http://h/plain.tar", "s.tar",
         "pipe:"]


def test_pipe_cleaner_is_webdatasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")  # webdataset 1.0.2 refuses to run it otherwise
    for spec in SPECS:
        assert pipe_cleaner(spec) == wdscache.pipe_cleaner(spec), spec
    assert pipe_cleaner("pipe:curl -s http://h/a.tar") == "http://h/a.tar"


def test_check_tar_format_is_webdatasets(tmp_path: Path) -> None:
    data, _ = make_shard("t", 2, 1 * KiB)
    files = {"shard.tar": data, "shard.tar.gz": _gzip(data), "text": b"hello " * 200,
             "short": b"\x1f", "empty": b"", "v7.tar": _v7_tar()}
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
        path = str(tmp_path / name)
        assert check_tar_format(path) == wdscache.check_tar_format(path), name


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


def _v7_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def _params(f: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter; callables as their names."""
    return [(p.name, p.kind, getattr(p.default, "__name__", p.default))
            for p in inspect.signature(f).parameters.values()]


def test_signatures_are_webdatasets() -> None:
    for ours, theirs in ((FileCache, wdscache.FileCache), (StreamingOpen, wdscache.StreamingOpen),
                         (LRUCleanup, wdscache.LRUCleanup),
                         (url_to_cache_name, wdscache.url_to_cache_name),
                         (pipe_cleaner, wdscache.pipe_cleaner),
                         (check_tar_format, wdscache.check_tar_format),
                         (FileCache.get_file, wdscache.FileCache.get_file),
                         (FileCache.__call__, wdscache.FileCache.__call__),
                         (LRUCleanup.cleanup, wdscache.LRUCleanup.cleanup),
                         (LRUCleanup.set_cache_dir, wdscache.LRUCleanup.set_cache_dir)):
        assert _params(ours) == _params(theirs), ours
    # 1.0.2 dropped these; their arguments are those of the last webdataset that had them (0.2)
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [(n, k) for n, k, _ in _params(cached_url_opener)] == [
        (n, positional) for n in ("data", "handler", "cache_size", "cache_dir", "url_to_name",
                                  "validator", "verbose", "always")]
    assert [(n, d) for n, _, d in _params(cached_tarfile_samples)] == [
        ("src", "_empty"), ("handler", "reraise_exception"), ("cache_size", -1),
        ("cache_dir", None), ("verbose", False), ("url_to_name", "pipe_cleaner"),
        ("always", False), ("select_files", None), ("rename_files", None)]


def test_the_names_at_webdatasets_places() -> None:
    import wds_cloud.cache as cache

    assert wds.cache is cache
    assert wds.LRUCleanup is cache.LRUCleanup is LRUCleanup
    assert wds.pipe_cleaner is cache.pipe_cleaner is pipe_cleaner
    for name in ("FileCache", "StreamingOpen", "LRUCleanup", "url_to_cache_name", "pipe_cleaner",
                 "cached_url_opener", "cached_tarfile_samples", "cached_tarfile_to_samples"):
        assert name in cache.__all__ and callable(getattr(cache, name))
    assert webdataset.LRUCleanup is wdscache.LRUCleanup  # top-level in webdataset too
    assert webdataset.pipe_cleaner is wdscache.pipe_cleaner


# -- FileCache ---------------------------------------------------------------------------------

def test_file_cache_yields_webdatasets_samples_with_one_request_per_shard(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    store = nginx_server.new_store()
    urls, keys = _seed(store, "fc", 3)
    (tmp_path / "w").mkdir()  # webdataset wants it made
    theirs = list(webdataset.WebDataset(urls, shardshuffle=False, cache_dir=str(tmp_path / "w")))
    assert [s["__key__"] for s in theirs] == keys
    ours_cache = tmp_path / "ours"
    for epoch in range(2):
        ours = list(wds.DataPipeline(
            wds.SimpleShardList(urls), FileCache(str(ours_cache)),
            wds.tariterators.tar_file_expander, wds.tariterators.group_by_keys))
        assert _content(ours) == _content(theirs), epoch
        assert all(ok for _, ok in map(sample_digest, ours))
        assert {s["__local_path__"] for s in ours} == {
            str(ours_cache / "data" / n) for n in settled(ours_cache)}
    # webdataset's download, then ours, then nothing: the second epoch was all hits
    assert _gets(nginx_server, store, urls) == [2, 2, 2]
    assert [n.split(".")[0] for n in settled(ours_cache)] == [f"shard-{k:02d}" for k in range(3)]


def test_file_cache_names_do_not_collide_across_buckets(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    one, two = nginx_server.new_store(), nginx_server.new_store()
    urls_one, keys_one = _seed(one, "one")
    urls_two, keys_two = _seed(two, "two")
    theirs, ours = str(tmp_path / "theirs"), FileCache(str(tmp_path / "ours"))
    os.mkdir(theirs)  # webdataset wants it made
    for urls, keys in ((urls_one, keys_one), (urls_two, keys_two)):
        got = list(cached_tarfile_samples(urls, cache_dir=str(tmp_path / "ours"),
                                          url_to_name=url_to_cache_name))
        assert [s["__key__"] for s in got] == keys
        assert [s["__key__"] for s in _samples(ours(urls))] == keys
    # webdataset names both buckets' shard-00.tar "shard-00.tar": the second bucket's samples
    # come from the first bucket's file
    for urls in (urls_one, urls_two):
        collided = list(webdataset.WebDataset(urls, shardshuffle=False, cache_dir=theirs))
        assert [s["__key__"] for s in collided] == keys_one
    assert len(settled(tmp_path / "ours")) == 4


def _samples(opened: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    from wds_cloud.tar.samples import group_by_keys, tar_file_expander

    return list(group_by_keys(tar_file_expander(opened)))


def test_get_file(nginx_server: NginxServer, tmp_path: Path) -> None:
    store = nginx_server.new_store()
    urls, _ = _seed(store, "gf", 2)
    cache = FileCache(str(tmp_path / "c"), cache_size=10 * 2**20)
    theirs = wdscache.FileCache(str(tmp_path / "w"))
    path = cache.get_file(urls[0])
    assert path.startswith(str(tmp_path / "c" / "data") + os.sep)
    assert Path(path).read_bytes() == Path(theirs.get_file(urls[0])).read_bytes()
    assert cache.get_file(urls[0]) == path
    assert _gets(nginx_server, store, urls[:1]) == [2]  # webdataset's one, ours one
    assert cache.cleaner is not None and cache.cleaner.cache_size == 10 * 2**20
    # local paths as they are, as webdataset
    local = tmp_path / "local.tar"
    local.write_bytes(b"x")
    for url in (str(local), f"file://{local}", "rel/x.tar"):
        assert cache.get_file(url) == theirs.get_file(url)
    # what cannot be cached says so
    with pytest.raises(CacheError, match="pipe"):
        cache.get_file(f"pipe:cat {local}")
    small = FileCache(str(tmp_path / "small"), cache_size=4 * KiB)
    with pytest.raises(CacheError, match=urls[1]):
        small.get_file(urls[1])
    assert settled(tmp_path / "small") == []
    with pytest.raises(ShardNotFoundError, match=r"missing\.tar"):
        cache.get_file(store.url("missing.tar"))


def test_a_download_that_is_not_a_tar_file_is_refused_and_removed(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    store = nginx_server.new_store()
    store.put("page.tar", b"<html>not a shard</html>" * 40)
    url = store.url("page.tar")
    with pytest.raises(ValueError, match="is not a tar archive"):  # webdataset's, and ours
        wdscache.FileCache(str(tmp_path / "w")).get_file(url)
    cache = FileCache(str(tmp_path / "c"))
    with pytest.raises(ShardFormatError, match=r"is not a tar archive, but data.*<html>"):
        cache.get_file(url)
    assert settled(tmp_path / "c") == []
    with pytest.raises(ShardFormatError, match=url):
        list(cache([url]))
    # without a validator, the bytes are what they are
    [opened] = FileCache(str(tmp_path / "c"), validator=None)([url])
    with opened["stream"] as f:
        assert f.read() == b"<html>not a shard</html>" * 40
    assert len(settled(tmp_path / "c")) == 1


def test_handler_gets_a_failed_url_once(nginx_server: NginxServer, tmp_path: Path) -> None:
    store = nginx_server.new_store()
    urls, _ = _seed(store, "h", 1)
    missing = store.url("missing.tar")
    seen: list[BaseException] = []

    def keep_going(exn: BaseException) -> bool:
        seen.append(exn)
        return True

    opened = list(FileCache(str(tmp_path / "c"), handler=keep_going)([missing, *urls]))
    assert [o["url"] for o in opened] == urls
    for o in opened:
        o["stream"].close()
    assert len(seen) == 1 and isinstance(seen[0], ShardNotFoundError)
    assert _gets(nginx_server, store, [missing]) == [1]  # webdataset asked 10 times, sleeping
    stop = list(FileCache(str(tmp_path / "c"), handler=lambda exn: False)([missing, *urls]))
    assert stop == []


def test_two_readers_of_one_url_make_one_request(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    """FileCache keeps the cache's locks: a reader arriving during a download reads along."""
    store = nginx_server.new_store()
    urls, _ = _seed(store, "two", 1, size=2 * 2**20)
    paths: list[str] = []
    barrier = threading.Barrier(3)

    def get() -> None:
        cache = FileCache(str(tmp_path / "c"))
        barrier.wait()
        paths.append(cache.get_file(urls[0]))

    threads = [threading.Thread(target=get) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == 3 and len(set(paths)) == 1
    assert _gets(nginx_server, store, urls) == [1]


def test_file_cache_pickles_and_reads_in_dataloader_workers(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    import torch

    store = nginx_server.new_store()
    urls, keys = _seed(store, "dl", 4)
    cache = FileCache(str(tmp_path / "c"))
    next(iter(cache(urls[:1])))["stream"].close()  # used once here: its router stays behind
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.cache_dir == cache.cache_dir and clone._router is None
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_worker, clone,
                          wds.tariterators.tar_file_expander, wds.tariterators.group_by_keys)
    loader = torch.utils.data.DataLoader(ds, num_workers=2, batch_size=None)
    assert sorted(s["__key__"] for s in loader) == sorted(keys)
    assert len(settled(tmp_path / "c")) == 4


# -- StreamingOpen -----------------------------------------------------------------------------

def test_streaming_open_is_webdatasets_and_never_caches(
    nginx_server: NginxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WDS_CACHE", str(tmp_path / "env-cache"))  # not for StreamingOpen
    store = nginx_server.new_store()
    urls, _ = _seed(store, "so", 1)
    local = tmp_path / "l.tar"
    local.write_bytes(b"local bytes")
    monkeypatch.chdir(tmp_path)
    sources = [urls[0], str(local), f"file://{local}", "l.tar", {"url": "l.tar", "x": 1}]
    ours = list(StreamingOpen()(sources))
    theirs = list(wdscache.StreamingOpen()(sources))
    assert [{k: v for k, v in o.items() if k != "stream"} for o in ours] == \
        [{k: v for k, v in t.items() if k != "stream"} for t in theirs]
    for o, t in zip(ours, theirs, strict=True):
        with o["stream"] as a, t["stream"] as b:
            assert a.read() == b.read()
    assert not (tmp_path / "env-cache").exists()
    seen: list[BaseException] = []
    got = list(StreamingOpen(handler=lambda e: seen.append(e) is None)(["nope.tar", "l.tar"]))
    assert [g["url"] for g in got] == ["l.tar"] and isinstance(seen[0], FileNotFoundError)
    got[0]["stream"].close()


# -- cached_url_opener, cached_tarfile_to_samples ------------------------------------------------

def test_cached_tarfile_to_samples_over_nginx_is_webdatasets(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    store = nginx_server.new_store()
    urls, keys = _seed(store, "ct", 3)
    theirs = list(webdataset.DataPipeline(
        webdataset.SimpleShardList(urls), webdataset.tarfile_to_samples()))
    cache = tmp_path / "c"
    for epoch in range(2):
        ours = list(wds.DataPipeline(wds.SimpleShardList(urls),
                                     cached_tarfile_to_samples(cache_dir=str(cache))))
        assert _content(ours) == _content(theirs), epoch
    assert [s["__key__"] for s in ours] == keys
    assert len(settled(cache)) == 3
    assert _gets(nginx_server, store, urls) == [2, 2, 2]  # webdataset's, ours; then hits
    # select_files and rename_files, as webdataset's tarfile_to_samples takes them
    kw: dict[str, Any] = {"select_files": lambda n: not n.endswith(".bin"),
                          "rename_files": lambda n: n.replace(".txt", ".text")}
    ours = list(cached_tarfile_samples([{"url": u} for u in urls], cache_dir=str(cache), **kw))
    theirs = list(webdataset.tarfile_to_samples(**kw)(iter([{"url": u} for u in urls])))
    assert _content(ours) == _content(theirs) and "text" in ours[0]
    stage = pickle.loads(pickle.dumps(cached_tarfile_to_samples(cache_dir=str(cache))))
    assert [s["__key__"] for s in stage(iter([{"url": urls[0]}]))] == keys[:3]


def test_cached_tarfile_to_samples_over_pipe_cat_is_webdatasets(tmp_path: Path) -> None:
    specs = []
    for k in range(2):
        data, _ = make_shard(f"p{k}", 3, 4 * KiB)
        (tmp_path / f"p-{k}.tar").write_bytes(data)
        specs.append(f"pipe:cat {tmp_path / f'p-{k}.tar'}")
    theirs = list(webdataset.DataPipeline(
        webdataset.SimpleShardList(specs), webdataset.tarfile_to_samples()))
    cache = tmp_path / "c"
    ours = list(wds.DataPipeline(wds.SimpleShardList(specs),
                                 cached_tarfile_to_samples(cache_dir=str(cache))))
    assert _content(ours) == _content(theirs) and len(ours) == 6
    assert cache_files(cache) == []  # pipe: output is read, not cached


def test_cached_url_opener_local_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, keys = make_shard("lo", 3, 4 * KiB)
    (tmp_path / "s.tar").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "c"
    [plain] = cached_url_opener([{"url": "s.tar", "extra": 1}], cache_dir=str(cache))
    assert plain["extra"] == 1 and plain["local_path"] == "s.tar"
    plain["stream"].close()
    assert cache_files(cache) == []  # read where it is
    for _ in range(2):
        [cached] = cached_url_opener([{"url": "s.tar"}], cache_dir=str(cache), always=True)
        with cached["stream"] as f:
            assert f.read() == data
    assert cached["local_path"] == str(cache / "data" / settled(cache)[0])
    got = list(cached_tarfile_samples(["s.tar"], cache_dir=str(cache), always=True))
    assert [s["__key__"] for s in got] == keys


# -- LRUCleanup --------------------------------------------------------------------------------

def test_lru_cleanup_evicts_the_least_recently_used_never_one_being_read(
    nginx_server: NginxServer, tmp_path: Path,
) -> None:
    store = nginx_server.new_store()
    urls, _ = _seed(store, "lru", 4, size=16 * KiB)
    root = tmp_path / "c"
    files = FileCache(str(root), validator=None)
    paths = {url: files.get_file(url) for url in urls}
    size = Path(paths[urls[0]]).stat().st_size
    (root / "notes.txt").write_text("not an entry")

    def no_store() -> Any:
        raise AssertionError("a hit must not ask the store")

    with ShardCache(root).open(urls[2], no_store) as held:  # a hit: being read
        for url in (urls[2], urls[3], urls[0], urls[1]):  # used in this order (ctime)
            os.utime(paths[url])
            time.sleep(0.02)
        LRUCleanup(str(root), cache_size=2 * footprint(size), interval=None).cleanup()
        assert held.read() == Path(paths[urls[2]]).read_bytes()
    kept = {u for u, p in paths.items() if os.path.exists(p)}
    assert kept == {urls[1], urls[2]}  # url 2 was the oldest, but it was being read
    assert (root / "notes.txt").read_text() == "not an entry"
    # within the interval nothing happens; a directory that is not a cache is left alone
    timed = LRUCleanup(str(root), cache_size=0, interval=3600)
    timed.last_run = time.time()
    timed.cleanup()
    assert len(settled(root)) == 2
    timed.set_cache_dir(str(tmp_path))
    timed.interval = None
    timed.cleanup()
    assert len(settled(root)) == 2
    LRUCleanup(str(root), cache_size=0, interval=None, keyfn=os.path.getmtime).cleanup()
    assert settled(root) == []
