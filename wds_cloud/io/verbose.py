"""``GOPEN_VERBOSE``: webdataset's lines on stderr, one when a URL is opened and one when its
stream ends.

webdataset 1.0.2 prints (``print(..., file=sys.stderr)``):

- ``GOPEN <url> <info>`` at each ``gopen`` call, with the URL as given (before rewriting);
- ``GOPEN REWRITE <url> -> <rewritten>`` when a ``GOPEN_REWRITE`` rule applies (on stdout);
- ``pipe exit [<status> <pid>:<child pid>] ((<command>,), {'shell': True, 'bufsize': <n>})
  <info>`` when a read finds that the command of a stream it runs has exited (``pipe:``, and
  the curl, gsutil and ais commands it reads ``http(s)://``, ``gs://`` and ``ais://`` with).

``info`` is webdataset's module dict ``gopen.info`` (empty unless a user fills it, e.g. with the
node's name), printed as a dict; :data:`info` is its counterpart here.

:func:`watched` says the same for every URL a :class:`~wds_cloud.router.Router` opens, whichever
store serves it (local, ``pipe:``, s3, gs, az, http, ais, the shard cache), in the process and
thread that opens it (DataLoader workers, read-ahead threads):

- ``GOPEN <url> <info>``, as webdataset;
- ``GOPEN REWRITE <url> -> <rewritten>``, to stderr: stdout may carry data (``-o -``);
- a ``pipe:`` stream: webdataset's ``pipe exit`` line, once, when a read meets the end of the
  command's output or when the stream is closed (a command killed because its reader stopped
  early shows status -9);
- any other stream, when it is closed: ``closed [<n> bytes <pid>] <url> <info>`` (``n`` bytes
  read or written). Our stores run no command, so without it their streams' ends would go
  unsaid; it does not start with ``GOPEN``, so ``grep -c ^GOPEN`` counts the URLs opened, as
  with webdataset.

Every URL is shown :func:`~wds_cloud.urls.redact`-ed (signed query strings and credentials
hidden), also those inside a ``pipe:`` command.

The lines are records of this module's logger at INFO. The first stream :func:`watched` opens
in a process gives that logger a handler writing the bare message to the ``sys.stderr`` of the
moment, and stops the records propagating (a handler of the root logger would print each line
again, differently). Only the setting turns this on (``GOPEN_VERBOSE``,
``Settings.gopen_verbose``, read by the composition root): without it no stream is wrapped and
no handler added.

This module is layer-neutral: standard library only.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, cast

from ..urls import redact, redact_text, split_scheme

__all__ = ["VerboseStream", "info", "watched"]

log = logging.getLogger(__name__)

#: shown at the end of each line, as webdataset's ``gopen.info`` (a user may fill it)
info: dict[str, Any] = {}

_HANDLER_LOCK = threading.Lock()


class _Stderr(logging.StreamHandler):
    """Writes each record's bare message to ``sys.stderr`` as it is when the record comes (a
    redirection, pytest's capture), as ``print(..., file=sys.stderr)`` would."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the sys.stderr of the moment


def show_on_stderr() -> None:
    """Give this module's logger its stderr handler (once a process)."""
    with _HANDLER_LOCK:
        if any(isinstance(handler, _Stderr) for handler in log.handlers):
            return
        log.addHandler(_Stderr())
        log.setLevel(logging.INFO)
        log.propagate = False


def shown(url: str) -> str:
    """``url`` as the lines show it: redacted, and so are the URLs inside a ``pipe:`` command."""
    return redact_text(url) if split_scheme(url)[0] in ("", "pipe", "file") else redact(url)


def watched(url: str, open_stream: Callable[[], BinaryIO], *, rewrite: Callable[[], str],
            bufsize: int) -> BinaryIO:
    """The stream ``open_stream()`` opens for ``url``, saying so (see the module doc);
    ``rewrite()`` is the URL after the rewrite rules, ``bufsize`` what a ``pipe:`` line
    shows."""
    show_on_stderr()
    log.info("GOPEN %s %s", shown(url), info)
    target = rewrite()
    if target != url:
        log.info("GOPEN REWRITE %s -> %s", shown(url), shown(target))
    return cast(BinaryIO, VerboseStream(open_stream(), shown(url), bufsize=bufsize))


