"""Server processes for tests: free ports, start, wait until ready, stop, and their logs.

Every server here binds 127.0.0.1. A server that does not come up raises :class:`ServerStartError`
with the tail of its log; pytest fixtures turn that into a failure (never a skip).
:class:`ManagedServer` is the life cycle every test server class shares (start once, stop, its
own temp dir, context manager).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit

__all__ = [
    "HOST",
    "NO_METADATA_ENV",
    "ManagedServer",
    "ServerProcess",
    "ServerStartError",
    "child_env",
    "free_port",
    "http_request",
    "http_status",
    "isolate_env",
    "json_call",
    "start_script",
    "start_with_port",
    "wait_for_file",
]

HOST = "127.0.0.1"

#: set in every test process and server subprocess: nothing may probe cloud metadata addresses
NO_METADATA_ENV = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "AWS_EC2_METADATA_DISABLED": "true",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


class ServerStartError(RuntimeError):
    """A test server did not start; the message carries its command and log tail."""


def isolate_env() -> None:
    """Set :data:`NO_METADATA_ENV` in this process (bench scripts: before importing gcsfs)."""
    os.environ.update(NO_METADATA_ENV)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (start() retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a server subprocess: ours, no proxies, no metadata probing."""
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
    env.update(NO_METADATA_ENV)
    env.update(extra or {})
    return env


