"""A GET signed by a store's own client and sent by the thread that reads it (:mod:`http.client`).

fsspec's stores receive every byte on one event loop thread per process (aiohttp): there each
piece of a body costs a loop iteration, a parser copy, a hand-off to the reading thread and a
copy there: about twice the CPU per GB of ``curl`` on the same object. :func:`send` instead
sends a request that the store's client has built and signed (so its endpoint, addressing,
credentials and headers are the client's own) from the calling thread; the body is then read
as ``curl`` reads it: one copy from the kernel, straight into the caller's buffer
(:meth:`DirectBody.readinto`) or into the ``bytes`` returned (:meth:`DirectBody.read`), with the
GIL released while the thread waits.

What the store's client does beyond that (proxies, client certificates, redirects, checking
checksums) is not done here: a store uses this path only where none of it applies, and judges
the answer itself (or hands it back to its client). TLS is verified with the context the store
gives (:func:`botocore_tls` for S3; by default, Python's default context with the system's CA
certificates, as aiohttp's).

A connection whose answer was read to its end (and that the server keeps open) carries the next
request to the same server, as aiohttp's pool and ``curl`` do: many small objects over TLS then
pay one handshake, not one each. Idle connections are kept per process, a few per server, for
a few seconds; one the server closed meanwhile is dropped, and a request it could not carry is
sent again on a new connection. A body closed within :data:`_DRAIN` bytes of its end is read
out first, so that its connection is kept too (a tar reader stops at the end-of-archive blocks,
before the archive's padding); one closed farther from its end closes its connection.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

from ..urls import redact
from .retry import RetryableError, reason

__all__ = ["DirectBody", "botocore_tls", "default_tls", "send"]

_ERROR_TEXT = 64 * 1024  # of an error's body, enough for its XML
_SLICE = 1 << 20  # the most a failure loses of what has arrived (see DirectBody)
_IDLE_MAX = 8  # idle connections kept per server
_IDLE_SECONDS = 10.0  # kept idle at most this long (servers close theirs after 5 s to minutes)
#: an answer closed this close to its end is read out, its connection kept (the padding after a
#: tar archive's end: under 10 KiB in the 10,240-byte records of tarfile and GNU tar)
_DRAIN = 64 * 1024
_DRAIN_WAIT = 0.5  # seconds the rest may take to come; else the connection is closed

#: a server as connections to it are kept: scheme, host, port, the TLS context (None: http)
Server = tuple[str, str, int | None, ssl.SSLContext | None]


class _Idle:
    """The idle connections of one process (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[Server, list[tuple[http.client.HTTPConnection, float]]] = {}

    def take(self, server: Server) -> http.client.HTTPConnection | None:
        """An idle connection to ``server`` that is still open, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                kept = self._conns.get(server)
                if not kept:
                    return None
                conn, since = kept.pop()
            if now - since < _IDLE_SECONDS and _still_open(conn):
                return conn
            conn.close()

    def give(self, server: Server, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            kept = self._conns.setdefault(server, [])
            if len(kept) < _IDLE_MAX:
                kept.append((conn, time.monotonic()))
                return
        conn.close()

    def drop(self) -> None:
        """Close, in a forked child, its copies of its parent's idle connections (the parent's
        stay open). Takes no lock, which a thread that does not exist in the child may
        hold."""
        conns, self._conns = self._conns, {}
        for kept in conns.values():
            for conn, _ in kept:
                conn.close()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection is still usable: nothing to read on it (a server that
    closed it has sent its end, which reads as readable)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        return not select.select([sock], [], [], 0)[0]
    except (OSError, ValueError):  # closed under us
        return False


_idle_by_pid: dict[int, _Idle] = {}


def _idle() -> _Idle:
    """This process's idle connections. A forked child starts with none and closes its
    copies of its parent's as it starts, so that a connection the parent closes is closed
    (a DataLoader worker would otherwise keep it open as long as it lives, and its exit
    would leave them to the garbage collector: a ResourceWarning each)."""
    pid = os.getpid()
    idle = _idle_by_pid.get(pid)
    if idle is None:
        new = _Idle()
        idle = _idle_by_pid.setdefault(pid, new)  # atomic: no lock a fork could hold
        if idle is new:
            os.register_at_fork(after_in_child=new.drop)
    return idle


@functools.cache
def default_tls() -> ssl.SSLContext:
    """Python's default client context (the system's CA certificates, ``SSL_CERT_FILE``):
    aiohttp's own default (cached: loading the certificates takes milliseconds)."""
    return ssl.create_default_context()