class VerboseStream:
    """``stream``, saying when it ends (see the module doc): once, when a ``pipe:`` command's
    exit is seen or the stream is closed.

    Everything else is ``stream``'s: its attributes (``local_path``, ``name``, ``fileno``,
    ``seek``, …) and, for ``isinstance``, its class, so code that tells streams apart by type
    behaves as without ``GOPEN_VERBOSE``. Dropped without ``close()``, a read stream is closed
    (as any io stream is); a write stream is left to its own finaliser (an atomic local file
    then removes its temporary file instead of publishing half a shard).
    """

    def __init__(self, stream: BinaryIO, shown_url: str, *, bufsize: int) -> None:
        self._stream: Any = stream  # BinaryIO declares neither read1 nor readinto
        self._url = shown_url
        self._bufsize = bufsize
        raw = getattr(stream, "raw", None)
        self._pipe = raw if hasattr(raw, "child_pid") else None  # a pipe: command's stream
        self._bytes = 0
        self._lock = threading.Lock()
        self._said = False

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._stream)

    def __getattr__(self, name: str) -> Any:
        stream = self.__dict__.get("_stream")
        if stream is None or name.startswith("__"):
            raise AttributeError(name)
        value = getattr(stream, name)
        if name == "abort" and callable(value):  # an atomic write given up: it ends too
            def abort() -> None:
                try:
                    value()
                finally:
                    self._say_end()
            return abort
        return value

    def __repr__(self) -> str:
        return f"<VerboseStream {self._stream!r}>"

    @property
    def closed(self) -> bool:
        return bool(self._stream.closed)

    def read(self, size: int | None = -1) -> bytes:
        return cast(bytes, self._reading(self._stream.read, size, size != 0))

    def read1(self, size: int = -1) -> bytes:
        return cast(bytes, self._reading(self._stream.read1, size, size != 0))

    def readinto(self, buffer: Any) -> int:
        return cast(int, self._reading(self._stream.readinto, buffer,
                                       len(memoryview(buffer)) > 0))

    def readinto1(self, buffer: Any) -> int:
        return cast(int, self._reading(self._stream.readinto1, buffer,
                                       len(memoryview(buffer)) > 0))

    def readline(self, size: int | None = -1) -> bytes:
        return cast(bytes, self._reading(self._stream.readline, size, size != 0))

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines, total = [], 0
        for line in self:
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def write(self, data: Any) -> int:
        n = self._stream.write(data)
        self._bytes += n if n is not None else len(memoryview(data).cast("B"))
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._say_end()

    def __enter__(self) -> VerboseStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self.__dict__.get("_said", True):
            return
        try:
            if self._stream.readable():
                self.close()
            else:
                self._say_end()
        except Exception:
            pass

    def _reading(self, method: Callable[[Any], Any], arg: Any, asked: bool) -> Any:
        """``method(arg)`` counted; a ``pipe:`` command's end said when the read meets it."""
        try:
            got = method(arg)
        except Exception:
            self._pipe_ended()  # e.g. the command failed: its exit line comes first
            raise
        n = got if isinstance(got, int) else len(got or b"")  # readinto: None if no data yet
        self._bytes += n
        if not n and asked:
            self._pipe_ended()
        return got

    def _pipe_ended(self) -> None:
        if self._pipe is not None and self._pipe.returncode is not None:
            self._say_end()

    def _say_end(self) -> None:
        with self._lock:
            if self._said:
                return
            self._said = True
        if self._pipe is None:
            log.info("closed [%d bytes %d] %s %s", self._bytes, os.getpid(), self._url, info)
            return
        args = ((redact_text(self._pipe.command),), {"shell": True, "bufsize": self._bufsize})
        log.info("pipe exit [%s %d:%d] %r %s", self._pipe.returncode, os.getpid(),
                 self._pipe.child_pid, args, info)
