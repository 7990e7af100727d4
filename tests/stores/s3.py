"""S3: rclone serving a directory (wds_cloud.locals3.LocalS3Server), and its Store."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from wds_cloud.errors import OpenError
from wds_cloud.locals3 import LocalS3Server

from .base import Store, invalidate_fsspec, new_name
from .procs import ServerStartError

if TYPE_CHECKING:
    from .proxy import FaultProxy

__all__ = ["S3Server", "S3Store"]


class S3Server:
    """rclone ``serve s3`` on 127.0.0.1 over ``root`` (default: a new temp dir); context manager.

    ``storage_options`` are s3fs's keyword arguments (explicit keys, the endpoint, and the
    checksum settings rclone needs); :meth:`options_for` gives them for another endpoint (a
    proxy). A bucket is a subdirectory of ``root``.
    """

    key = "testing"
    secret = "testing"

    def __init__(self, root: Path | None = None, *, startup_timeout: float = 20.0) -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="s3-"))
        self._server = LocalS3Server(self.root, key=self.key, secret=self.secret,
                                     startup_timeout=startup_timeout)
        self._fs: Any = None

    def start(self) -> S3Server:
        try:
            self._server.start()
        except OpenError as exc:
            raise ServerStartError(f"rclone serve s3 did not start: {exc}") from exc
        return self

    def stop(self) -> None:
        self._server.stop()
        self._fs = None

    @property
    def endpoint_url(self) -> str:
        return self._server.endpoint_url

    @property
    def storage_options(self) -> dict[str, Any]:
        return self._server.storage_options

    def options_for(self, endpoint_url: str, *, secret: str | None = None) -> dict[str, Any]:
        opts = dict(self.storage_options, endpoint_url=endpoint_url)
        if secret is not None:
            opts["secret"] = secret
        return opts

    def fs(self) -> Any:
        """A private s3fs instance talking to the server directly (for seeding and checks)."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options)
        return self._fs

    def new_store(self, bucket: str | None = None) -> S3Store:
        """A Store on a new bucket."""
        bucket = bucket or new_name()
        self.fs().mkdir(bucket)
        return S3Store(self, bucket)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class S3Store(Store):
    """``s3://BUCKET/key`` on rclone; 403 comes from a wrong secret."""

    name = scheme = "s3"
    flavor = "s3"
    features = frozenset({"write", "deny", "proxy", "list"})

    def __init__(self, server: S3Server, bucket: str, *, endpoint_url: str | None = None) -> None:
        self.server = server
        self.bucket = bucket
        self.endpoint_url = endpoint_url or server.endpoint_url
        self.origin = server.endpoint_url

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {"s3": self.server.options_for(self.endpoint_url)}

    @property
    def denied_storage_options(self) -> dict[str, dict[str, Any]]:
        return {"s3": self.server.options_for(self.endpoint_url, secret="not-the-secret")}

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        # rclone serves a directory: seed it as a file, complete before it appears. (An S3 PUT
        # has rclone set the file's mtime after writing it, and a GET racing that is cut short
        # by rclone's "source file is being updated" check, which looks like a network fault.)
        target = self.server.root / self.bucket / key
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.seeding")
        staging.write_bytes(data)
        os.replace(staging, target)
        invalidate_fsspec("s3", f"{self.bucket}/{key}")

    def get(self, key: str) -> bytes | None:
        fs = self.server.fs()
        path = f"{self.bucket}/{key}"
        fs.invalidate_cache(path)
        try:
            return bytes(fs.cat_file(path))
        except FileNotFoundError:
            return None

    def denied_url(self, key: str) -> str:
        return self.url(key)

    def proxied(self, proxy: FaultProxy) -> S3Store:
        self._check_proxy(proxy)
        return S3Store(self.server, self.bucket, endpoint_url=proxy.url)
