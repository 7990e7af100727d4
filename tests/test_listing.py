""":func:`wds_cloud.listing.shard_sizes` for http(s) URLs, on real servers: nginx (ranges),
Python's ``http.server`` (which ignores them) and the fault proxy (error answers); and the
retries of S3, GCS and Azure listings and lookups (``shard_sizes`` and ``glob``) behind the
fault proxy."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from stores.base import Store
from stores.proxy import FaultProxy

import wds_cloud as wds
from wds_cloud.errors import TransferError
from wds_cloud.io.registry import get_opener
from wds_cloud.listing import shard_sizes
from wds_cloud.router import Router
from wds_cloud.settings import Settings
from wds_cloud.stores.http import LOOKUPS


@pytest.fixture
def web(store_factory: Callable[[str], Store]) -> Store:
    return store_factory("http")


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


@pytest.mark.parametrize("status", [503, 500])
@pytest.mark.parametrize("name", ["s3", "gs", "az"])
def test_listings_and_lookups_are_retried_by_the_policy(
        store_factory: Callable[[str], Store], fault_proxy: Callable[..., FaultProxy],
        status: int, name: str) -> None:
    """A 503 or 500 on a glob, a listing or a lookup is retried by our policy (the libraries
    make one attempt: s3fs's loop and botocore's retries, gcsfs's ``retry_request`` and
    azure-core's retry policy are off): WDS_RETRIES of them, then the error names the URL, with
    nobody retrying behind our back; a store that answers in between is read."""
    store = store_factory(name)
    for k in range(5):
        store.put(f"listed/a-{k}.tar", b"x" * (10 + k))
    proxy = fault_proxy(store)
    via = store.proxied(proxy)
    settings = Settings(retries=2, retry_backoff=0.01)
    router = Router(settings, via.storage_options)
    few, many = [via.url(f"listed/a-{k}.tar") for k in range(2)], \
        [via.url(f"listed/a-{k}.tar") for k in range(5)]
    pattern = via.url("listed/a-*.tar")
    opener = get_opener(pattern)
    for call, said in [(lambda: shard_sizes(few, router=router), f"cannot look up {few[0]}"),
                       (lambda: shard_sizes(many, router=router),
                        f"cannot list {via.url('listed')}"),
                       (lambda: opener.glob(pattern, storage_options=via.storage_options[name],
                                            settings=settings), f"cannot list {pattern}")]:
        proxy.reset()  # the counts, and the faults back to none
        proxy.configure(error_rate=1.0, error_status=status)
        with pytest.raises(TransferError, match=f"^{re.escape(said)}: HTTP {status} "
                                                "([A-Za-z]+ )?on"):
            call()
        # one attempt may be more than one request (adlfs's glob first asks whether the
        # directory is a blob, gcsfs's info lists the object's "directory" beside the GET):
        # no request is made more than the 3 attempts, each in full
        sent = Counter((r.method, r.path, r.query) for r in proxy.requests())
        assert {r.status for r in proxy.requests()} == {status}
        assert max(sent.values()) == 3 and len(sent) <= 2

    proxy.reset()
    proxy.configure(error_rate=0.5, error_status=status)
    wds.reset_io_stats()
    settings = Settings(retry_backoff=0.01)  # and the default WDS_RETRIES
    router = Router(settings, via.storage_options)
    sizes = {u: 10 + k for k, u in enumerate(many)}
    assert shard_sizes(few, router=router) == {u: sizes[u] for u in few}
    assert shard_sizes(many, router=router) == sizes
    assert opener.glob(pattern, storage_options=via.storage_options[name],
                       settings=settings) == many
    errors = proxy.stats()["faults"]["error"]
    retries = wds.io_stats()["retries"]
    # gcsfs's lookups send a second request alongside (above): some faults fall on it
    assert errors > 0 and (0 < retries <= errors if name == "gs" else retries == errors)
