"""S3: rclone serving a directory (wds_cloud.testing.locals3.LocalS3Server), and its Store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wds_cloud.errors import OpenError
from wds_cloud.testing.locals3 import LocalS3Server

from .base import FsspecServer, FsspecStore, invalidate_fsspec, write_atomic
from .procs import ServerStartError

__all__ = ["S3Server", "S3Store"]


class S3Server(FsspecServer):
    """rclone ``serve s3`` on 127.0.0.1 over ``root`` (default: a new temp dir); context manager.

    ``storage_options`` are s3fs's keyword arguments (explicit keys, the endpoint, and the
    checksum settings rclone needs); :meth:`options_for` gives them for another endpoint (a
    proxy). A bucket is a subdirectory of ``root``.
    """

    label = "rclone serve s3"
    tmp_prefix = "s3-"
    protocol = "s3"
    key = "testing"
    secret = "testing"

    def __init__(self, root: Path | None = None, *, startup_timeout: float = 20.0) -> None:
        super().__init__(workdir=root, startup_timeout=startup_timeout)

    @property
    def root(self) -> Path:
        """The served directory."""
        if self.workdir is None:
            raise ServerStartError(f"{self.label} is not running")
        return self.workdir

    def _launch(self, workdir: Path) -> tuple[LocalS3Server, int]:
        # CRC32 ETags: rclone's default MD5 would hash each whole object before every answer
        server = LocalS3Server(workdir, key=self.key, secret=self.secret, etag_hash="crc32",
                               startup_timeout=self.startup_timeout)
        try:
            server.start()
        except OpenError as exc:
            raise ServerStartError(f"rclone serve s3 did not start: {exc}") from exc
        return server, server.port

    @property
    def storage_options(self) -> dict[str, Any]:
        if not isinstance(self._proc, LocalS3Server):
            raise ServerStartError(f"{self.label} is not running")
        return self._proc.storage_options

    def options_for(self, endpoint_url: str, *, secret: str | None = None) -> dict[str, Any]:
        opts = dict(self.storage_options, endpoint_url=endpoint_url)
        if secret is not None:
            opts["secret"] = secret
        return opts

    def new_store(self, bucket: str | None = None) -> S3Store:
        """A Store on a new bucket."""
        return S3Store(self, self.new_bucket(bucket))


class S3Store(FsspecStore):
    """``s3://BUCKET/key`` on rclone; 403 comes from a wrong secret."""

    name = scheme = "s3"
    flavor = "s3"
    features = frozenset({"write", "deny", "proxy", "list"})
    server: S3Server

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {"s3": self.server.options_for(self.endpoint_url)}

    @property
    def denied_storage_options(self) -> dict[str, dict[str, Any]]:
        return {"s3": self.server.options_for(self.endpoint_url, secret="not-the-secret")}

    def put(self, key: str, data: bytes) -> None:
        # rclone serves a directory: seed it as a file, complete before it appears. (An S3 PUT
        # has rclone set the file's mtime after writing it, and a GET racing that is cut short
        # by rclone's "source file is being updated" check, which looks like a network fault.)
        write_atomic(self.server.root / self.bucket / key, data)
        invalidate_fsspec("s3", f"{self.bucket}/{key}")

    def denied_url(self, key: str) -> str:
        return self.url(key)
