"""The client side of the fault proxy (tests/stores/faultproxy.py): start, configure, read stats.

::

    with FaultProxy("http://127.0.0.1:9000", flavor="s3", cut_every=5_000_000) as proxy:
        options = {**s3_options, "endpoint_url": proxy.url}
        ...
        proxy.configure(error_rate=0.1)
        assert proxy.stats()["faults"]["cut"] > 0
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from .procs import HOST, ManagedServer, ServerProcess, json_call, start_script

__all__ = ["FaultProxy", "ProxiedRequest"]

SCRIPT = Path(__file__).with_name("faultproxy.py")


class ProxiedRequest(NamedTuple):
    """One request the proxy saw: ``bytes`` is the body bytes it sent back."""

    method: str
    path: str
    query: str
    range: str
    status: int
    bytes: int
    fault: str


class FaultProxy(ManagedServer):
    """A fault proxy subprocess in front of ``upstream`` (a base URL); a context manager.

    ``url`` (``http://127.0.0.1:PORT``) is what the client uses instead of the upstream.
    ``flavor`` (``s3``, ``gcs``, ``azure``, ``ais``, ``plain``) shapes its error bodies like the
    upstream's. ``faults`` are the start values (see faultproxy.py); :meth:`reset` returns to
    them.
    """

    label = "the fault proxy"
    tmp_prefix = "faultproxy-"

    def __init__(
        self, upstream: str, *, flavor: str = "plain", seed: int = 0,
        workdir: Path | None = None, startup_timeout: float = 20.0, **faults: Any,
    ) -> None:
        super().__init__(workdir=workdir, startup_timeout=startup_timeout)
        self.upstream = upstream.rstrip("/")
        self.flavor = flavor
        self.seed = seed
        self.start_faults = dict(faults)

    def _launch(self, workdir: Path) -> tuple[ServerProcess, int]:
        args = ["--upstream", self.upstream, "--host", HOST, "--port", "0",
                "--flavor", self.flavor, "--seed", str(self.seed),
                "--config", json.dumps(self.start_faults)]
        proc, ready = start_script(f"fault proxy -> {self.upstream}", SCRIPT, args,
                                   workdir=workdir, log_name="faultproxy.log",
                                   timeout=self.startup_timeout)
        return proc, int(ready["port"])

    def _call(self, method: str, what: str, body: dict[str, Any] | None = None) -> Any:
        return json_call(method, f"{self.url}/__fault__/{what}", body, who="fault proxy")

    def configure(self, **faults: Any) -> dict[str, Any]:
        """Change faults at run time (merged into the current ones); returns the new config."""
        return dict(self._call("POST", "config", faults))

    def config(self) -> dict[str, Any]:
        return dict(self._call("GET", "config"))

    def stats(self) -> dict[str, Any]:
        """``requests`` {method: {status: n}}, ``total``, ``bytes_sent``, ``faults`` {kind: n},
        ``log`` [{method, path, query, range, status, bytes, fault}]."""
        return dict(self._call("GET", "stats"))

    def requests(self) -> list[ProxiedRequest]:
        """The proxied requests in arrival order."""
        return [ProxiedRequest(**entry) for entry in self.stats()["log"]]

    def reset(self) -> None:
        """Clear the stats; faults back to the start values; the random generator re-seeded."""
        self._call("POST", "reset", {})

    def __repr__(self) -> str:
        return f"FaultProxy({self.url if self.running else 'stopped'} -> {self.upstream})"
