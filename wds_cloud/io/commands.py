"""webdataset's command-line openers, with webdataset 1.0.2's names and behaviour: a
:class:`Pipe` (a subprocess's stdout or stdin as a stream, its exit status checked) and the
``gopen_*`` handlers that run ``curl``, ``gsutil`` or ``ais`` (``handler(url, mode, bufsize)``).

wds_cloud's own openers read these stores without a subprocess (:mod:`wds_cloud.stores`) and
``pipe:`` through :class:`~wds_cloud.io.PipeOpener`; these are for code that calls webdataset's
handlers by name, or registers one of them (``gopen_schemes["gs"] = gopen_gsutil``). Unlike
webdataset, nothing is printed: exits are logged at DEBUG (webdataset printed them with
``GOPEN_VERBOSE``), and a failed command raises :class:`~wds_cloud.errors.PipeError`, an
``OSError`` as webdataset's ``IOError``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from subprocess import PIPE, Popen
from typing import Any

from ..errors import PipeError, UnsafeURLError
from . import verbose

__all__ = [
    "Pipe",
    "gopen_ais",
    "gopen_curl",
    "gopen_error",
    "gopen_file",
    "gopen_gsutil",
    "gopen_hf",
    "gopen_htgs",
    "gopen_pipe",
    "info",
    "set_options",
]

log = logging.getLogger(__name__)

#: webdataset's ``gopen.info``: extra context shown in a failed command's message and in the
#: GOPEN_VERBOSE lines (one dict: :mod:`.verbose` prints it)
info = verbose.info


class Pipe:
    """A subprocess's stdout (``mode="r..."``) or stdin (``"w..."``) as a stream; its exit
    status is checked whenever it has exited and on ``close``: a status not in
    ``[0] + ignore_status`` raises :class:`PipeError` unless ``ignore_errors``. ``args`` and
    ``kw`` go to ``subprocess.Popen``; ``timeout`` bounds the wait on ``close``."""

    def __init__(self, *args: Any, mode: str = "rb", timeout: float = 7200.0,
                 ignore_errors: bool = False, ignore_status: list[int] | None = None,
                 **kw: Any) -> None:
        self.ignore_errors = ignore_errors
        self.ignore_status = [0, *(ignore_status or [])]
        self.timeout = timeout
        self.args = (args, kw)
        self.status: int | None = None
        self.proc: Any
        self.stream: Any
        if mode[0] == "r":
            self.proc = Popen(*args, stdout=PIPE, **kw)  # type: ignore[call-overload]
            self.stream = self.proc.stdout
        elif mode[0] == "w":
            self.proc = Popen(*args, stdin=PIPE, **kw)  # type: ignore[call-overload]
            self.stream = self.proc.stdin
        else:
            raise ValueError(f"{mode}: unknown mode")
        if self.stream is None:
            raise ValueError(f"{args}: couldn't open")

    def __str__(self) -> str:
        return f"<Pipe {self.args}>"

    def check_status(self) -> None:
        """If the process has exited, check its status (see :meth:`wait_for_child`)."""
        if self.proc.poll() is not None:
            self.wait_for_child()

    def wait_for_child(self) -> None:
        """Wait for the process, then raise :class:`PipeError` if its status is not ignored."""
        self.status = self.proc.wait()
        log.debug("pipe exit [%s %d:%d] %s %s", self.status, os.getpid(), self.proc.pid,
                  self.args, info)
        if self.status not in self.ignore_status and not self.ignore_errors:
            raise PipeError(f"{self.args}: exit {self.status} (read) {info}",
                            command=str(self.args[0]), returncode=self.status)

    def read(self, *args: Any, **kw: Any) -> bytes:
        """``stream.read``, then a status check."""
        result: bytes = self.stream.read(*args, **kw)
        self.check_status()
        return result

    def write(self, *args: Any, **kw: Any) -> int:
        """``stream.write``, then a status check."""
        result: int = self.stream.write(*args, **kw)
        self.check_status()
        return result

    def readLine(self, *args: Any, **kw: Any) -> bytes:
        """``stream.readline``, then a status check."""
        result: bytes = self.stream.readline(*args, **kw)
        self.check_status()
        return result

    def close(self) -> None:
        """Close the stream, wait for the process (``timeout``) and check its status."""
        if self.stream is not None and not self.stream.closed:
            self.stream.close()
            self.status = self.proc.wait(self.timeout)
            self.wait_for_child()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.close()


def set_options(obj: Any, timeout: float | None = None, ignore_errors: bool | None = None,
                ignore_status: list[int] | None = None, handler: Any = None) -> bool:
    """Set the options of ``obj`` if it is a :class:`Pipe` (then return True), else do nothing
    and return False."""
    if not isinstance(obj, Pipe):
        return False
    if timeout is not None:
        obj.timeout = timeout
    if ignore_errors is not None:
        obj.ignore_errors = ignore_errors
    if ignore_status is not None:
        obj.ignore_status = ignore_status
    if handler is not None:
        obj.handler = handler  # type: ignore[attr-defined]
    return True


def gopen_file(url: str, mode: str = "rb", bufsize: int = 8192) -> Any:
    """Open a local path or ``file:`` URL."""
    if url.startswith("file:"):
        url = re.sub(r"^file://?", "", url)
    return open(url, mode)


def _command(args: list[str], mode: str, bufsize: int, read_ok: list[int],
             write_args: list[str] | None = None, write_ok: list[int] | None = None) -> Pipe:
    if mode[0] == "r":
        return Pipe(args, mode=mode, bufsize=bufsize, ignore_status=read_ok)
    if mode[0] == "w":
        if write_args is None:
            raise ValueError(f"{mode}: cannot write")
        return Pipe(write_args, mode=mode, bufsize=bufsize, ignore_status=write_ok)
    raise ValueError(f"{mode}: unknown mode")


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Run the shell command of a ``pipe:CMD`` URL (exit 141, SIGPIPE, is not an error).
    Refused (:class:`~wds_cloud.errors.UnsafeURLError`, a ``ValueError``) in secure mode
    (``wds.utils.enforce_security``, else ``WDS_SECURE``)."""
    from .. import utils
    from ..settings import Settings

    if not url.startswith("pipe:"):
        raise ValueError(f"gopen_pipe needs a pipe: URL, got {url!r}")
    if utils.refuses_code(Settings.from_env().secure):
        raise UnsafeURLError(f"gopen_pipe: refusing to run a pipe: URL: "
                             f"{utils.why_refused(source='WDS_SECURE=1', undo='unset WDS_SECURE')}")
    if mode[0] not in "rw":
        raise ValueError(f"{mode}: unknown mode")
    return Pipe(url[5:], mode=mode, shell=True, bufsize=bufsize,
                ignore_status=[141])


