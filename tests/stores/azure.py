"""Azure Blob: Azurite (installed by .ci/setup into .ci/.tools/), and its Store.

adlfs is given Azurite's connection string (never ``account_host``); the store's 403 comes from
a connection string with a wrong account key.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .base import Store, invalidate_fsspec, new_name
from .procs import HOST, ServerProcess, ServerStartError, http_status, start_with_port

if TYPE_CHECKING:
    from .proxy import FaultProxy

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


class AzuriteServer:
    """Azurite's blob service on 127.0.0.1:free port, data in a temp dir; a context manager."""

    def __init__(self, *, workdir: Path | None = None, startup_timeout: float = 30.0) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="azurite-"))
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: ServerProcess | None = None
        self._fs: Any = None

    @property
    def endpoint_url(self) -> str:
        if self._proc is None:
            raise ServerStartError("Azurite is not running")
        return f"http://{HOST}:{self.port}"

    @property
    def connection_string(self) -> str:
        return connection_string(self.endpoint_url)

    @property
    def storage_options(self) -> dict[str, Any]:
        """adlfs keyword arguments."""
        return {"connection_string": self.connection_string}

    def start(self) -> AzuriteServer:
        if self._proc is not None:
            return self
        binary = find_azurite()
        location = self.workdir / "data"
        location.mkdir(parents=True, exist_ok=True)

        def argv(port: int) -> list[str]:
            return [binary, "--blobHost", HOST, "--blobPort", str(port), "--location",
                    str(location), "--loose", "--skipApiVersionCheck", "--disableTelemetry",
                    "--silent"]

        # an anonymous account listing is refused (403) once the service is up
        self._proc, self.port = start_with_port(
            "Azurite", argv, log_path=self.workdir / "azurite.log",
            ready=lambda port: http_status(f"http://{HOST}:{port}/{ACCOUNT}?comp=list") == 403,
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
        """A private adlfs instance talking to Azurite directly."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("az", skip_instance_cache=True, **self.storage_options)
        return self._fs

    def new_store(self, container: str | None = None) -> AzureStore:
        container = container or new_name()
        self.fs().mkdir(container)
        return AzureStore(self, container)

    def __enter__(self) -> AzuriteServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class AzureStore(Store):
    """``az://CONTAINER/key`` on Azurite."""

    name = scheme = "az"
    flavor = "azure"
    features = frozenset({"write", "deny", "proxy", "list"})

    def __init__(self, server: AzuriteServer, container: str, *,
                 endpoint_url: str | None = None) -> None:
        self.server = server
        self.container = container
        self.endpoint_url = endpoint_url or server.endpoint_url
        self.origin = server.endpoint_url

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        return {"az": {"connection_string": connection_string(self.endpoint_url)}}

    @property
    def denied_storage_options(self) -> dict[str, dict[str, Any]]:
        return {"az": {"connection_string": connection_string(self.endpoint_url, key=WRONG_KEY)}}

    def url(self, key: str) -> str:
        return f"az://{self.container}/{key}"

    def put(self, key: str, data: bytes) -> None:
        path = f"{self.container}/{key}"
        self.server.fs().pipe_file(path, data)
        invalidate_fsspec("az", path)

    def get(self, key: str) -> bytes | None:
        fs = self.server.fs()
        path = f"{self.container}/{key}"
        fs.invalidate_cache(path)
        try:
            return bytes(fs.cat_file(path))
        except FileNotFoundError:
            return None

    def denied_url(self, key: str) -> str:
        return self.url(key)

    def proxied(self, proxy: FaultProxy) -> AzureStore:
        self._check_proxy(proxy)
        return AzureStore(self.server, self.container, endpoint_url=proxy.url)
