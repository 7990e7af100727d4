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

Shared by the server modules: :class:`BucketStore` (a store on one bucket of a server, reached
directly or through a proxy), :class:`FsspecServer` (a server seeded and read back through a
private fsspec instance) and :class:`FsspecStore` (a BucketStore on one).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from wds_cloud.testing import ContractStore

from .procs import ManagedServer

if TYPE_CHECKING:

    from .proxy import FaultProxy

__all__ = [
    "DENY_MARK",
    "DENY_PATTERN",
    "BucketStore",
    "FsspecServer",
    "FsspecStore",
    "LocalStore",
    "Store",
    "invalidate_fsspec",
    "new_name",
    "write_atomic",
]

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


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` (and its parents) so that a server never serves half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.seeding")
    staging.write_bytes(data)
    os.replace(staging, path)


class FsspecServer(ManagedServer):
    """A server that fsspec reaches as ``protocol`` with :attr:`storage_options`.

    Buckets are made, and objects seeded and read back, through a private instance (:meth:`fs`),
    never through wds_cloud's cached ones.
    """

    protocol: ClassVar[str] = ""
    _fs: Any = None

    @property
    def endpoint_url(self) -> str:
        return self.url

    @property
    def storage_options(self) -> dict[str, Any]:
        """The filesystem's keyword arguments for the server itself."""
        raise NotImplementedError

    def fs(self) -> Any:
        """A private fsspec instance talking to the server directly (for seeding and checks)."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem(self.protocol, skip_instance_cache=True,
                                         **self.storage_options)
        return self._fs

    def new_bucket(self, bucket: str | None = None) -> str:
        """Make a bucket (a fresh name by default); returns its name."""
        bucket = bucket or new_name()
        self.fs().mkdir(bucket)
        return bucket

    def put_object(self, path: str, data: bytes) -> None:
        """Write ``BUCKET/key``; wds_cloud's cached instances forget their listings of it."""
        self.fs().pipe_file(path, data)
        invalidate_fsspec(self.protocol, path)

    def get_object(self, path: str) -> bytes | None:
        """The bytes of ``BUCKET/key``, None if there is no such object."""
        fs = self.fs()
        fs.invalidate_cache(path)
        try:
            return bytes(fs.cat_file(path))
        except FileNotFoundError:
            return None

    def stop(self) -> None:
        super().stop()
        self._fs = None


class Store(ContractStore):
    """Base class: see the module docstring for the contract (wds_cloud's
    :class:`~wds_cloud.testing.ContractStore`, plus a name, a scheme and fault proxies)."""

    name: str = ""
    scheme: str = ""
    flavor: str = "plain"
    origin: str | None = None

    def holding(self, key: str, data: bytes) -> Store:
        """This store, with ``data`` put under ``key`` (for fixtures)."""
        self.put(key, data)
        return self

    def denied_url(self, key: str) -> str:
        raise NotImplementedError(f"the {self.name} store cannot produce a 403")

    def proxied(self, proxy: FaultProxy) -> Store:
        raise NotImplementedError(f"the {self.name} store has no server to put a proxy before")

    def _check_proxy(self, proxy: FaultProxy) -> None:
        if self.origin is None or proxy.upstream != self.origin.rstrip("/"):
            raise ValueError(f"{proxy!r} does not forward to this store's origin {self.origin}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url('')}>"


_B = TypeVar("_B", bound="BucketStore")


class BucketStore(Store):
    """A store on one bucket of ``server``: ``{scheme}://BUCKET/key``.

    wds_cloud reaches it at ``endpoint_url``: the server's own URL (its :attr:`origin`), or a
    proxy's (:meth:`proxied`, the same bucket).
    """

    def __init__(self, server: ManagedServer, bucket: str, *,
                 endpoint_url: str | None = None) -> None:
        self.server = server
        self.bucket = bucket
        self.origin = server.url
        self.endpoint_url = endpoint_url or self.origin

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def proxied(self: _B, proxy: FaultProxy) -> _B:
        self._check_proxy(proxy)
        return type(self)(self.server, self.bucket, endpoint_url=proxy.url)


class FsspecStore(BucketStore):
    """A BucketStore on an :class:`FsspecServer`, seeded and read back through its instance."""

    server: FsspecServer

    def put(self, key: str, data: bytes) -> None:
        self.server.put_object(f"{self.bucket}/{key}", data)

    def get(self, key: str) -> bytes | None:
        return self.server.get_object(f"{self.bucket}/{key}")


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

