"""The Store interface the shared contract suite runs against, and the local-disk store.

A Store is one scheme's view of a fresh, private place (bucket, container or directory) on a
running server::

    store.url("a/b.tar")          # URL for wds_cloud, e.g. "s3://t-3f2a/a/b.tar"
    store.put("a/b.tar", data)    # seeds through the server's own API, not through wds_cloud
    store.get("a/b.tar")          # bytes read back through the server's API, None if missing
    store.storage_options         # {"s3": {...}}: pass to wds_cloud as storage_options=
    store.env                     # environment the test must set (AIS_ENDPOINT, USE_AIS_FOR)
    store.denied_url("k")         # a URL the server answers with 403 (whether k exists or not),
    store.denied_storage_options  # ... opened with these storage options
    store.proxied(proxy)          # the same store reached through a FaultProxy in front of
                                  # store.origin (flavor store.flavor shapes its error bodies)

``features`` says what a store can do: ``write`` (wds_cloud can write to url()), ``deny``
(denied_url works), ``proxy`` (proxied works), ``list`` (prefix globs).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

    from .proxy import FaultProxy

__all__ = ["DENY_MARK", "DENY_PATTERN", "LocalStore", "Store", "invalidate_fsspec", "new_name"]

#: a key prefix that the test gates (AIS server, fault proxies) answer with 403, also in listings
DENY_MARK = "__denied__"
DENY_PATTERN = f"{DENY_MARK}/"


def new_name(prefix: str = "t") -> str:
    """A fresh bucket/container name: lower case, digits and '-', 3-63 characters."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def invalidate_fsspec(protocol: str, path: str) -> None:
    """Forget cached listings of ``path`` in every cached fsspec instance of ``protocol``.

    Seeding goes through a private filesystem instance; wds_cloud's own (cached) instances must
    not keep listing a bucket as it was before.
    """
    import fsspec

    cls = fsspec.get_filesystem_class(protocol)
    for instance in list(getattr(cls, "_cache", {}).values()):
        instance.invalidate_cache(path)


class Store:
    """Base class: see the module docstring for the contract."""

    name: str = ""
    scheme: str = ""
    flavor: str = "plain"
    features: frozenset[str] = frozenset()
    origin: str | None = None

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {}

    @property
    def denied_storage_options(self) -> dict[str, dict[str, Any]]:
        return self.storage_options

    @property
    def env(self) -> dict[str, str]:
        return {}

    def url(self, key: str) -> str:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def denied_url(self, key: str) -> str:
        raise NotImplementedError(f"the {self.name} store cannot produce a 403")

    def proxied(self, proxy: FaultProxy) -> Store:
        raise NotImplementedError(f"the {self.name} store has no server to put a proxy before")

    def apply_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Set :attr:`env` for the rest of the test."""
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)

    def _check_proxy(self, proxy: FaultProxy) -> None:
        if self.origin is None or proxy.upstream != self.origin.rstrip("/"):
            raise ValueError(f"{proxy!r} does not forward to this store's origin {self.origin}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url('')}>"


class LocalStore(Store):
    """Plain files under ``root`` (a fresh directory per test); URLs are absolute paths."""

    name = scheme = "local"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # root reads anything whatever its mode: no 403 to be had then
        feats = {"write", "list"} | ({"deny"} if os.geteuid() != 0 else set())
        self.features = frozenset(feats)

    def url(self, key: str) -> str:
        return str(self.root / key)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def get(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def denied_url(self, key: str) -> str:
        if "deny" not in self.features:
            raise NotImplementedError("running as root: file permissions are not enforced")
        path = self.root / DENY_MARK / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        path.chmod(0)
        return str(path)

