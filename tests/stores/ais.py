"""The AIStore-REST test server (ais_server.py) as a context manager, and its two stores.

* :class:`AisGsStore` (``name="ais"``): ``gs://`` URLs that wds_cloud must fetch through AIStore
  (``env``: ``AIS_ENDPOINT`` and ``USE_AIS_FOR=gs``); objects live in fake-gcs, which the AIS
  server reads through (cold GET) and writes through (PUT).
* :class:`AisNativeStore` (``name="ais-native"``): ``ais://`` URLs of AIStore's own buckets.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .base import DENY_MARK, DENY_PATTERN, Store, new_name
from .gcs import GcsServer, gcs_get, gcs_put
from .procs import HOST, ServerProcess, ServerStartError, http_request, wait_for_file

if TYPE_CHECKING:
    from .proxy import FaultProxy

__all__ = ["AisGsStore", "AisNativeStore", "AisServer"]

SCRIPT = Path(__file__).with_name("ais_server.py")


class AisServer:
    """Gateway + target of the AIS test server; ``gcs`` backs ``provider=gcp`` buckets.

    ``endpoint`` is the gateway (what ``AIS_ENDPOINT`` names), ``target_url`` the storage node.
    Paths containing ``__denied__/`` are refused with 403 unless ``deny=`` says otherwise.
    """

    def __init__(self, gcs: GcsServer | None = None, *, workdir: Path | None = None,
                 deny: str = DENY_PATTERN, startup_timeout: float = 20.0) -> None:
        self.gcs = gcs
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ais-"))
        self.deny = deny
        self.startup_timeout = startup_timeout
        self.gateway_port = self.target_port = 0
        self._proc: ServerProcess | None = None

    @property
    def endpoint(self) -> str:
        if self._proc is None:
            raise ServerStartError("the AIS test server is not running")
        return f"http://{HOST}:{self.gateway_port}"

    @property
    def target_url(self) -> str:
        return f"http://{HOST}:{self.target_port}"

    def start(self) -> AisServer:
        if self._proc is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        ready = self.workdir / "ready.json"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, str(SCRIPT), "--data-dir", str(self.workdir / "data"),
                "--host", HOST, "--ready-file", str(ready), "--deny", self.deny]
        if self.gcs is not None:
            argv += ["--gcs-endpoint", self.gcs.endpoint_url]
        proc = ServerProcess("AIS test server", argv, log_path=self.workdir / "ais.log").start()
        try:
            ports = wait_for_file(ready, proc=proc, timeout=self.startup_timeout)
        except BaseException:
            proc.stop()
            raise
        self.gateway_port, self.target_port = int(ports["gateway_port"]), int(ports["target_port"])
        self._proc = proc
        return self

    def _call(self, method: str, what: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, _, out = http_request(method, f"{self.endpoint}/__ais__/{what}", body=data)
        if status != 200:
            raise ValueError(f"AIS test server refused {what}: {out.decode(errors='replace')}")
        return json.loads(out)

    def stats(self) -> dict[str, Any]:
        """``requests`` {role: {method: {status: n}}}, ``cold_fetches``, ``log`` (a list of
        {role, method, path, query, range, status})."""
        return dict(self._call("GET", "stats"))

    def reset(self) -> None:
        """Clear the stats."""
        self._call("POST", "reset", {})

    def evict(self) -> None:
        """Drop the copies of remote (gcp) objects: the next GET is cold again."""
        self._call("POST", "evict", {})

    def configure(self, *, deny: str) -> None:
        self._call("POST", "config", {"deny": deny})

    def object_url(self, bucket: str, key: str, provider: str = "ais") -> str:
        return f"{self.endpoint}/v1/objects/{bucket}/{quote(key)}?provider={provider}"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> AisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def gs_store(self, bucket: str | None = None) -> AisGsStore:
        """A store of ``gs://`` URLs fetched through this server (needs ``gcs``)."""
        if self.gcs is None:
            raise ValueError("this AIS server has no fake-gcs behind it")
        return AisGsStore(self, self.gcs.new_bucket(bucket))

    def native_store(self, bucket: str | None = None) -> AisNativeStore:
        return AisNativeStore(self, bucket or new_name())


class AisGsStore(Store):
    """``gs://BUCKET/key`` read and written through the AIS server (``provider=gcp``)."""

    name = "ais"
    scheme = "gs"
    flavor = "ais"
    features = frozenset({"write", "deny", "proxy"})

    def __init__(self, server: AisServer, bucket: str, *, endpoint: str | None = None) -> None:
        assert server.gcs is not None
        self.server = server
        self.gcs = server.gcs
        self.bucket = bucket
        self.endpoint = endpoint or server.endpoint
        self.origin = server.endpoint

    @property
    def env(self) -> dict[str, str]:
        return {"AIS_ENDPOINT": self.endpoint, "USE_AIS_FOR": "gs"}

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        """Into fake-gcs directly; AIS drops its copies so it reads the new object."""
        gcs_put(self.gcs, self.bucket, key, data)
        self.server.evict()

    def get(self, key: str) -> bytes | None:
        """From fake-gcs directly (so a write through AIS is checked where it must land)."""
        return gcs_get(self.gcs, self.bucket, key)

    def denied_url(self, key: str) -> str:
        return self.url(f"{DENY_MARK}/{key}")

    def proxied(self, proxy: FaultProxy) -> AisGsStore:
        self._check_proxy(proxy)
        return AisGsStore(self.server, self.bucket, endpoint=proxy.url)


class AisNativeStore(Store):
    """``ais://BUCKET/key``: AIStore's own bucket (``provider=ais``) in the server's data dir."""

    name = "ais-native"
    scheme = "ais"
    flavor = "ais"
    features = frozenset({"write", "deny", "proxy"})

    def __init__(self, server: AisServer, bucket: str, *, endpoint: str | None = None) -> None:
        self.server = server
        self.bucket = bucket
        self.endpoint = endpoint or server.endpoint
        self.origin = server.endpoint

    @property
    def env(self) -> dict[str, str]:
        return {"AIS_ENDPOINT": self.endpoint, "USE_AIS_FOR": "ais"}

    def url(self, key: str) -> str:
        return f"ais://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        status, _, body = http_request("PUT", self.server.object_url(self.bucket, key), body=data,
                                       follow=True)
        if status != 200:
            raise OSError(f"AIS PUT {self.bucket}/{key}: {status} {body[:200]!r}")

    def get(self, key: str) -> bytes | None:
        status, _, body = http_request("GET", self.server.object_url(self.bucket, key),
                                       follow=True)
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"AIS GET {self.bucket}/{key}: {status} {body[:200]!r}")
        return body

    def denied_url(self, key: str) -> str:
        return self.url(f"{DENY_MARK}/{key}")

    def proxied(self, proxy: FaultProxy) -> AisNativeStore:
        self._check_proxy(proxy)
        return AisNativeStore(self.server, self.bucket, endpoint=proxy.url)
