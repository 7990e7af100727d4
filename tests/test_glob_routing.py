"""Shard globs are listed where the shards are read from (after WDS_REWRITE, through AIStore's
bucket listing when proxied) and come back as the URLs the user wrote; each on real servers."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from stores.ais import AisServer
from stores.base import Store
from stores.procs import json_call

import wds_cloud as wds
from wds_cloud.errors import AccessDeniedError, ConfigError, ShardNotFoundError, TransferError
from wds_cloud.router import Router, expand_glob
from wds_cloud.settings import Settings

StoreFactory = Callable[[str], Store]
FAST = {"WDS_RETRIES": "4", "WDS_RETRY_BACKOFF": "0.01", "WDS_RETRY_BACKOFF_MAX": "0.02"}
#: a gs:// listing that bypassed the rewrite or AIStore meets a closed loopback port, never GCS
NOWHERE = {"gs": {"endpoint_url": "http://127.0.0.1:9", "token": "anon", "project": "none"}}


def _shard(name: str, count: int = 2) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(count):
            data = f"{name} {i}".encode()
            info = tarfile.TarInfo(f"{name}-{i:02d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _urls(dataset: Any) -> list[str]:
    return sorted({s["__url__"] for s in dataset})


def _listings(server: AisServer) -> list[dict[str, Any]]:
    return [r for r in server.stats()["log"] if r["path"].startswith("/v1/buckets/")]


@pytest.fixture
def page_size(ais_server: AisServer) -> Iterator[Callable[[int], None]]:
    """Set the AIS test server's listing page size for this test."""
    def configure(size: int) -> None:
        json_call("POST", f"{ais_server.endpoint}/__ais__/config", {"page_size": size},
                  who="AIS test server")

    yield configure
    configure(1000)


# -- rewriting -------------------------------------------------------------------------------

