"""The AIStore-REST test server (ais_server.py) as a context manager, and its two stores.

* :class:`AisGsStore` (``name="ais"``): ``gs://`` URLs that wds_cloud must fetch through AIStore
  (``env``: ``AIS_ENDPOINT`` and ``USE_AIS_FOR=gs``); objects live in fake-gcs, which the AIS
  server reads through (cold GET) and writes through (PUT).
* :class:`AisNativeStore` (``name="ais-native"``): ``ais://`` URLs of AIStore's own buckets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from .base import DENY_MARK, DENY_PATTERN, BucketStore, new_name
from .gcs import GcsServer
from .procs import HOST, ManagedServer, ServerProcess, http_request, json_call, start_script

__all__ = ["AisGsStore", "AisNativeStore", "AisServer"]

SCRIPT = Path(__file__).with_name("ais_server.py")


class AisServer(ManagedServer):
    """Gateway + target of the AIS test server; ``gcs`` backs ``provider=gcp`` buckets.

    ``endpoint`` is the gateway (what ``AIS_ENDPOINT`` names), ``target_url`` the storage node.
    Paths containing ``__denied__/`` are refused with 403 unless ``deny=`` says otherwise.
    """

    label = "the AIS test server"
    tmp_prefix = "ais-"

    def __init__(self, gcs: GcsServer | None = None, *, workdir: Path | None = None,
                 deny: str = DENY_PATTERN, startup_timeout: float = 20.0) -> None:
        super().__init__(workdir=workdir, startup_timeout=startup_timeout)
        self.gcs = gcs
        self.deny = deny
        self.target_port = 0

    @property
    def endpoint(self) -> str:
        return self.url

    @property
    def gateway_port(self) -> int:
        return self.port

    @property
    def target_url(self) -> str:
        return f"http://{HOST}:{self.target_port}"

    def _launch(self, workdir: Path) -> tuple[ServerProcess, int]:
        args = ["--data-dir", str(workdir / "data"), "--host", HOST, "--deny", self.deny]
        if self.gcs is not None:
            args += ["--gcs-endpoint", self.gcs.endpoint_url]
        proc, ports = start_script("AIS test server", SCRIPT, args, workdir=workdir,
                                   log_name="ais.log", timeout=self.startup_timeout)
        self.target_port = int(ports["target_port"])
        return proc, int(ports["gateway_port"])

    def _call(self, method: str, what: str, body: dict[str, Any] | None = None) -> Any:
        return json_call(method, f"{self.endpoint}/__ais__/{what}", body, who="AIS test server")

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

    def gs_store(self, bucket: str | None = None) -> AisGsStore:
        """A store of ``gs://`` URLs fetched through this server (needs ``gcs``)."""
        if self.gcs is None:
            raise ValueError("this AIS server has no fake-gcs behind it")
        return AisGsStore(self, self.gcs.new_bucket(bucket))

    def native_store(self, bucket: str | None = None) -> AisNativeStore:
        return AisNativeStore(self, bucket or new_name())


class _AisStore(BucketStore):
    """What both AIS stores share: wds_cloud maps their ``scheme`` to ``endpoint_url``."""

    flavor = "ais"
    features = frozenset({"write", "deny", "proxy", "list"})
    server: AisServer

    @property
    def env(self) -> dict[str, str]:
        return {"AIS_ENDPOINT": self.endpoint_url, "USE_AIS_FOR": self.scheme}

    def denied_url(self, key: str) -> str:
        return self.url(f"{DENY_MARK}/{key}")


class AisGsStore(_AisStore):
    """``gs://BUCKET/key`` read and written through the AIS server (``provider=gcp``)."""

    name = "ais"
    scheme = "gs"

    def __init__(self, server: AisServer, bucket: str, *, endpoint_url: str | None = None) -> None:
        assert server.gcs is not None
        super().__init__(server, bucket, endpoint_url=endpoint_url)
        self.gcs = server.gcs

    def put(self, key: str, data: bytes) -> None:
        """Into fake-gcs directly; AIS drops its copies so it reads the new object."""
        self.gcs.put_object(f"{self.bucket}/{key}", data)
        self.server.evict()

    def get(self, key: str) -> bytes | None:
        """From fake-gcs directly (so a write through AIS is checked where it must land)."""
        return self.gcs.get_object(f"{self.bucket}/{key}")


class AisNativeStore(_AisStore):
    """``ais://BUCKET/key``: AIStore's own bucket (``provider=ais``) in the server's data dir."""

    name = "ais-native"
    scheme = "ais"

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
