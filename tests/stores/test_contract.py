"""One contract, every store: local disk, s3 (rclone), gs (fake-gcs), az (Azurite), http (nginx),
gs:// proxied through AIStore and AIStore's own ais:// buckets, each on its real server
(tests/stores/). The contract is wds_cloud's own, shipped for third-party openers:
:class:`wds_cloud.testing.OpenerContract`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import wds_cloud as wds
from stores.base import Store
from stores.fixtures import STORE_NAMES
from wds_cloud.errors import ShardNotFoundError
from wds_cloud.router import resolve_url
from wds_cloud.testing import OpenerContract

# the stores each feature is expected of (a store losing one fails the test, it is not skipped)
WRITERS = ("local", "s3", "gs", "az", "http", "ais", "ais-native")
# local is not one: the tests run as root, who reads anything
DENIERS = ("s3", "gs", "az", "http", "ais", "ais-native")
LISTERS = ("local", "s3", "gs", "az", "ais", "ais-native")
StoreFactory = Callable[[str], Store]


def _with(store_factory: StoreFactory, name: str, feature: str) -> Store:
    store = store_factory(name)
    assert feature in store.features, f"the {name} store lost its {feature!r} feature"
    if name == "local":  # object stores have no directories; a local target needs its own
        (Path(store.url("")) / "out").mkdir(parents=True, exist_ok=True)
    return store


class TestEveryStore(OpenerContract):
    @pytest.fixture(params=STORE_NAMES)
    def store(self, request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
        return store_factory(request.param)

    @pytest.fixture(params=WRITERS)
    def writable_store(self, request: pytest.FixtureRequest,
                       store_factory: StoreFactory) -> Store:
        return _with(store_factory, request.param, "write")

    @pytest.fixture(params=DENIERS)
    def denying_store(self, request: pytest.FixtureRequest,
                      store_factory: StoreFactory) -> Store:
        return _with(store_factory, request.param, "deny")

    @pytest.fixture(params=LISTERS)
    def listing_store(self, request: pytest.FixtureRequest,
                      store_factory: StoreFactory) -> Store:
        return _with(store_factory, request.param, "list")


@pytest.mark.parametrize("name", ["ais", "ais-native"])
def test_a_missing_object_behind_aistore_names_the_rest_path(
    name: str, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_factory(name)
    store.apply_env(monkeypatch)
    url = store.url("no/such-shard.tar")
    with pytest.raises(ShardNotFoundError) as info:
        wds.gopen(url, storage_options=store.storage_options)
    assert info.value.resolved_url == resolve_url(url) != url
    assert "/v1/objects/" in info.value.resolved_url  # AIStore's REST path
