"""The s3://, gs:// and az:// openers (s3store, gcsstore, azurestore) against real servers.

rclone (S3), fake-gcs-server and Azurite are started by the fixtures of tests/stores/; the
fault proxy in front of them cuts connections, answers 503/429, stalls and denies.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import pytest

from stores import FaultProxy, ProxiedRequest, Store
from stores.azure import WRONG_KEY
from wds_cloud.errors import AccessDeniedError, ConfigError, ShardNotFoundError, TransferError
from wds_cloud.router import Router, gopen
from wds_cloud.settings import Settings
from wds_cloud.stores import base as fsspecstore
from wds_cloud.stores.retry import io_stats, reset_io_stats

CLOUD = ("s3", "gs", "az")
#: a cut (RST) loses what the kernel and aiohttp had buffered: some attempts make no progress
FAST = Settings(retries=30, retry_backoff=0.01, retry_backoff_max=0.05)
BIG = random.Random(20).randbytes(20 * 2**20 + 7)
SMALL = random.Random(6).randbytes(6 * 2**20 + 3)
MiB = 2**20

ProxyFactory = Callable[..., FaultProxy]


@pytest.fixture(params=CLOUD)
def cloud(request: pytest.FixtureRequest, store_factory: Callable[[str], Store]) -> Store:
    """A fresh bucket (container) on each cloud server."""
    return store_factory(request.param)


@pytest.fixture(autouse=True)
def _fresh_stats() -> None:
    reset_io_stats()


def read(url: str, store: Store, settings: Settings = FAST) -> bytes:
    with gopen(url, "rb", settings=settings, storage_options=store.storage_options) as f:
        return f.read()


def write(url: str, store: Store, data: bytes, settings: Settings = FAST) -> None:
    with gopen(url, "wb", settings=settings, storage_options=store.storage_options) as f:
        f.write(data)


def gets(proxy: FaultProxy) -> list[ProxiedRequest]:
    return [r for r in proxy.requests() if r.method == "GET"]


# -- reading ---------------------------------------------------------------------------------

def test_a_20mb_object_is_read_exactly_with_one_get(cloud: Store, fault_proxy: ProxyFactory,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wds_cloud")
    cloud.put("big.bin", BIG)
    proxy = fault_proxy(cloud)
    via = cloud.proxied(proxy)
    # a client of its own: pooled connections left by earlier tests (whose timeouts were as
    # short as 0.5 s) have been seen to time out on their next request (see the closing note)
    options = {scheme: {**opts, "skip_instance_cache": True}
               for scheme, opts in via.storage_options.items()}
    with gopen(via.url("big.bin"), "rb", settings=FAST, storage_options=options) as f:
        assert f.read() == BIG
    # (requests of earlier tests' objects may still reach the shared proxy: count ours only)
    ours = [r for r in gets(proxy) if "big.bin" in r.path + r.query]
    # one streaming GET, no block reads, no retry
    assert [r.range for r in ours] == [""], (ours, caplog.text)
    assert io_stats()["requests"] == 1


def test_an_empty_object_reads_as_no_bytes(cloud: Store) -> None:
    cloud.put("empty.bin", b"")
    assert read(cloud.url("empty.bin"), cloud) == b""


def test_dropped_connections_resume_at_the_byte_where_they_stopped(
        cloud: Store, fault_proxy: ProxyFactory) -> None:
    cloud.put("big.bin", BIG)
    proxy = fault_proxy(cloud, cut_every=5_000_000)
    via = cloud.proxied(proxy)
    assert read(via.url("big.bin"), via) == BIG
    cuts = proxy.stats()["faults"]["cut"]
    assert cuts >= 2
    requests = gets(proxy)
    offsets = [int(r.range.removeprefix("bytes=").rstrip("-")) for r in requests[1:]]
    assert requests[0].range == "" and offsets == sorted(offsets) and offsets[0] > 0
    assert io_stats()["resumes"] == cuts == len(offsets)
    if cloud.scheme == "gs":  # pinned to the generation seen at open
        assert all("generation=" in r.query for r in requests[1:])


@pytest.mark.parametrize("status", [503, 429])
def test_busy_answers_are_retried_by_us(cloud: Store, fault_proxy: ProxyFactory,
                                        status: int) -> None:
    cloud.put("small.bin", SMALL)
    proxy = fault_proxy(cloud, cut_every=1_500_000, error_rate=0.5, error_status=status)
    via = cloud.proxied(proxy)
    assert read(via.url("small.bin"), via) == SMALL
    errors = proxy.stats()["faults"]["error"]
    assert errors >= 1
    # every refused request is one of our retries: the SDKs did not retry behind our back
    assert io_stats()["retries"] == errors + proxy.stats()["faults"].get("cut", 0)


def test_a_stalled_response_times_out_and_resumes(cloud: Store,
                                                  fault_proxy: ProxyFactory) -> None:
    cloud.put("small.bin", SMALL)
    proxy = fault_proxy(cloud, stall=3.0)
    via = cloud.proxied(proxy)
    settings = Settings(retries=30, retry_backoff=0.01, retry_backoff_max=0.05, timeout=0.5)
    with gopen(via.url("small.bin"), "rb", settings=settings,
               storage_options=via.storage_options) as f:
        proxy.configure(stall_rate=0.0)  # only the response already under way stalls
        assert f.read() == SMALL
    assert proxy.stats()["faults"]["stall"] == 1
    assert io_stats()["resumes"] == 1


def test_an_object_replaced_while_it_is_read_is_an_error(cloud: Store,
                                                         fault_proxy: ProxyFactory) -> None:
    cloud.put("v.bin", SMALL)
    proxy = fault_proxy(cloud, cut_every=2_000_000)
    via = cloud.proxied(proxy)
    with gopen(via.url("v.bin"), "rb", settings=FAST,
               storage_options=via.storage_options) as f:
        head = b""
        while len(head) < MiB:  # a read may end early where a connection broke
            head += f.read(MiB - len(head))
        cloud.put("v.bin", SMALL[::-1])
        with pytest.raises(TransferError, match="changed") as info:
            f.read()
    assert head == SMALL[:MiB]
    assert cloud.url("v.bin") in str(info.value) and info.value.offset > 0


# -- writing ---------------------------------------------------------------------------------

def test_a_written_object_reads_back(cloud: Store) -> None:
    write(cloud.url("out/shard.tar"), cloud, SMALL)
    assert cloud.get("out/shard.tar") == SMALL
    assert read(cloud.url("out/shard.tar"), cloud) == SMALL
    assert io_stats()["uploads"] == 1


def test_s3_reads_from_an_offset_with_the_checksum_an_object_was_written_with(
        store_factory: Callable[[str], Store]) -> None:
    # botocore sends a CRC32 with each upload, and rclone answers a ranged GET with the whole
    # object's: botocore's own check of it would fail every resume (a ranged GET), so the s3
    # opener leaves checking to TLS and the body's length unless config_kwargs asks for it
    s3 = store_factory("s3")
    plain = {"s3": {k: v for k, v in s3.storage_options["s3"].items() if k != "config_kwargs"}}
    url = s3.url("with-crc.bin")
    with gopen(url, "wb", settings=FAST, storage_options=plain) as f:
        f.write(SMALL)
    with gopen(url, "rb", settings=FAST, storage_options=plain, offset=5) as f:
        assert f.read() == SMALL[5:]
    assert io_stats()["retries"] == 0


def test_a_large_object_is_written_in_parts(cloud: Store, monkeypatch: pytest.MonkeyPatch,
                                            fault_proxy: ProxyFactory) -> None:
    monkeypatch.setattr(fsspecstore, "_PART", 5 * MiB)  # S3's smallest part
    data = BIG[: 17 * MiB + 1]  # 4 parts, more than one batch of parts in flight
    proxy = fault_proxy(cloud)
    via = cloud.proxied(proxy)
    write(via.url("big.tar"), via, data)
    assert cloud.get("big.tar") == data
    assert proxy.stats()["total"] >= 4


def test_an_aborted_write_leaves_no_object(cloud: Store) -> None:
    stream = gopen(cloud.url("out/aborted.tar"), "wb", settings=FAST,
                   storage_options=cloud.storage_options)
    stream.write(SMALL)
    stream.abort()  # type: ignore[attr-defined]
    assert stream.closed
    assert cloud.get("out/aborted.tar") is None
    with pytest.raises(ShardNotFoundError):
        read(cloud.url("out/aborted.tar"), cloud)


@pytest.mark.parametrize("size", [3 * MiB, 17 * MiB + 1], ids=["one", "parts"])
def test_busy_answers_to_writes_are_retried_by_us(
        cloud: Store, fault_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch,
        size: int) -> None:
    monkeypatch.setattr(fsspecstore, "_PART", 5 * MiB)
    proxy = fault_proxy(cloud, error_rate=0.4, error_status=503)
    via = cloud.proxied(proxy)
    write(via.url("busy.tar"), via, BIG[:size])
    assert cloud.get("busy.tar") == BIG[:size]
    errors = proxy.stats()["faults"].get("error", 0)
    # every refused request is one of our retries: no library retried behind our back
    assert io_stats()["retries"] == errors
    ours = [r for r in proxy.requests() if "busy.tar" in r.path + r.query]
    assert io_stats()["requests"] == len(ours) and io_stats()["failures"] == 0


#: the requests that carry the parts: S3 parts and Azure blocks are PUTs, GCS chunks are
#: POSTs to the resumable upload's session URL
_PART_REQUESTS = {"s3": {"only_methods": ["PUT"]}, "az": {"only_methods": ["PUT"]},
                  "gs": {"only_methods": ["POST"], "only_paths": "upload_id="}}


@pytest.mark.parametrize("name", CLOUD)
def test_a_failed_upload_is_aborted_and_leaves_no_object(
        name: str, store_factory: Callable[[str], Store], fault_proxy: ProxyFactory,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(fsspecstore, "_PART", 5 * MiB)
    store = store_factory(name)
    proxy = fault_proxy(store, error_rate=1.0, **_PART_REQUESTS[name])
    via = store.proxied(proxy)
    settings = Settings(retries=1, retry_backoff=0.01, retry_backoff_max=0.05)
    with pytest.raises(TransferError) as info:
        write(via.url("failed.tar"), via, BIG[: 12 * MiB], settings)
    assert via.url("failed.tar") in str(info.value)
    assert store.get("failed.tar") is None
    assert io_stats()["failures"] >= 1
    if name == "s3":
        fs = store.server.fs()  # type: ignore[attr-defined]
        pending = fs.call_s3("list_multipart_uploads", Bucket=store.bucket)  # type: ignore
        assert not pending.get("Uploads")
        assert any(r.method == "DELETE" for r in proxy.requests())
    if name == "gs":  # the first chunk, tried once and retried once (our policy, not gcsfs's)
        chunks = [r for r in proxy.requests() if r.method == "POST" and "upload_id=" in r.query]
        assert [r.status for r in chunks] == [503, 503]
        cancel = proxy.requests()[-1]  # the upload is cancelled: GCS says 499
        assert cancel.method == "DELETE" and cancel.status == 499
        assert "could not cancel" not in caplog.text


# -- listing ---------------------------------------------------------------------------------

def test_glob_lists_full_urls_sorted(cloud: Store) -> None:
    for key in ("train/shard-002.tar", "train/shard-000.tar", "train/shard-001.tar",
                "train/other.txt", "val/shard-000.tar"):
        cloud.put(key, b"x")
    found = Router(FAST, cloud.storage_options).glob(cloud.url("train/shard-*.tar"))
    assert found == [cloud.url(f"train/shard-00{i}.tar") for i in range(3)]


@pytest.mark.parametrize(("name", "alias"), [("gs", "gcs"), ("az", "abfs"), ("az", "abfss")])
def test_glob_and_read_keep_the_scheme_written(name: str, alias: str,
                                               store_factory: Callable[[str], Store]) -> None:
    store = store_factory(name)
    store.put("a/x-1.tar", b"one")
    pattern = store.url("a/x-*.tar").replace(f"{name}://", f"{alias}://")
    found = Router(FAST, store.storage_options).glob(pattern)
    assert found == [pattern.replace("*", "1")]
    assert read(found[0], store) == b"one"


def test_azure_urls_may_name_the_account(store_factory: Callable[[str], Store]) -> None:
    store = store_factory("az")
    store.put("a/x-1.tar", b"one")
    container = store.container  # type: ignore[attr-defined]
    pattern = f"az://{container}@devstoreaccount1.blob.core.windows.net/a/x-*.tar"
    found = Router(FAST, store.storage_options).glob(pattern)
    assert found == [pattern.replace("*", "1")]
    assert read(found[0], store) == b"one"


# -- errors ----------------------------------------------------------------------------------

def test_a_missing_object_or_bucket_is_shard_not_found(cloud: Store) -> None:
    for url in (cloud.url("no/such.tar"), f"{cloud.scheme}://no-such-bucket-wds/k.tar"):
        with pytest.raises(ShardNotFoundError) as info:
            read(url, cloud)
        assert isinstance(info.value, FileNotFoundError)
        assert url in str(info.value) and info.value.url == url


def test_a_refused_read_is_access_denied(cloud: Store,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cloud.put("secret/x.tar", b"x")
    url = cloud.denied_url("secret/x.tar")  # a wrong key (S3, Azure), a deny rule (GCS)
    options = cloud.denied_storage_options
    with pytest.raises(AccessDeniedError) as info, gopen(url, "rb", storage_options=options):
        pass
    assert isinstance(info.value, PermissionError) and url in str(info.value)
    for secret in ("not-the-secret", WRONG_KEY):
        assert secret not in str(info.value) + caplog.text


def test_a_refused_write_is_access_denied(cloud: Store, fault_proxy: ProxyFactory) -> None:
    via = cloud.proxied(fault_proxy(cloud, deny="/"))
    with pytest.raises(AccessDeniedError) as info:
        write(via.url("out/x.tar"), via, b"y")
    assert via.url("out/x.tar") in str(info.value)
    assert cloud.get("out/x.tar") is None


@pytest.mark.parametrize(("scheme", "bad", "hint"), [
    ("s3", "endpoint_urll", "endpoint_url"),
    ("gs", "tokn", "token"),
    ("az", "conection_string", "connection_string"),
])
def test_an_unknown_storage_option_is_a_config_error(scheme: str, bad: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        gopen(f"{scheme}://bucket/k.tar", storage_options={scheme: {bad: "x"}})
    message = str(info.value)
    assert f"{scheme}://" in message and repr(bad) in message and repr(hint) in message


def test_refused_options_do_not_leak_secrets() -> None:
    secret = "AccountKey=SuperSecretKeyValue"
    with pytest.raises(ConfigError) as info:
        gopen("az://c/k.tar", storage_options={"az": {"connection_string": secret}})
    assert "SuperSecretKeyValue" not in str(info.value)
    with pytest.raises(ConfigError, match="s3://"):
        gopen("s3://b/k.tar", storage_options={"s3": {
            "key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9",
            "config_kwargs": {"no_such_botocore_option": 1}}})


def test_an_option_for_the_opener_itself_is_refused() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        gopen("s3://b/k.tar", block_size=5)
