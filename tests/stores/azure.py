"""Azure Blob: Azurite (installed by .ci/setup into .ci/.tools/), and its Store.

adlfs is given Azurite's connection string (never ``account_host``); the store's 403 comes from
a connection string with a wrong account key.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .base import FsspecServer, FsspecStore
from .procs import HOST, ServerProcess, ServerStartError, http_status, start_with_port

__all__ = [
    "ACCOUNT",
    "ACCOUNT_KEY",
    "AzureStore",
    "AzuriteServer",
    "connection_string",
    "find_azurite",
]

ACCOUNT = "devstoreaccount1"
#: Azurite's well-known development key (public, in Microsoft's docs)
ACCOUNT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
WRONG_KEY = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3Jvbmc="
TOOLS = Path(__file__).resolve().parents[2] / ".ci" / ".tools"


def find_azurite() -> str:
    """``azurite-blob`` from .ci/.tools (what .ci/setup installs), else from PATH."""
    local = TOOLS / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise ServerStartError(f"Azurite is not installed (looked in {local.parent} and on PATH): "
                           "run bash .ci/setup")


def connection_string(blob_endpoint: str, *, key: str = ACCOUNT_KEY) -> str:
    """The connection string for Azurite's account at ``blob_endpoint`` (``http://host:port``)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={blob_endpoint.rstrip('/')}/{ACCOUNT};")


class AzuriteServer(FsspecServer):
    """Azurite's blob service on 127.0.0.1:free port, data in a temp dir; a context manager."""

    label = "Azurite"
    tmp_prefix = "azurite-"
    protocol = "az"

    def __init__(self, *, workdir: Path | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(workdir=workdir, startup_timeout=startup_timeout)

    @property
    def connection_string(self) -> str:
        return connection_string(self.endpoint_url)

    @property
    def storage_options(self) -> dict[str, Any]:
        """adlfs keyword arguments."""
        return {"connection_string": self.connection_string}

    def _launch(self, workdir: Path) -> tuple[ServerProcess, int]:
        binary = find_azurite()
        location = workdir / "data"
        location.mkdir(parents=True, exist_ok=True)

        def argv(port: int) -> list[str]:
            return [binary, "--blobHost", HOST, "--blobPort", str(port), "--location",
                    str(location), "--loose", "--skipApiVersionCheck", "--disableTelemetry",
                    "--silent"]

        # an anonymous account listing is refused (403) once the service is up
        return start_with_port(
            self.label, argv, log_path=workdir / "azurite.log",
            ready=lambda port: http_status(f"http://{HOST}:{port}/{ACCOUNT}?comp=list") == 403,
            timeout=self.startup_timeout,
        )

    def new_store(self, container: str | None = None) -> AzureStore:
        return AzureStore(self, self.new_bucket(container))


class AzureStore(FsspecStore):
    """``az://CONTAINER/key`` on Azurite."""

    name = scheme = "az"
    flavor = "azure"
    features = frozenset({"write", "deny", "proxy", "list"})
    server: AzuriteServer

    @property
    def container(self) -> str:
        return self.bucket

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {"az": {"connection_string": connection_string(self.endpoint_url)}}

    @property
    def denied_storage_options(self) -> dict[str, dict[str, Any]]:
        return {"az": {"connection_string": connection_string(self.endpoint_url, key=WRONG_KEY)}}

    def denied_url(self, key: str) -> str:
        return self.url(key)