def http_request(
    method: str, url: str, *, body: bytes | None = None, headers: Mapping[str, str] | None = None,
    timeout: float = 30.0, follow: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request with http.client (no proxies from the environment, no retries).

    Returns ``(status, headers with lower-case names, body)``. ``follow`` follows up to 5
    redirects (301/302/303/307/308), re-sending the same method and body.
    """
    for _ in range(6):
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port, timeout=timeout)
        try:
            target = parts.path or "/"
            if parts.query:
                target += "?" + parts.query
            conn.request(method, target, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read()
            got = {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()
        if follow and resp.status in (301, 302, 303, 307, 308) and "location" in got:
            url = got["location"]
            continue
        return resp.status, got, data
    raise OSError(f"too many redirects for {method} {url}")


def http_status(url: str, *, timeout: float = 1.0) -> int | None:
    """The status of ``GET url``, or None when nothing answers."""
    try:
        return http_request("GET", url, timeout=timeout)[0]
    except (OSError, http.client.HTTPException):
        return None


def wait_for_file(path: Path, *, proc: ServerProcess, timeout: float) -> dict[str, Any]:
    """Wait until ``proc`` writes JSON to ``path`` (how our aiohttp servers report their ports)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return dict(json.loads(path.read_text()))
            except ValueError:
                pass  # half written
        if not proc.alive:
            raise proc.start_error(f"exited with status {proc.returncode}")
        time.sleep(0.02)
    raise proc.start_error(f"did not report ready within {timeout:g} s")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The server gets SIGTERM if the test process dies without stopping it (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def default_sigint() -> None:  # pragma: no cover - runs in the child between fork and exec
    """A ``preexec_fn`` for a child that a test stops with SIGINT: Ctrl-C's default, even when
    this process was started with SIGINT ignored (a background job of a non-interactive shell),
    which the child would inherit and so never see its KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    """Last resort: a server left running by an aborted session is stopped at exit."""
    for proc in list(_LIVE):
        proc.stop()


class ServerProcess:
    """One server subprocess with its output in ``log_path``.

    Started in its own session (process group), so :meth:`stop` reaches its children too. Start
    it from the main thread: on Linux it is told to exit when the thread that started it ends.
    """

    def __init__(
        self, name: str, argv: Sequence[str], *, log_path: Path,
        env: Mapping[str, str] | None = None, cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = child_env(env)
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        """Spawn the process (without waiting for it to be ready)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` of the server's output."""
        try:
            data = self.log_path.read_bytes()[-32768:]
        except OSError:
            return "(no log)"
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:]) or "(empty log)"

    def start_error(self, why: str) -> ServerStartError:
        """A ServerStartError naming this server, ``why``, its command and its log tail."""
        return ServerStartError(
            f"{self.name} did not start: {why}\n  command: {' '.join(self.argv)}\n"
            f"  log ({self.log_path}):\n{self.log_tail()}"
        )

    def wait_ready(self, probe: Callable[[], bool], *, timeout: float = 30.0) -> None:
        """Poll ``probe`` until it returns True; raise ServerStartError on exit or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise self.start_error(f"exited with status {self.returncode}")
            if probe():
                return
            time.sleep(0.05)
        raise self.start_error(f"not ready within {timeout:g} s")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL after ``timeout`` s, and reap; idempotent."""
        proc, self._proc = self._proc, None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # children that outlived the leader (nginx workers) are in the same group
        _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def start_with_port(
    name: str, make_argv: Callable[[int], Sequence[str]], *, log_path: Path,
    ready: Callable[[int], bool], timeout: float = 30.0, env: Mapping[str, str] | None = None,
    attempts: int = 3,
) -> tuple[ServerProcess, int]:
    """Start a server on a free port, retrying on another port if that one was taken meanwhile."""
    last: ServerStartError | None = None
    for _ in range(attempts):
        port = free_port()
        proc = ServerProcess(name, make_argv(port), log_path=log_path, env=env).start()
        try:
            proc.wait_ready(functools.partial(ready, port), timeout=timeout)
            return proc, port
        except ServerStartError as exc:
            last = exc
            proc.stop()
            text = proc.log_tail().lower()
            if "address already in use" not in text and "eaddrinuse" not in text:
                raise
    assert last is not None
    raise last


def start_script(
    name: str, script: Path, args: Sequence[str], *, workdir: Path, log_name: str,
    timeout: float,
) -> tuple[ServerProcess, dict[str, Any]]:
    """Run one of our aiohttp server scripts; returns it and what it wrote to its ready file.

    The script gets ``--ready-file WORKDIR/ready.json`` after ``args``; it is stopped again if it
    does not report ready.
    """
    ready = workdir / "ready.json"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, str(script), *args, "--ready-file", str(ready)]
    proc = ServerProcess(name, argv, log_path=workdir / log_name).start()
    try:
        return proc, wait_for_file(ready, proc=proc, timeout=timeout)
    except BaseException:
        proc.stop()
        raise


def json_call(method: str, url: str, body: dict[str, Any] | None = None, *, who: str) -> Any:
    """A control request (JSON both ways) to one of our servers; ValueError unless it says 200."""
    data = None if body is None else json.dumps(body).encode()
    status, _, out = http_request(method, url, body=data,
                                  headers={"Content-Type": "application/json"})
    if status != 200:
        what = urlsplit(url).path.rsplit("/", 1)[-1]
        raise ValueError(f"{who} refused {what}: {out.decode(errors='replace')}")
    return json.loads(out)


class _Process(Protocol):
    """What a ManagedServer runs: a ServerProcess, or a LocalS3Server."""

    def stop(self) -> None: ...

    def log_tail(self, lines: int = ...) -> str: ...


_Server = TypeVar("_Server", bound="ManagedServer")


class ManagedServer:
    """A test server's life cycle; a context manager (``start`` on enter, ``stop`` on exit).

    A subclass implements :meth:`_launch` (start the process with its files in ``workdir``, wait
    until it is ready, return it and its port) and sets ``label`` (its name in errors) and
    ``tmp_prefix``. Without a ``workdir`` the server makes a temp dir when it starts and removes
    it when it stops. :attr:`url` is ``http://127.0.0.1:PORT`` while it runs.
    """

    label: ClassVar[str] = "the server"
    tmp_prefix: ClassVar[str] = "server-"

    def __init__(self, *, workdir: Path | None = None, startup_timeout: float = 20.0) -> None:
        self._own_dir = workdir is None
        self.workdir: Path | None = None if workdir is None else Path(workdir)
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: _Process | None = None

    @property
    def running(self) -> bool:
        """Whether it was started and not stopped since."""
        return self._proc is not None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``; ServerStartError when it is not running."""
        if self._proc is None:
            raise ServerStartError(f"{self.label} is not running")
        return f"http://{HOST}:{self.port}"

    def start(self: _Server) -> _Server:
        """Start it unless it runs; ServerStartError (with its log tail) if it does not come up."""
        if self._proc is None:
            if self.workdir is None:
                self.workdir = Path(tempfile.mkdtemp(prefix=self.tmp_prefix))
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._proc, self.port = self._launch(self.workdir)
        return self

    def _launch(self, workdir: Path) -> tuple[_Process, int]:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the process and remove the temp dir it made; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()
        if self._own_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def log_tail(self) -> str:
        """The end of the server's log ("" when it is not running)."""
        return self._proc.log_tail() if self._proc is not None else ""

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
