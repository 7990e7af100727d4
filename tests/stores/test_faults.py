"""Every sample exactly once, in order, through a proxy that cuts connections, answers 503/429,
stalls and truncates (tests/stores/faultproxy.py) in front of each real server."""

from __future__ import annotations

import hashlib
import logging
import random
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from stores.base import Store
from wds_cloud.errors import TransferError

StoreFactory = Callable[[str], Store]
ProxyFactory = Callable[..., Any]
MB = 2**20


def _seed(store: Store, tmp_path: Any, *, shards: int,
          shard_mb: int) -> tuple[list[tuple[str, str]], int]:
    """Shards of 256 KiB samples; returns the expected (key, digest) of every sample in order,
    and the offset where each shard's end-of-archive block ends (what a reader must read)."""
    expected, needed = [], 0
    per_shard = shard_mb * 4
    for k in range(shards):
        samples = []
        for i in range(per_shard):
            key = f"s{k:02d}-{i:05d}"
            payload = hashlib.sha256(key.encode()).digest() * (MB // 4 // 32)
            samples.append((key, {"bin": payload, "txt": key.encode()}))
            expected.append((key, hashlib.md5(payload).hexdigest()))
        path = tmp_path / f"f-{k}.tar"
        write_tar(path, samples)
        data = path.read_bytes()
        # the members end where the zeros of the trailer begin (each ends in a key, not a zero)
        needed = -(-len(data.rstrip(b"\0")) // 512) * 512 + 512
        store.put(f"faults/f-{k:02d}.tar", data)
        path.unlink()
    return expected, needed


def _faults_met(proxy: Any, needed: int) -> Counter[str]:
    """The faults the proxy dealt before byte ``needed`` of a shard, by kind, which a reader
    had to get past: a cut there, or a refusal of a request starting there. Past it lies the
    tar's padding, which a reader may leave unread (after the end-of-archive block)."""
    met: Counter[str] = Counter()
    for entry in proxy.requests():
        if not entry.fault:
            continue
        start = re.match(r"bytes=(\d+)-", entry.range)
        at = int(start.group(1)) if start else 0
        if entry.fault == "cut":
            at += entry.bytes
        met[entry.fault] += at < needed
    return met


def _read_all(via: Store, shards: int, **kw: Any) -> list[tuple[str, str]]:
    urls = [via.url(f"faults/f-{k:02d}.tar") for k in range(shards)]
    dataset = wds.WebDataset(urls, shardshuffle=False, storage_options=via.storage_options, **kw)
    return [(s["__key__"], hashlib.md5(s["bin"]).hexdigest()) for s in dataset]


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_RETRY_BACKOFF", "0.01")
    monkeypatch.setenv("WDS_RETRY_BACKOFF_MAX", "0.05")
    monkeypatch.setenv("WDS_TIMEOUT", "2")


@pytest.mark.parametrize(("name", "shards", "shard_mb"), [
    ("http", 8, 25), ("s3", 8, 25), ("gs", 4, 10), ("az", 4, 10), ("ais", 4, 10),
])
def test_cuts_and_503s_lose_and_repeat_nothing(
    name: str, shards: int, shard_mb: int, store_factory: StoreFactory,
    fault_proxy: ProxyFactory, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
    fast_retries: None, caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's case: a cut every ~5 MB and 10% 503s (200 MB for http and s3)."""
    store = store_factory(name)
    expected, needed = _seed(store, tmp_path, shards=shards, shard_mb=shard_mb)
    # the proxy draws its faults from random.Random(seed): with a seed whose first draw is a
    # 503, one is met however few requests the run makes (~35 here: 0.9^35 = 2.5% of runs
    # met none with seed 0)
    seed = next(s for s in range(1000) if random.Random(s).random() < 0.1)
    proxy = fault_proxy(store, cut_every=5_000_000, error_rate=0.1, error_status=503,
                        seed=seed)
    via = store.proxied(proxy)
    via.apply_env(monkeypatch)
    wds.reset_io_stats()
    caplog.set_level(logging.INFO, logger="wds_cloud")
    assert _read_all(via, shards) == expected
    faults = proxy.stats()["faults"]
    stats = wds.io_stats()
    assert faults.get("cut", 0) >= shards * (shard_mb // 6)  # a cut within every 6 MB at most
    assert faults.get("error", 0) > 0
    # one retry per fault met; a cut or refusal in the padding after the end-of-archive block
    # is met only if the read-ahead got there before the reader ended the shard
    met = _faults_met(proxy, needed)
    assert met.total() <= stats["retries"] <= faults["cut"] + faults.get("error", 0)
    assert stats["resumes"] >= met["cut"]
    assert "retry" in caplog.text and "resumed" in caplog.text  # visible in the logs too


@pytest.mark.parametrize("fault", [
    {"error_rate": 0.5, "error_status": 429, "retry_after": 0},
    {"truncate": 0.5},
    {"cut_every": 1_000_000, "cut_mode": "close"},
    {"stall": 1.5, "stall_rate": 0.5},
], ids=["429", "truncate", "close", "stall"])
@pytest.mark.parametrize("name", ["http", "s3"])
def test_each_fault_kind(
    name: str, fault: dict[str, Any], store_factory: StoreFactory, fault_proxy: ProxyFactory,
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fast_retries: None,
) -> None:
    store = store_factory(name)
    expected, _ = _seed(store, tmp_path, shards=3, shard_mb=3)
    if "stall" in fault:  # a stall longer than the read timeout must end in a resume
        monkeypatch.setenv("WDS_TIMEOUT", "0.5")
    proxy = fault_proxy(store, **fault)
    via = store.proxied(proxy)
    via.apply_env(monkeypatch)
    assert _read_all(via, 3) == expected
    assert sum(proxy.stats()["faults"].values()) > 0


def test_exhausted_retries_reach_the_handler_with_url_and_offset(
    store_factory: StoreFactory, fault_proxy: ProxyFactory, tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch, fast_retries: None,
) -> None:
    store = store_factory("http")
    _seed(store, tmp_path, shards=2, shard_mb=2)
    # the first shard's response is cut after ~0.5 MB, and every resume is refused
    proxy = fault_proxy(store, cut_every=500_000, error_ranged=1.0, only_paths="f-00")
    via = store.proxied(proxy)
    monkeypatch.setenv("WDS_RETRIES", "3")
    seen: list[BaseException] = []
    keys = [s["__key__"] for s in wds.WebDataset(
        [via.url("faults/f-00.tar"), via.url("faults/f-01.tar")], shardshuffle=False,
        handler=lambda exn: seen.append(exn) or True)]
    assert len(seen) == 1 and isinstance(seen[0], TransferError)
    err = seen[0]
    assert err.url == via.url("faults/f-00.tar") and err.offset > 0
    assert f"at byte {err.offset}" in str(err)
    # the broken shard's complete samples came through, then every sample of the next one
    assert keys[-8:] == [f"s01-{i:05d}" for i in range(8)]
    assert all(k.startswith("s00-") for k in keys[:-8])


@pytest.mark.parametrize(("shaping", "shared"), [("rate", True), ("conn_rate", False)])
def test_the_proxy_shapes_the_link_or_each_connection(
    shaping: str, shared: bool, store_factory: StoreFactory, fault_proxy: ProxyFactory,
) -> None:
    """The benchmarks' links: ``rate`` is shared by all responses (two at once take twice as
    long as one), ``conn_rate`` holds for each on its own (two at once take as long as one);
    either way every byte arrives."""
    store = store_factory("http")
    body = random.Random(7).randbytes(2 * MB)
    store.put("shaped/body.bin", body)
    proxy = fault_proxy(store, **{shaping: 4 * MB})
    url = store.proxied(proxy).url("shaped/body.bin")

    def fetch() -> bytes:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return bytes(answer.read())

    start = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda _: fetch(), range(2))) == [body, body]
    took = time.monotonic() - start
    one = (2 * MB - 256 * 1024) / (4 * MB)  # a burst goes out at once
    assert took >= (2 * one if shared else one) * 0.9
    if not shared:
        assert took < 2 * one  # both at once, each at its own rate
