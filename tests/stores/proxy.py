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
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from .procs import HOST, ServerProcess, ServerStartError, http_request, wait_for_file

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


class FaultProxy:
    """A fault proxy subprocess in front of ``upstream`` (a base URL); a context manager.

    ``flavor`` (``s3``, ``gcs``, ``azure``, ``ais``, ``plain``) shapes its error bodies like the
    upstream's. ``faults`` are the start values (see faultproxy.py); :meth:`reset` returns to
    them.
    """

    def __init__(
        self, upstream: str, *, flavor: str = "plain", seed: int = 0,
        workdir: Path | None = None, startup_timeout: float = 20.0, **faults: Any,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.flavor = flavor
        self.seed = seed
        self.start_faults = dict(faults)
        self.startup_timeout = startup_timeout
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir else None
        self.port = 0
        self._proc: ServerProcess | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: use it where the client would use the upstream."""
        if self._proc is None:
            raise ServerStartError("the fault proxy is not running")
        return f"http://{HOST}:{self.port}"

    def start(self) -> FaultProxy:
        if self._proc is not None:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="faultproxy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        ready = self.workdir / "ready.json"
        ready.unlink(missing_ok=True)
        argv = [
            sys.executable, str(SCRIPT), "--upstream", self.upstream, "--host", HOST,
            "--port", "0", "--ready-file", str(ready), "--flavor", self.flavor,
            "--seed", str(self.seed), "--config", json.dumps(self.start_faults),
        ]
        proc = ServerProcess(f"fault proxy -> {self.upstream}", argv,
                             log_path=self.workdir / "faultproxy.log").start()
        try:
            self.port = int(wait_for_file(ready, proc=proc, timeout=self.startup_timeout)["port"])
        except BaseException:
            proc.stop()
            raise
        self._proc = proc
        return self

    def _call(self, method: str, what: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, _, out = http_request(method, f"{self.url}/__fault__/{what}", body=data,
                                      headers={"Content-Type": "application/json"})
        if status != 200:
            raise ValueError(f"fault proxy refused {what}: {out.decode(errors='replace')}")
        return json.loads(out)

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

    def log_tail(self) -> str:
        return self._proc.log_tail() if self._proc else ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()
        if self._own_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"http://{HOST}:{self.port}" if self._proc else "stopped"
        return f"FaultProxy({where} -> {self.upstream})"
