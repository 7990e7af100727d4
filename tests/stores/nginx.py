"""nginx serving a directory over HTTP, with a 403 area and a parseable access log.

Everything (config, pid, logs, temp paths) lives in one working directory; nginx runs in the
foreground (``daemon off``). ``/private/`` answers 403 (``deny all``). PUT and DELETE (WebDAV)
write into the served root, so HTTP writes can be tested too. Each request is logged as one JSON
line: ``method``, ``uri``, ``status``, ``bytes`` (body bytes sent) and ``range`` (the Range header).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .base import Store, new_name, write_atomic
from .procs import (
    HOST,
    ManagedServer,
    ServerProcess,
    ServerStartError,
    http_request,
    http_status,
    start_with_port,
)

if TYPE_CHECKING:
    from .proxy import FaultProxy

__all__ = ["AccessLogEntry", "HttpStore", "NginxServer", "find_nginx"]

_CONFIG = """\
{user}worker_processes 1;
daemon off;
master_process on;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 256; }}
http {{
    default_type application/octet-stream;
    types {{ text/plain txt; application/x-tar tar; application/json json; }}
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    client_max_body_size 0;
    client_body_temp_path {work}/client_body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    log_format wds escape=json
        '{{"method":"$request_method","uri":"$request_uri","status":$status,'
        '"bytes":$body_bytes_sent,"range":"$http_range"}}';
    access_log {work}/access.log wds;
    server {{
        listen {host}:{port};
        server_name localhost;
        root {root};
        location /private/ {{ deny all; }}
        location / {{
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


class AccessLogEntry(NamedTuple):
    method: str
    uri: str
    status: int
    bytes: int
    range: str


def find_nginx() -> str:
    """The nginx binary: /usr/sbin/nginx or PATH; ServerStartError if absent."""
    for candidate in ("/usr/sbin/nginx", shutil.which("nginx")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ServerStartError("nginx is not installed: run bash .ci/setup (apt-get install nginx)")


class NginxServer(ManagedServer):
    """nginx on 127.0.0.1:free port serving ``root`` (default: a new temp dir); context manager.

    ``url`` is the base URL; ``url_for("a/b.tar")`` the URL of a file under ``root``;
    ``access_log()`` the parsed requests so far; ``clear_access_log()`` starts a new count.
    """

    label = "nginx"
    tmp_prefix = "nginx-"

    def __init__(self, root: Path | None = None, *, workdir: Path | None = None,
                 startup_timeout: float = 20.0) -> None:
        super().__init__(workdir=workdir, startup_timeout=startup_timeout)
        self._root = Path(root) if root else None

    @property
    def root(self) -> Path:
        """The served directory: ``root=``, else ``root/`` in the work dir."""
        if self._root is not None:
            return self._root
        if self.workdir is None:
            raise ServerStartError("nginx is not running")
        return self.workdir / "root"

    def url_for(self, relpath: str) -> str:
        return f"{self.url}/{relpath.lstrip('/')}"

    def _launch(self, workdir: Path) -> tuple[ServerProcess, int]:
        binary = find_nginx()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "private").mkdir(exist_ok=True)
        # as root, workers would run as "nobody" and could not read a private temp dir
        user = "user root root;\n" if os.geteuid() == 0 else ""
        conf = workdir / "nginx.conf"

        def argv(port: int) -> list[str]:
            conf.write_text(_CONFIG.format(user=user, work=workdir, root=self.root.resolve(),
                                           host=HOST, port=port))
            return [binary, "-e", str(workdir / "error.log"), "-p", str(workdir), "-c", str(conf)]

        return start_with_port(
            "nginx", argv, log_path=workdir / "nginx.out",
            ready=lambda port: http_status(f"http://{HOST}:{port}/private/") == 403,
            timeout=self.startup_timeout,
        )

    def _access_log_path(self) -> Path | None:
        path = None if self.workdir is None else self.workdir / "access.log"
        return path if path is not None and path.exists() else None

    def access_log(self) -> list[AccessLogEntry]:
        """Every request logged so far (nginx writes each line as the request ends)."""
        path = self._access_log_path()
        if path is None:
            return []
        entries = []
        for line in path.read_text().splitlines():
            if line.strip():
                data: dict[str, Any] = json.loads(line)
                entries.append(AccessLogEntry(data["method"], data["uri"], int(data["status"]),
                                              int(data["bytes"]), data["range"]))
        return entries

    def new_store(self, directory: str | None = None) -> HttpStore:
        """A Store on a new directory under the served root."""
        directory = directory or new_name()
        (self.root / directory).mkdir(parents=True, exist_ok=True)
        return HttpStore(self, directory)

    def clear_access_log(self) -> None:
        path = self._access_log_path()
        if path is not None:
            path.write_bytes(b"")  # nginx appends (O_APPEND): truncating in place is safe


class HttpStore(Store):
    """``http://127.0.0.1:PORT/<dir>/key`` on nginx, one fresh directory per store.

    Seeding writes the file under nginx's root (its storage); :meth:`get` reads back over HTTP.
    ``/private/`` gives the 403. nginx accepts PUT (WebDAV), which wds_cloud's HTTP writes use.
    """

    name = scheme = "http"
    features = frozenset({"write", "deny", "proxy"})

    def __init__(self, server: NginxServer, directory: str, *, base_url: str | None = None) -> None:
        self.server = server
        self.directory = directory
        self.base_url = (base_url or server.url).rstrip("/")
        self.origin = server.url

    def url(self, key: str) -> str:
        return f"{self.base_url}/{self.directory}/{key}"

    def put(self, key: str, data: bytes) -> None:
        write_atomic(self.server.root / self.directory / key, data)

    def get(self, key: str) -> bytes | None:
        status, _, body = http_request("GET", self.server.url_for(f"{self.directory}/{key}"))
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"nginx answered {status} for {self.directory}/{key}")
        return body

    def denied_url(self, key: str) -> str:
        return f"{self.base_url}/private/{self.directory}/{key}"

    def proxied(self, proxy: FaultProxy) -> HttpStore:
        self._check_proxy(proxy)
        return HttpStore(self.server, self.directory, base_url=proxy.url)
