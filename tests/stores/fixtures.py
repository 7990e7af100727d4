"""pytest fixtures for the real test servers (loaded by tests/conftest.py as a plugin).

Session servers, each started on first use only, one process each, stopped at session end:
``s3_server`` (rclone), ``gcs_server`` (fake-gcs), ``gcs_gate`` (a fault proxy before fake-gcs
that denies ``__denied__/``), ``azure_server`` (Azurite), ``nginx_server``, ``ais_server``
(gateway+target, backed by ``gcs_server``). A server that cannot start FAILS the test with its
log tail; nothing here skips.

Per test:
``store`` is parametrized over ``STORE_NAMES`` ("local", "s3", "gs", "az", "http", "ais"),
each a :class:`stores.Store` on a fresh bucket; ``store_factory(name)`` makes any of them (also
``"ais-native"``); ``fault_proxy(upstream)`` returns a running :class:`stores.FaultProxy` in
front of ``upstream`` (a base URL, or a Store: its ``origin`` and ``flavor``), with clean stats
and no faults except the ``__denied__/`` deny rule, plus any ``**faults`` given::

    def test_resume(store, fault_proxy):
        proxy = fault_proxy(store, cut_every=5_000_000)
        via = store.proxied(proxy)        # same bucket, reached through the proxy
        ...
        assert proxy.stats()["faults"]["cut"] > 0

Proxies are kept per (upstream, flavor) for the session and reset between tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .ais import AisServer
from .azure import AzuriteServer
from .base import DENY_PATTERN, LocalStore, Store, new_name
from .gcs import GcsServer
from .nginx import NginxServer
from .procs import ManagedServer, ServerStartError
from .proxy import FaultProxy
from .s3 import S3Server

__all__ = [
    "STORE_NAMES",
    "ais_server",
    "azure_server",
    "fault_proxy",
    "gcs_gate",
    "gcs_server",
    "nginx_server",
    "s3_server",
    "store",
    "store_factory",
    "stores_tmp",
]

STORE_NAMES = ("local", "s3", "gs", "az", "http", "ais", "ais-native")

S = TypeVar("S", bound=ManagedServer)


def _started(server: S) -> S:
    """``server.start()``, or a test failure carrying the server's log tail."""
    try:
        server.start()
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    return server


def _serve(server: S) -> Iterator[S]:
    """A session fixture's body: start ``server``, hand it over, stop it at the end."""
    yield _started(server)
    server.stop()


@pytest.fixture(scope="session")
def stores_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's directory for server data and logs."""
    return tmp_path_factory.mktemp("stores")


@pytest.fixture(scope="session")
def s3_server(stores_tmp: Path) -> Iterator[S3Server]:
    yield from _serve(S3Server(stores_tmp / "s3"))


@pytest.fixture(scope="session")
def gcs_server(stores_tmp: Path) -> Iterator[GcsServer]:
    yield from _serve(GcsServer(workdir=stores_tmp / "gcs"))


@pytest.fixture(scope="session")
def gcs_gate(gcs_server: GcsServer, stores_tmp: Path) -> Iterator[FaultProxy]:
    """A fault-free proxy before fake-gcs whose only rule denies ``__denied__/`` (403)."""
    yield from _serve(FaultProxy(gcs_server.endpoint_url, flavor="gcs", deny=DENY_PATTERN,
                                 workdir=stores_tmp / "gcs-gate"))


@pytest.fixture(scope="session")
def azure_server(stores_tmp: Path) -> Iterator[AzuriteServer]:
    yield from _serve(AzuriteServer(workdir=stores_tmp / "azurite"))


@pytest.fixture(scope="session")
def nginx_server(stores_tmp: Path) -> Iterator[NginxServer]:
    yield from _serve(NginxServer(workdir=stores_tmp / "nginx"))


@pytest.fixture(scope="session")
def ais_server(gcs_server: GcsServer, stores_tmp: Path) -> Iterator[AisServer]:
    yield from _serve(AisServer(gcs_server, workdir=stores_tmp / "ais"))


@pytest.fixture(scope="session")
def _proxy_pool(stores_tmp: Path) -> Iterator[dict[tuple[str, str], FaultProxy]]:
    pool: dict[tuple[str, str], FaultProxy] = {}
    yield pool
    for proxy in pool.values():
        proxy.stop()


@pytest.fixture
def fault_proxy(
    _proxy_pool: dict[tuple[str, str], FaultProxy], stores_tmp: Path,
) -> Iterator[Callable[..., FaultProxy]]:
    """``fault_proxy(upstream, *, flavor=None, **faults) -> FaultProxy`` (see module doc)."""
    used: list[FaultProxy] = []

    def make(upstream: str | Store, *, flavor: str | None = None, **faults: Any) -> FaultProxy:
        if isinstance(upstream, Store):
            if upstream.origin is None:
                raise ValueError(f"the {upstream.name} store has no server to proxy")
            flavor = flavor or upstream.flavor
            upstream = upstream.origin
        flavor = flavor or "plain"
        key = (upstream.rstrip("/"), flavor)
        proxy = _proxy_pool.get(key)
        if proxy is None:
            workdir = stores_tmp / f"proxy-{len(_proxy_pool)}"
            proxy = _started(FaultProxy(key[0], flavor=flavor, deny=DENY_PATTERN,
                                        workdir=workdir))
            _proxy_pool[key] = proxy
        else:
            proxy.reset()
        if faults:
            proxy.configure(**faults)
        used.append(proxy)
        return proxy

    yield make
    for proxy in used:
        proxy.reset()


@pytest.fixture
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Store]:
    """``store_factory(name) -> Store`` on a fresh bucket; starts only the servers it needs."""

    def make(name: str) -> Store:
        if name == "local":
            return LocalStore(tmp_path / new_name("local"))
        if name == "s3":
            return request.getfixturevalue("s3_server").new_store()
        if name == "gs":
            gate = request.getfixturevalue("gcs_gate")
            return request.getfixturevalue("gcs_server").new_store(endpoint_url=gate.url)
        if name == "az":
            return request.getfixturevalue("azure_server").new_store()
        if name == "http":
            return request.getfixturevalue("nginx_server").new_store()
        if name == "ais":
            return request.getfixturevalue("ais_server").gs_store()
        if name == "ais-native":
            return request.getfixturevalue("ais_server").native_store()
        raise ValueError(f"unknown store {name!r}; known: {', '.join(STORE_NAMES)}, ais-native")

    return make


@pytest.fixture(params=STORE_NAMES)
def store(request: pytest.FixtureRequest, store_factory: Callable[[str], Store]) -> Store:
    """One :class:`stores.Store` per scheme, on a fresh bucket/container/directory."""
    return store_factory(request.param)