def test_a_rewritten_glob_lists_the_directory_the_user_redirected_to(
    tmp_path: Path, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    gcs = store_factory("gs")  # the bucket also exists in fake-gcs, with one shard only
    gcs.put("train-000.tar", _shard("remote"))
    shared = tmp_path / "shared"
    for k in range(3):
        (shared / gcs.bucket).mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
        (shared / gcs.bucket / f"train-{k:03d}.tar").write_bytes(  # type: ignore[attr-defined]
            _shard(f"local{k}"))
    (shared / gcs.bucket / "other.txt").write_bytes(b"x")  # type: ignore[attr-defined]
    monkeypatch.setenv("WDS_REWRITE", f"gs://={shared}/")
    pattern = gcs.url("train-*.tar")
    dataset = wds.WebDataset(pattern, shardshuffle=False, storage_options=gcs.storage_options)
    samples = list(dataset)
    assert _urls(samples) == [gcs.url(f"train-{k:03d}.tar") for k in range(3)]
    assert sorted(s["txt"].decode() for s in samples)[0] == "local0 0" and len(samples) == 6
    router = Router(Settings.from_env(), gcs.storage_options)
    assert router.glob(pattern) == [gcs.url(f"train-{k:03d}.tar") for k in range(3)]


def test_a_rewrite_with_groups_maps_back_by_its_prefix(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for k in range(2):
        (tmp_path / "mirror" / "b1" / "x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "mirror" / "b1" / "x" / f"s-{k}.tar").write_bytes(_shard(f"s{k}"))
    monkeypatch.setenv("WDS_REWRITE", rf"s3://(\w+)/={tmp_path}/mirror/\1/")
    urls = expand_glob(["s3://b1/x/s-?.tar", "s3://b1/x/plain.tar"])
    assert urls == ["s3://b1/x/s-0.tar", "s3://b1/x/s-1.tar", "s3://b1/x/plain.tar"]


def test_a_rule_reaching_into_the_wildcards_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t-1.tar").write_bytes(_shard("t"))
    monkeypatch.setenv("WDS_REWRITE", rf"gs://b/train-(.*)\.tar={tmp_path}/t-\1.tar")
    with pytest.raises(ConfigError, match="WDS_REWRITE rule") as info:
        wds.WebDataset("gs://b/train-*.tar", shardshuffle=False, storage_options=NOWHERE)
    assert "gs://b/train-*.tar" in str(info.value) and "prefix" in str(info.value)


def test_a_listed_url_that_another_rule_rewrites_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """train-0... maps back to gs://b/train-0..., which the first rule sends elsewhere."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-0.tar").write_bytes(_shard("t"))
    monkeypatch.setenv("WDS_REWRITE", f"gs://b/train-0={tmp_path}/other/;gs://b/={tmp_path}/data/")
    with pytest.raises(ConfigError, match="cannot be mapped back") as info:
        Router(Settings.from_env(), NOWHERE).glob("gs://b/train-*.tar")
    assert "train-0.tar" in str(info.value)


def test_no_match_names_the_pattern_and_where_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WDS_REWRITE", f"gs://={tmp_path}/")
    with pytest.raises(ShardNotFoundError) as info:
        Router(Settings.from_env(), NOWHERE).glob("gs://b/none-*.tar")
    assert info.value.url == "gs://b/none-*.tar"
    assert f"{tmp_path}/b/none-*.tar" in str(info.value)


# -- AIStore ---------------------------------------------------------------------------------

def test_an_ais_proxied_gs_glob_is_listed_by_aistore(
    store_factory: StoreFactory, ais_server: AisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_factory("ais")
    store.apply_env(monkeypatch)
    for k in range(3):
        store.put(f"train/shard-{k:03d}.tar", _shard(f"s{k}"))
    store.put("train/other.txt", b"x")
    store.put("val/shard-000.tar", _shard("v"))
    ais_server.reset()
    # were the listing to bypass AIStore, it would reach fake-gcs here, not the internet
    direct = {"gs": ais_server.gcs.storage_options}  # type: ignore[union-attr]
    samples = list(wds.WebDataset(store.url("train/shard-*.tar"), shardshuffle=False,
                                  storage_options=direct))
    assert _urls(samples) == [store.url(f"train/shard-{k:03d}.tar") for k in range(3)]
    assert len(samples) == 6
    listings = _listings(ais_server)
    bucket = store.bucket  # type: ignore[attr-defined]
    assert [(r["method"], r["path"], r["query"], r["status"]) for r in listings] == [
        ("GET", f"/v1/buckets/{bucket}", "provider=gcp", 200)]


def test_an_ais_native_glob_is_listed_page_by_page(
    store_factory: StoreFactory, ais_server: AisServer, monkeypatch: pytest.MonkeyPatch,
    page_size: Callable[[int], None],
) -> None:
    store = store_factory("ais-native")
    store.apply_env(monkeypatch)
    for k in range(5):
        store.put(f"train/shard-{k:03d}.tar", _shard(f"n{k}"))
    store.put("train/sub/shard-009.tar", _shard("deeper"))  # * stops at "/"
    page_size(2)
    ais_server.reset()
    samples = list(wds.WebDataset(store.url("train/shard-*.tar"), shardshuffle=False))
    assert _urls(samples) == [store.url(f"train/shard-{k:03d}.tar") for k in range(5)]
    assert [s["txt"] for s in samples][:2] == [b"n0 0", b"n0 1"]
    listings = _listings(ais_server)
    assert len(listings) == 3 and all(r["query"] == "provider=ais" for r in listings)


def test_a_pattern_rewritten_to_aistore_comes_back_as_written(
    store_factory: StoreFactory, ais_server: AisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_factory("ais-native")
    store.apply_env(monkeypatch)
    for k in range(2):
        store.put(f"d/shard-{k}.tar", _shard(f"m{k}"))
    monkeypatch.setenv("WDS_REWRITE", f"s3://mirror/=ais://{store.bucket}/")  # type: ignore[attr-defined]
    samples = list(wds.WebDataset("s3://mirror/d/shard-*.tar", shardshuffle=False))
    assert _urls(samples) == ["s3://mirror/d/shard-0.tar", "s3://mirror/d/shard-1.tar"]
    assert len(samples) == 4


def test_aistore_listing_errors_name_the_pattern(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_factory("ais")
    store.apply_env(monkeypatch)
    denied = store.denied_url("x-*.tar")
    with pytest.raises(AccessDeniedError) as info:
        Router(Settings.from_env(), NOWHERE).glob(denied)
    assert denied in str(info.value) and "/v1/buckets/" in str(info.value)
    assert info.value.url == denied
    missing = "gs://no-such-bucket-wds/x-*.tar"
    with pytest.raises(wds.errors.OpenError, match="no such bucket") as not_found:
        Router(Settings.from_env(), NOWHERE).glob(missing)
    assert not_found.value.url == missing


def test_an_ais_glob_without_an_endpoint_says_what_to_set() -> None:
    with pytest.raises(ConfigError, match="AIS_ENDPOINT"):
        wds.WebDataset("ais://bucket/shard-*.tar", shardshuffle=False)


def test_transient_listing_failures_are_retried(
    store_factory: StoreFactory, ais_server: AisServer, fault_proxy: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, page_size: Callable[[int], None],
) -> None:
    store = store_factory("ais-native")
    for k in range(4):
        store.put(f"r/shard-{k}.tar", _shard(f"r{k}"))
    proxy = fault_proxy(ais_server.endpoint, flavor="ais", error_rate=0.5,
                        only_paths="^/v1/buckets/")
    monkeypatch.setenv("AIS_ENDPOINT", proxy.url)
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    page_size(1)
    pattern = store.url("r/shard-*.tar")
    assert Router(Settings.from_env()).glob(pattern) == [store.url(f"r/shard-{k}.tar")
                                                        for k in range(4)]
    assert proxy.stats()["faults"].get("error", 0) > 0
    proxy.configure(error_rate=1.0)
    with pytest.raises(TransferError) as info:
        Router(Settings.from_env()).glob(pattern)
    assert pattern in str(info.value) and info.value.attempts == 5
