"""Datasets over buckets as a training job uses them: DataLoader workers (forked after the parent
used the store), pickling, a shard glob listed once, rewriting of writes, read-ahead threads."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from shardgen import write_tar
from stores.base import Store

import wds_cloud as wds

StoreFactory = Callable[[str], Store]


def _seed(store: Store, tmp_path: Any, shards: int = 4, per_shard: int = 10) -> list[str]:
    keys = []
    for k in range(shards):
        path = tmp_path / f"{k}.tar"
        write_tar(path, [(f"s{k}-{i:03d}", {"cls": str(i).encode(), "txt": f"{k}/{i}".encode()})
                         for i in range(per_shard)])
        keys.append(f"data/shard-{k:03d}.tar")
        store.put(keys[-1], path.read_bytes())
    return keys


@pytest.mark.parametrize("name", ["s3", "gs", "az"])
def test_forked_workers_after_the_parent_used_the_store(
    name: str, store_factory: StoreFactory, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_factory(name)
    store.apply_env(monkeypatch)
    keys = _seed(store, tmp_path)
    # the parent opens a stream first: fsspec's loop thread and sessions exist before the fork
    with wds.gopen(store.url(keys[0]), storage_options=store.storage_options) as stream:
        assert stream.read(512)
    dataset = (wds.WebDataset([store.url(k) for k in keys], shardshuffle=False,
                              storage_options=store.storage_options)
               .decode().to_tuple("txt"))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    got = sorted(text for (text,) in loader)
    assert got == sorted(f"{k}/{i}" for k in range(4) for i in range(10))


@pytest.mark.parametrize("name", ["s3", "gs", "az", "http"])
def test_a_child_closing_inherited_connections_does_not_stall_the_parent(
    name: str, store_factory: StoreFactory, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forked worker that garbage-collects the parent's clients closes the connections it
    inherited (aiohttp's connectors do so in ``__del__``). That must not take the parent's
    sockets out of the event loop's epoll set, which parent and child share."""
    import gc

    import aiohttp

    store = store_factory(name)
    keys = _seed(store, tmp_path, shards=1)
    monkeypatch.setenv("WDS_TIMEOUT", "3")  # a stalled read would retry after 3 s
    url = store.url(keys[0])
    with wds.gopen(url, storage_options=store.storage_options) as stream:
        data = stream.read()
    pid = os.fork()
    if pid == 0:  # the child: close every inherited connector, as their __del__ would
        for obj in gc.get_objects():
            if isinstance(obj, aiohttp.BaseConnector):
                obj._close()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    wds.reset_io_stats()
    with wds.gopen(url, storage_options=store.storage_options) as stream:
        assert stream.read() == data
    assert wds.io_stats()["retries"] == 0


def test_datasets_pickle_with_their_storage_options(
    store_factory: StoreFactory, tmp_path: Any,
) -> None:
    store = store_factory("s3")
    keys = _seed(store, tmp_path, shards=2)
    dataset = wds.WebDataset([store.url(k) for k in keys], shardshuffle=False,
                             storage_options=store.storage_options).to_tuple("__key__")
    clone = pickle.loads(pickle.dumps(dataset))
    assert [k for (k,) in clone] == [k for (k,) in dataset] and len(list(clone)) == 20


def test_a_glob_is_listed_once_not_per_worker(
    store_factory: StoreFactory, fault_proxy: Callable[..., Any], tmp_path: Any,
) -> None:
    store = store_factory("s3")
    _seed(store, tmp_path)
    proxy = fault_proxy(store)
    via = store.proxied(proxy)
    dataset = wds.WebDataset(via.url("data/shard-*.tar"), shardshuffle=False,
                             storage_options=via.storage_options).to_tuple("__key__")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert len(list(loader)) == 40
    assert len(list(loader)) == 40  # a second epoch lists nothing either
    listings = [r for r in proxy.requests() if r.method == "GET" and "list-type" in r.query]
    assert len(listings) == 1
    reads = [r for r in proxy.requests() if r.method == "GET" and r.path.endswith(".tar")]
    assert len(reads) == 8  # one streaming GET per shard and epoch, no per-block requests


def test_urls_with_a_query_string_are_not_patterns(
    store_factory: StoreFactory, tmp_path: Any,
) -> None:
    """``?`` also starts a query (presigned URLs): only stores that can list are globbed."""
    store = store_factory("http")
    keys = _seed(store, tmp_path, shards=2)
    urls = [store.url(k) + "?X-Amz-Signature=abc&X-Amz-Expires=60" for k in keys]
    dataset = wds.WebDataset(urls, shardshuffle=False).to_tuple("__url__")
    assert [u for (u,) in dataset] == [urls[0]] * 10 + [urls[1]] * 10


def test_rewriting_applies_to_writes_too(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WDS_REWRITE", f"s3://nowhere/(.*)={tmp_path}/\\1")
    with wds.TarWriter("s3://nowhere/out.tar") as sink:
        sink.write({"__key__": "a", "txt": "rewritten"})
    assert [s["txt"] for s in wds.WebDataset(str(tmp_path / "out.tar"), shardshuffle=False)
            .decode()] == ["rewritten"]


def test_readahead_threads_end_with_the_iteration(
    store_factory: StoreFactory, tmp_path: Any,
) -> None:
    store = store_factory("http")
    keys = _seed(store, tmp_path, shards=6)
    dataset = wds.WebDataset([store.url(k) for k in keys], shardshuffle=False)
    for i, _ in enumerate(dataset):
        if i == 12:
            break
    del dataset, _
    import gc

    gc.collect()
    for thread in threading.enumerate():
        if thread.name.startswith("wds-readahead"):
            thread.join(timeout=5)
    assert not [t for t in threading.enumerate() if t.name.startswith("wds-readahead")]


@pytest.mark.parametrize("cached", [False, True])
def test_an_empty_object_in_the_middle_goes_to_the_handler(
    store_factory: StoreFactory, tmp_path: Any, cached: bool,
) -> None:
    """A 0-byte object (a failed upload) among good shards: the handler hears of it by URL,
    through the shard cache too, and the other shards' samples all arrive."""
    store = store_factory("s3")
    keys = _seed(store, tmp_path, shards=2)
    store.put("data/empty.tar", b"")
    urls = [store.url(keys[0]), store.url("data/empty.tar"), store.url(keys[1])]
    heard: list[BaseException] = []

    def handler(exn: BaseException) -> bool:
        heard.append(exn)
        return True

    options: dict[str, Any] = {"cache_dir": str(tmp_path / "cache")} if cached else {}
    dataset = wds.WebDataset(urls, shardshuffle=False, handler=handler,
                             storage_options=store.storage_options, **options)
    assert len([s["__key__"] for s in dataset]) == 20
    assert len(heard) == 1 and isinstance(heard[0], wds.ShardFormatError)
    assert "empty shard: 0 bytes" in str(heard[0]) and "empty.tar" in str(heard[0])
