""":func:`wds_cloud.listing.shard_sizes` for http(s) URLs, on real servers: nginx (ranges),
Python's ``http.server`` (which ignores them) and the fault proxy (error answers); and the
retries of S3 listings and lookups (``shard_sizes`` and ``glob``) behind the fault proxy."""

from __future__ import annotations

import re
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
def test_s3_listings_and_lookups_are_retried_by_the_policy(
        store_factory: Callable[[str], Store], fault_proxy: Callable[..., FaultProxy],
        status: int) -> None:
    """A 503 or 500 on a glob, a listing or a lookup is retried by our policy (botocore's
    retries and s3fs's loop are off): WDS_RETRIES of them, then the error names the URL, with
    nobody retrying behind our back; a store that answers in between is read."""
    s3 = store_factory("s3")
    for k in range(5):
        s3.put(f"listed/a-{k}.tar", b"x" * (10 + k))
    proxy = fault_proxy(s3)
    via = s3.proxied(proxy)
    settings = Settings(retries=2, retry_backoff=0.01)
    router = Router(settings, via.storage_options)
    few, many = [via.url(f"listed/a-{k}.tar") for k in range(2)], \
        [via.url(f"listed/a-{k}.tar") for k in range(5)]
    pattern = via.url("listed/a-*.tar")
    opener = get_opener(pattern)
    for call, said in [(lambda: shard_sizes(few, router=router), f"cannot look up {few[0]}"),
                       (lambda: shard_sizes(many, router=router),
                        f"cannot list {via.url('listed')}"),
                       (lambda: opener.glob(pattern, storage_options=via.storage_options["s3"],
                                            settings=settings), f"cannot list {pattern}")]:
        proxy.reset()  # the counts, and the faults back to none
        proxy.configure(error_rate=1.0, error_status=status)
        with pytest.raises(TransferError, match=f"^{re.escape(said)}: HTTP {status} "
                                                "(SlowDown |InternalError )?on"):
            call()
        assert [r.status for r in proxy.requests()] == [status] * 3

    proxy.reset()
    proxy.configure(error_rate=0.5, error_status=status)
    wds.reset_io_stats()
    settings = Settings(retry_backoff=0.01)  # and the default WDS_RETRIES
    router = Router(settings, via.storage_options)
    sizes = {u: 10 + k for k, u in enumerate(many)}
    assert shard_sizes(few, router=router) == {u: sizes[u] for u in few}
    assert shard_sizes(many, router=router) == sizes
    assert opener.glob(pattern, storage_options=via.storage_options["s3"],
                       settings=settings) == many
    errors = proxy.stats()["faults"]["error"]
    assert errors > 0 and wds.io_stats()["retries"] == errors


def test_a_listing_the_library_retries_ends_in_our_error(
        store_factory: Callable[[str], Store], fault_proxy: Callable[..., FaultProxy]) -> None:
    """azure-core (and gcsfs) retry listings by their own policies (azure-core's does not retry
    a 429; a 500 it retries 3 times over ~90 s, gcsfs 5 times over ~30 s). When the library
    gives up, the error is ours (``TransferError``, naming the pattern), not the library's nor
    the internal ``RetryableError``, and our policy adds no retries on top of the SDK's."""
    az = store_factory("az")
    az.put("listed/a-0.tar", b"x")
    proxy = fault_proxy(az)
    via = az.proxied(proxy)
    proxy.configure(error_rate=1.0, error_status=429, retry_after=0, only_methods=["GET"])
    pattern = via.url("listed/a-*.tar")
    with pytest.raises(TransferError, match=f"^cannot list {re.escape(pattern)}: HTTP 429 .*on "
                                            "listing [(]the store's library retries it by its "
                                            "own policy, not WDS_RETRIES[)]$"):
        get_opener(pattern).glob(pattern, storage_options=via.storage_options["az"],
                                 settings=Settings(retries=8, retry_backoff=0.01))
    gets = [r.status for r in proxy.requests() if r.method == "GET"]
    # the SDK's attempts (1 for a 429 in azure-storage-blob 12; 4 at most by its default
    # policy), not our policy's 9 on top of them
    assert gets and set(gets) == {429} and len(gets) <= 4
