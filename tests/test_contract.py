"""One contract, every store: local disk, s3 (rclone), gs (fake-gcs), az (Azurite), http (nginx),
gs:// proxied through AIStore and AIStore's own ais:// buckets, each on its real server
(tests/stores/)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar
from stores.base import Store

import wds_cloud as wds
from wds_cloud.errors import AccessDeniedError, ShardNotFoundError
from wds_cloud.router import resolve_url

# the stores each feature is expected of (a store losing one fails the test, it is not skipped)
WRITERS = ("local", "s3", "gs", "az", "http", "ais", "ais-native")
# local is not one: the tests run as root, who reads anything
DENIERS = ("s3", "gs", "az", "http", "ais", "ais-native")
LISTERS = ("local", "s3", "gs", "az")
StoreFactory = Callable[[str], Store]


def _with(store_factory: StoreFactory, name: str, feature: str) -> Store:
    store = store_factory(name)
    assert feature in store.features, f"the {name} store lost its {feature!r} feature"
    if name == "local":  # object stores have no directories; a local target needs its own
        (Path(store.url("")) / "out").mkdir(parents=True, exist_ok=True)
    return store


Samples = list[tuple[str, dict[str, bytes]]]


def _samples(n: int, shard: int) -> Samples:
    return [(f"s{shard:02d}-{i:04d}", {"txt": f"sample {shard}/{i}".encode(),
                                        "bin": bytes([i % 256]) * (1000 + 37 * i)})
            for i in range(n)]


def _tar_bytes(samples: Samples, tmp_path: Any, name: str) -> bytes:
    path = tmp_path / name
    write_tar(path, samples)
    return path.read_bytes()


def _seed(store: Store, tmp_path: Any, shards: int = 3, per_shard: int = 20) -> list[str]:
    keys = []
    for k in range(shards):
        key = f"train/shard-{k:03d}.tar"
        store.put(key, _tar_bytes(_samples(per_shard, k), tmp_path, f"local-{k}.tar"))
        keys.append(key)
    return keys


def _read(urls: Any, store: Store, **kw: Any) -> list[tuple[str, str, bytes]]:
    dataset = wds.WebDataset(urls, shardshuffle=False, storage_options=store.storage_options, **kw)
    return [(s["__key__"], s["txt"].decode(), s["bin"]) for s in dataset]


def test_reads_the_same_samples_as_the_local_copy(
    store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.apply_env(monkeypatch)
    keys = _seed(store, tmp_path)
    local = [str(tmp_path / f"local-{k}.tar") for k in range(len(keys))]
    expected = [(s["__key__"], s["txt"].decode(), s["bin"])
                for s in wds.WebDataset(local, shardshuffle=False)]
    assert len(expected) == 60
    assert _read([store.url(k) for k in keys], store) == expected
    for sample in wds.WebDataset(store.url(keys[0]), shardshuffle=False,
                                 storage_options=store.storage_options):
        assert sample["__url__"] == store.url(keys[0])  # the URL as given, not as resolved


def test_raw_bytes_and_exact_size(store: Store, tmp_path: Any,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store.apply_env(monkeypatch)
    data = bytes(range(256)) * 40_000 + b"tail"  # about 10 MB, not a multiple of any block
    store.put("blob.bin", data)
    with wds.gopen(store.url("blob.bin"), storage_options=store.storage_options) as stream:
        head = stream.read(1000)
        rest = stream.read()
    assert head + rest == data


def test_missing_object_names_the_url_as_given_and_resolved(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.apply_env(monkeypatch)
    url = store.url("no/such-shard.tar")
    with pytest.raises(ShardNotFoundError) as info:
        wds.gopen(url, storage_options=store.storage_options)
    err = info.value
    assert isinstance(err, FileNotFoundError) and err.url == url
    resolved = resolve_url(url) if store.env else url
    assert err.resolved_url == resolved
    if resolved != url:
        assert "/v1/objects/" in err.resolved_url  # AIStore's REST path
    # and through a dataset, the handler receives it with the URL
    seen: list[BaseException] = []
    dataset = wds.WebDataset(url, shardshuffle=False, empty_check=False,
                             storage_options=store.storage_options,
                             handler=lambda exn: seen.append(exn) or True)
    assert list(dataset) == [] and isinstance(seen[0], ShardNotFoundError)


@pytest.mark.parametrize("name", DENIERS)
def test_access_denied(name: str, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch,
                       tmp_path: Any) -> None:
    store = _with(store_factory, name, "deny")
    store.apply_env(monkeypatch)
    store.put("secret.tar", _tar_bytes(_samples(2, 0), tmp_path, "secret.tar"))
    url = store.denied_url("secret.tar")
    with pytest.raises(AccessDeniedError) as info:
        wds.gopen(url, storage_options=store.denied_storage_options)
    assert isinstance(info.value, PermissionError) and info.value.url == url
    for options in store.denied_storage_options.values():
        for secret in ("secret", "key", "account_key", "connection_string"):
            value = options.get(secret)
            if isinstance(value, str) and len(value) > 6:
                assert value not in str(info.value)


@pytest.mark.parametrize("name", WRITERS)
def test_write_then_read_back(name: str, store_factory: StoreFactory,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = _with(store_factory, name, "write")
    store.apply_env(monkeypatch)
    pattern = store.url("out/part-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=5, storage_options=store.storage_options) as sink:
        for i in range(12):
            sink.write({"__key__": f"k{i:03d}", "txt": f"value {i}"})
    for shard, count in ((0, 5), (1, 5), (2, 2)):
        data = store.get(f"out/part-{shard:03d}.tar")
        assert data is not None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert len(tar.getnames()) == count
    again = wds.WebDataset(pattern.replace("%03d", "{000..002}"), shardshuffle=False,
                           storage_options=store.storage_options)
    assert [s["txt"] for s in again.decode()] == [f"value {i}" for i in range(12)]


@pytest.mark.parametrize("name", WRITERS)
def test_failed_write_leaves_no_object(name: str, store_factory: StoreFactory,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = _with(store_factory, name, "write")
    store.apply_env(monkeypatch)
    url = store.url("out/broken.tar")
    with pytest.raises(RuntimeError, match="job died"), \
            wds.TarWriter(url, storage_options=store.storage_options) as sink:
        sink.write({"__key__": "a", "bin": b"x" * 100_000})
        raise RuntimeError("the job died")
    assert store.get("out/broken.tar") is None


@pytest.mark.parametrize("name", LISTERS)
def test_prefix_glob_is_listed_once_and_sorted(
    name: str, store_factory: StoreFactory, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _with(store_factory, name, "list")
    store.apply_env(monkeypatch)
    keys = _seed(store, tmp_path, shards=3, per_shard=4)
    store.put("train/other.txt", b"not a shard")
    pattern = store.url("train/shard-*.tar")
    dataset = wds.WebDataset(pattern, shardshuffle=False, storage_options=store.storage_options)
    urls = [s["__url__"] for s in dataset]
    assert sorted(set(urls)) == [store.url(k) for k in keys] and len(urls) == 12
