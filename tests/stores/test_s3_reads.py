"""How ``s3://`` reads are sent: built and signed by s3fs's client, sent and received by the
reading thread (wds_cloud.stores.direct) where nothing forbids it, by the client itself where
something does (a proxy, a client certificate, checksums to check) and for the answers it knows
how to follow; over TLS, verified as botocore verifies it.

(What every opener must do, these included, is in test_contract.py; faults in test_faults.py
and test_cloudstores.py.)"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stores import FaultProxy, Store
from stores.tls import self_signed
from wds_cloud.errors import OpenError, TransferError
from wds_cloud.router import gopen
from wds_cloud.settings import Settings
from wds_cloud.stores.aio import AsyncBody, run
from wds_cloud.stores.direct import DirectBody
from wds_cloud.stores.retry import io_stats, reset_io_stats
from wds_cloud.stores.s3 import S3Opener, _client, _sendable
from wds_cloud.testing.locals3 import LocalS3Server

FAST = Settings(retries=2, retry_backoff=0.01, retry_backoff_max=0.02)
DATA = random.Random(3).randbytes(3 * 2**20 + 5)

ProxyFactory = Callable[..., FaultProxy]


@pytest.fixture
def s3(store_factory: Callable[[str], Store]) -> Store:
    return store_factory("s3").holding("data.bin", DATA)


def _plain(store: Store, **config: Any) -> dict[str, Any]:
    """The store's s3fs options, with ``config`` as botocore's config."""
    return {**store.storage_options["s3"], "config_kwargs": config}


@pytest.mark.parametrize(("config", "env"), [
    ({}, {}),
    ({"proxies": {"http": "http://127.0.0.1:9"}}, {}),
    ({}, {"HTTP_PROXY": "http://127.0.0.1:9"}),
    ({"client_cert": "/no/such/cert.pem"}, {}),
    ({"response_checksum_validation": "when_supported"}, {}),
])
def test_the_client_sends_what_only_it_can(config: dict[str, Any], env: dict[str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    options = {"key": "k3y", "secret": "s", "endpoint_url": "http://127.0.0.1:9",
               "skip_instance_cache": True, "config_kwargs": config}
    fs = S3Opener().filesystem("s3://b/k", options, timeout=5)
    client = run(fs.loop, _client, fs, "s3://b/k", "reading", "b")
    assert _sendable(client) == (not config and not env)


def test_reads_asked_to_check_checksums_go_through_the_client(s3: Store) -> None:
    options = {"s3": _plain(s3, response_checksum_validation="when_supported")}
    with gopen(s3.url("data.bin"), "rb", settings=FAST, storage_options=options) as stream:
        assert isinstance(stream._body, AsyncBody)
        assert stream.read() == DATA


def test_answers_the_client_can_follow_go_back_to_it(s3: Store,
                                                      fault_proxy: ProxyFactory) -> None:
    # a 400 may be a wrong region, which botocore corrects (and so may a 301): it gets the
    # same GET to send itself, and its error is ours when it cannot
    proxy = fault_proxy(s3, error_rate=1.0, error_status=400)
    via = s3.proxied(proxy)
    with pytest.raises(OpenError, match="HTTP 400"):
        gopen(via.url("data.bin"), "rb", settings=FAST, storage_options=via.storage_options)
    assert [r.status for r in proxy.requests() if r.method == "GET"] == [400, 400]


def test_closing_a_stream_ends_a_read_blocked_in_another_thread(
        s3: Store, fault_proxy: ProxyFactory) -> None:
    # read-ahead closes the streams its threads are reading when the consumer stops
    proxy = fault_proxy(s3, stall=30.0)
    via = s3.proxied(proxy)
    stream = gopen(via.url("data.bin"), "rb", settings=FAST, storage_options=via.storage_options)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            stream.read()
        except ValueError as exc:  # the stream was closed under it
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.5)  # in the 30 s stall by now
    start = time.monotonic()
    stream.close()
    reader.join(10)
    assert not reader.is_alive() and time.monotonic() - start < 10
    assert [str(e) for e in raised] == ["I/O operation on closed stream"]
    assert len([r for r in proxy.requests() if r.method == "GET"]) == 1  # and did not resume


def test_a_forked_child_closing_a_stream_leaves_the_parents_connection(s3: Store) -> None:
    big = DATA * 11  # more than the kernel buffers ahead of the reader
    s3.put("big.bin", big)
    reset_io_stats()
    with gopen(s3.url("big.bin"), "rb", settings=FAST,
               storage_options=s3.storage_options) as stream:
        head = stream.read(2**20)
        pid = os.fork()
        if pid == 0:  # a DataLoader worker dropping what it inherited
            try:
                stream.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert head + stream.read() == big
    assert io_stats()["resumes"] == 0


# -- TLS ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalS3Server, Path]]:
    root = tmp_path_factory.mktemp("tls-s3")
    cert, key = self_signed(root)
    (root / "bucket").mkdir()
    (root / "bucket" / "data.bin").write_bytes(DATA)
    with LocalS3Server(root, etag_hash="crc32",
                       extra_args=("--cert", str(cert), "--key", str(key))) as server:
        yield server, cert


def _tls_options(server: LocalS3Server, **client_kwargs: Any) -> dict[str, Any]:
    endpoint = server.endpoint_url.replace("http://", "https://")
    return {"s3": {**server.storage_options, "endpoint_url": endpoint,
                   "client_kwargs": client_kwargs}}


def test_tls_is_verified_with_the_ca_bundle_botocore_uses(
        tls_s3: tuple[LocalS3Server, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    server, cert = tls_s3
    for options in (_tls_options(server, verify=str(cert)), _tls_options(server, verify=False)):
        with gopen("s3://bucket/data.bin", "rb", settings=FAST,
                   storage_options=options) as stream:
            assert isinstance(stream._body, DirectBody) and stream.read() == DATA
    with pytest.raises(TransferError, match="certificate verify failed"):
        gopen("s3://bucket/data.bin", "rb", settings=FAST, storage_options=_tls_options(server))
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))  # the session's ca_bundle
    options = _tls_options(server)
    options["s3"]["skip_instance_cache"] = True  # a new session, which reads it
    with gopen("s3://bucket/data.bin", "rb", settings=FAST, storage_options=options) as stream:
        assert isinstance(stream._body, DirectBody) and stream.read() == DATA