def gopen_curl(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read a URL with ``curl`` (retrying), or upload with ``curl -T -`` (PUT)."""
    return _command(["curl", "--connect-timeout", "30", "--retry", "30", "--retry-delay", "2",
                     "-f", "-s", "-L", url], mode, bufsize, [141, 23],
                    ["curl", "-f", "-s", "-X", "PUT", "-L", "-T", "-", url], [141, 26])


def gopen_htgs(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read an ``htgs://`` URL as ``gs://`` with ``curl`` (read only)."""
    return _command(["curl", "-s", "-L", re.sub(r"(?i)^htgs://", "gs://", url)], mode, bufsize,
                    [141, 23])


def gopen_hf(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read an ``hf://`` URL (Hugging Face Hub) with ``curl`` and the Hub's token (needs
    ``huggingface_hub``; read only)."""
    if mode[0] != "r":
        return _command([], mode, bufsize, [])
    # not one of wds_cloud's extras: without it, the ImportError says what to install
    from huggingface_hub import (  # type: ignore[import-not-found]
        HfFileSystem,
        get_token,
        hf_hub_url,
    )

    resolved = HfFileSystem().resolve_path(url)
    http_url = hf_hub_url(repo_id=resolved.repo_id, filename=resolved.path_in_repo,
                          repo_type=resolved.repo_type, revision=resolved.revision)
    return _command(["curl", "--connect-timeout", "30", "--retry", "30", "--retry-delay", "2",
                     "-f", "-s", "-L", "-H", f"Authorization:Bearer {get_token()}", http_url],
                    mode, bufsize, [141, 23])


def gopen_gsutil(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read with ``gsutil cat``, write with ``gsutil cp -``."""
    return _command(["gsutil", "cat", url], mode, bufsize, [141, 23],
                    ["gsutil", "cp", "-", url], [141, 26])


def gopen_ais(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read with ``ais get URL -``, write with ``ais put - URL``."""
    return _command(["ais", "get", url, "-"], mode, bufsize, [141, 23],
                    ["ais", "put", "-", url], [141, 26])


def gopen_error(url: str, *args: Any, **kw: Any) -> Any:
    """Always raise ``ValueError``: no handler for ``url``."""
    raise ValueError(f"{url}: no gopen handler defined")