@functools.cache
def botocore_tls(verify: bool | str) -> ssl.SSLContext:
    """The TLS context botocore's HTTP sessions make for ``verify`` (a CA bundle's path,
    ``True`` for botocore's default bundle, ``False`` for none; cached)."""
    from botocore.httpsession import create_urllib3_context, get_cert_path

    context = create_urllib3_context()
    if verify:
        context.check_hostname = True
        context.load_verify_locations(get_cert_path(verify))
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class DirectBody:
    """The body of a response being read on the calling thread: a
    :class:`~wds_cloud.stores.streams.Body`, with the answer's ``status`` and ``headers``.

    Reads are filled in slices of up to 1 MiB, each by one call into C (the kernel copies
    straight into the caller's buffer, or into the ``bytes`` returned). When the connection
    fails, the slices filled are handed over and the next call raises the failure; what the
    slice in progress had received is lost, so the stream resumes up to 1 MiB before where
    the connection stopped. A ``careful`` body (for a transfer resumed after a failure, in
    case connections fail more often than that) hands over what each receive brings instead,
    so that a failure loses nothing: one receive, one piece, joined (a third more CPU here).
    """

    def __init__(self, conn: http.client.HTTPConnection, sock: socket.socket,
                 resp: http.client.HTTPResponse, url: str, *, careful: bool = False,
                 server: Server | None = None) -> None:
        self._conn, self._sock, self._resp, self._url = conn, sock, resp, url
        self._server = server
        self._pid = os.getpid()
        self._careful = careful
        self._reading = threading.Lock()  # held by a read: close then must not drain
        self._failure: BaseException | None = None
        self.status: int = resp.status
        self.headers: http.client.HTTPMessage = resp.headers

    def read(self, size: int) -> bytes:
        parts: list[bytes] = []

        def step(wanted: int) -> int:
            resp = self._resp
            part = resp.read1(wanted) if self._careful else resp.read(min(wanted, _SLICE))
            if part:
                parts.append(part)
            return len(part)

        self._steps(size, step)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, buffer: memoryview) -> int:
        view, filled = memoryview(buffer), 0

        def step(wanted: int) -> int:
            nonlocal filled
            if self._careful:
                part = self._resp.read1(wanted)
                view[filled:filled + len(part)] = part
                n = len(part)
            else:
                n = self._resp.readinto(view[filled:filled + min(wanted, _SLICE)])
            filled += n
            return n

        return self._steps(len(view), step)

    def _steps(self, size: int, step: Callable[[int], int]) -> int:
        """``step(wanted)`` (the bytes it got, 0 at the end of the body) until ``size`` bytes
        came, the body ended, or the connection failed: the bytes got before a failure are
        handed over, and the failure is raised by the next call."""
        got = 0
        try:
            with self._reading:
                while got < size and self._failure is None:
                    n = step(size - got)
                    if not n:
                        break
                    got += n
        except (OSError, http.client.HTTPException) as exc:
            self._failure = exc
        if self._failure is not None and not got:
            raise RetryableError(f"connection failed while reading {redact(self._url)}: "
                                 f"{reason(self._failure)}") from self._failure
        return got

    def _drain(self) -> None:
        """Read the rest of an answer closed within :data:`_DRAIN` bytes of its end, waiting
        at most :data:`_DRAIN_WAIT` for it (the next request sets the timeout again)."""
        resp = self._resp
        if resp.length is None or resp.length > _DRAIN:
            return
        try:
            self._sock.settimeout(_DRAIN_WAIT)
            while resp.length and resp.read(resp.length):
                pass
        except (OSError, http.client.HTTPException) as exc:
            self._failure = exc

    def error_text(self) -> str:
        """The start of an error answer's body (an S3 ``<Error>`` document), or ``""``."""
        try:
            return self._resp.read(_ERROR_TEXT).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            return ""

    def close(self) -> None:
        """Keep the connection for the next request when the answer was read to its end (or
        is read out now: see :data:`_DRAIN`) and the server keeps it open; else close it: a
        read blocked on it in another thread returns at once (closing the response alone
        would wait for that read, up to the timeout). A forked child closes only its own
        descriptor: the connection is still its parent's."""
        resp, server = self._resp, self._server
        mine = os.getpid() == self._pid
        if mine and server is not None and not resp.will_close:
            if (not resp.isclosed() and self._failure is None
                    and self._reading.acquire(blocking=False)):  # else another thread reads
                try:
                    self._drain()
                finally:
                    self._reading.release()
            if self._failure is None and resp.isclosed() and self._conn.sock is self._sock:
                _idle().give(server, self._conn)
                self._server = None
                return
        if mine:
            with contextlib.suppress(OSError):  # already shut down, or reset by the peer
                self._sock.shutdown(socket.SHUT_RDWR)
        self._resp.close()
        self._conn.close()


def send(method: str, url: str, headers: Mapping[str, Any], *, timeout: float,
         tls: ssl.SSLContext | None = None, careful: bool = False) -> DirectBody:
    """Send the request on a new connection and return its answer, whatever its status, with
    the body unread (``careful``: see :class:`DirectBody`). ``timeout`` bounds connecting and
    each wait for data; ``tls`` verifies an ``https`` server (default: :func:`default_tls`).
    Raises :class:`~wds_cloud.stores.retry.RetryableError` when no answer comes."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "") or "/"
    context = (tls or default_tls()) if parts.scheme == "https" else None
    server: Server = (parts.scheme, parts.hostname or "", parts.port, context)
    kept = _idle().take(server)
    if kept is not None:
        try:
            return _ask(kept, method, target, headers, timeout, url, careful, server)
        except ConnectionError:  # the server closed it meanwhile: a new connection
            kept.close()
        except (OSError, http.client.HTTPException) as exc:
            kept.close()
            raise _no_answer(url, exc) from exc
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout,
                                           context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.connect()
        return _ask(conn, method, target, headers, timeout, url, careful, server)
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise _no_answer(url, exc) from exc


def _no_answer(url: str, exc: BaseException) -> RetryableError:
    said = reason(exc)
    address = urlsplit(url).netloc.rpartition("@")[2]
    said = said if address in said else f"{said} ({address})"
    return RetryableError(f"no answer from {redact(url)}: {said}", reason=said)


def _ask(conn: http.client.HTTPConnection, method: str, target: str,
         headers: Mapping[str, Any], timeout: float, url: str, careful: bool,
         server: Server) -> DirectBody:
    """Send the request on the open connection ``conn``; its answer."""
    sock = cast(socket.socket, conn.sock)  # kept: the connection drops it on "will close"
    sock.settimeout(timeout)
    conn.request(method, target, headers=dict(headers))
    resp = conn.getresponse()
    return DirectBody(conn, sock, resp, url, careful=careful, server=server)
