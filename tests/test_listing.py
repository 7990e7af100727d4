""":func:`wds_cloud.listing.shard_sizes` for http(s) URLs, on real servers: nginx (ranges),
Python's ``http.server`` (which ignores them) and the fault proxy (error answers)."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from stores.base import Store
from stores.proxy import FaultProxy

from wds_cloud.errors import TransferError
from wds_cloud.listing import shard_sizes
from wds_cloud.router import Router
from wds_cloud.settings import Settings
from wds_cloud.stores.http import LOOKUPS


@pytest.fixture
def web(store_factory: Callable[[str], Store]) -> Store:
    return store_factory("http")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that closes before the whole body is sent: what the test is about


@pytest.fixture
def no_ranges(tmp_path: Path) -> Iterator[str]:
    """The base URL of ``http.server`` serving ``tmp_path``: whole files, Range ignored."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_more_urls_than_lookups_at_once(web: Store) -> None:
    count = LOOKUPS + 8
    for k in range(count):
        web.put(f"s{k}.tar", b"x" * (100 + k))
    urls = [web.url(f"s{k}.tar") for k in range(count + 2)]  # the last two do not exist
    urls.append(urls[3])  # a URL twice
    router = Router(Settings(), None)
    assert shard_sizes(urls, router=router) == {
        url: 100 + k for k, url in enumerate(urls[:count])}


def test_a_server_that_ignores_ranges(no_ranges: str, tmp_path: Path) -> None:
    """Its 200 names the whole size; its body is not read (it could be large)."""
    (tmp_path / "big.tar").write_bytes(b"y" * (8 << 20))
    (tmp_path / "empty.tar").write_bytes(b"")
    urls = [f"{no_ranges}/big.tar", f"{no_ranges}/empty.tar", f"{no_ranges}/gone.tar"]
    assert shard_sizes(urls, router=Router(Settings(), None)) == {urls[0]: 8 << 20,
                                                                   urls[1]: 0}


def test_error_answers_are_retried_then_name_the_url(
        web: Store, fault_proxy: Callable[..., FaultProxy]) -> None:
    """A 503 is retried by the settings' policy (WDS_RETRIES), then the error names the URL;
    a URL that answers is looked up once."""
    web.put("s.tar", b"x" * 10)
    proxy = fault_proxy(web, error_rate=1.0, error_status=503)
    url = web.url("s.tar").replace(web.base_url, proxy.url)
    router = Router(Settings(retries=2, retry_backoff=0.01), None)
    with pytest.raises(TransferError, match=f"cannot look up {url}: HTTP 503"):
        shard_sizes([url], router=router)
    assert [r.status for r in proxy.requests()] == [503] * 3
    proxy.reset()
    assert shard_sizes([url], router=router) == {url: 10}
    assert [r.status for r in proxy.requests()] == [206]
