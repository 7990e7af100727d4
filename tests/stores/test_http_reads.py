"""How ``http(s)://`` reads are sent: by the reading thread (wds_cloud.stores.direct) where the
options ask for nothing but headers, by aiohttp where they ask for more; the headers asked for
are sent, redirects are followed without carrying credentials to another host, and TLS is
verified with the system's certificates.

(What every opener must do, this one included, is in test_contract.py; faults, resumes and
AIStore's redirects in test_faults.py and test_cloudstores.py, which now go through this path.)
"""

from __future__ import annotations

import base64
import http.server
import random
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stores import Store
from stores.tls import self_signed
from wds_cloud.errors import WdsCloudError
from wds_cloud.router import gopen
from wds_cloud.settings import Settings
from wds_cloud.stores.aio import AsyncBody
from wds_cloud.stores.direct import _DRAIN, _DRAIN_WAIT, DirectBody, default_tls
from wds_cloud.stores.http import _filesystem, _sendable

FAST = Settings(retries=1, retry_backoff=0.01, retry_backoff_max=0.02)
DATA = random.Random(4).randbytes(3 * 2**20 + 7)


@pytest.fixture
def web(store_factory: Callable[[str], Store]) -> Store:
    return store_factory("http").holding("data.bin", DATA)


def _own_client(**kwargs: Any) -> Any:
    return aiohttp.ClientSession(**kwargs)


@pytest.mark.parametrize(("options", "direct"), [
    ({}, True),
    ({"headers": {"X-Trace": "1"}}, True),
    ({"client_kwargs": {"headers": {"X-Trace": "1"}}}, True),
    ({"client_kwargs": {"trust_env": True}}, False),  # proxies from the environment
    ({"client_kwargs": {"cookies": {"session": "1"}}}, False),
    ({"params": {"token": "1"}}, False),
    ({"ssl": False}, False),
    ({"get_client": _own_client}, False),
])
def test_aiohttp_sends_what_only_it_can(options: dict[str, Any], direct: bool) -> None:
    assert _sendable(_filesystem({**options, "skip_instance_cache": True})) == direct


def test_options_only_aiohttp_honours_still_work(web: Store) -> None:
    options = {"http": {"client_kwargs": {"trust_env": True}, "skip_instance_cache": True}}
    with gopen(web.url("data.bin"), "rb", settings=FAST, storage_options=options) as stream:
        assert isinstance(stream._body, AsyncBody)
        assert stream.read() == DATA


def test_credentials_in_the_url_go_as_basic_auth(recorders: tuple[_Recorder, _Recorder]) -> None:
    first, _ = recorders
    url = first.base.replace("http://", "http://reader:pw@") + "/data.bin"
    with gopen(url, "rb", settings=FAST) as stream:
        assert isinstance(stream._body, AsyncBody)  # aiohttp turns them into basic auth
        assert stream.read() == DATA
    (_, headers), = first.seen
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"reader:pw").decode()


# -- a server that tells what it was sent --------------------------------------------------------

class _Recorder(http.server.ThreadingHTTPServer):
    """Serves DATA at ``/data.bin`` (ranges, an ETag) and redirects ``/to/<url>`` to ``<url>``
    (and ``/space`` to a Location with a space in it); records each request's path and
    headers."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, Message]] = []  # (path, headers: case-insensitive)
        self.ports: list[int] = []  # the client's port of each request: its connection
        self.closed: list[int] = []  # the client's port of each connection that has ended
        self.drop = ""  # "after": close each connection after an answer, without saying so;
        # "second": close a connection asked a second request, without answering it
        self.late = (0, 0.0)  # the last (bytes) of each answer come after (seconds)

    def ended(self, port: int, timeout: float = 10.0) -> bool:
        """Whether the connection from the client's ``port`` ends within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while port not in self.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        return port in self.closed

    @property
    def base(self) -> str:
        scheme = "https" if isinstance(self.socket, ssl.SSLSocket) else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Recorder
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client went away in the middle of an answer
            pass
        finally:
            self.server.closed.append(self.client_address[1])

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers))
        port = self.client_address[1]
        if self.server.drop == "second" and port in self.server.ports:
            self.server.ports.append(port)
            self.close_connection = True
            return
        self.server.ports.append(port)
        if self.server.drop == "after":
            self.close_connection = True
        if self.path == "/space":  # a Location as some servers send it: not encoded
            self.send_response(302)
            self.send_header("Location", "/data.bin?x=1 2")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/to/"):
            self.send_response(307)
            self.send_header("Location", self.path[len("/to/"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = int(self.headers.get("Range", "bytes=0-")[len("bytes="):].rstrip("-"))
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
        self.send_header("Content-Length", str(len(DATA) - start))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        late, pause = self.server.late
        self.wfile.write(DATA[start:len(DATA) - late])
        if late:
            self.wfile.flush()
            time.sleep(pause)
            self.wfile.write(DATA[len(DATA) - late:])

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serving(server: _Recorder) -> Iterator[_Recorder]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def recorders() -> Iterator[tuple[_Recorder, _Recorder]]:
    first, second = _Recorder(), _Recorder()
    gens = [_serving(first), _serving(second)]
    for gen in gens:
        next(gen)
    yield first, second
    for gen in gens:
        next(gen, None)


def test_headers_are_sent_and_credentials_stay_with_their_host(
        recorders: tuple[_Recorder, _Recorder]) -> None:
    first, second = recorders
    options = {"http": {"headers": {"Authorization": "Bearer s3cret", "X-Trace": "7",
                                    "user-agent": "trainer/1", "accept-encoding": "gzip"},
                        "client_kwargs": {"headers": {"X-Team": "data"}}}}
    for target, keeps in ((f"{first.base}/data.bin", True), (f"{second.base}/data.bin", False)):
        first.seen.clear()
        second.seen.clear()
        with gopen(f"{first.base}/to/{target}", "rb", settings=FAST,
                   storage_options=options) as stream:
            assert isinstance(stream._body, DirectBody)
            assert stream.read() == DATA
        (_, asked), = first.seen[:1]
        assert asked["Authorization"] == "Bearer s3cret" and asked["X-Team"] == "data"
        (_, got), = (first.seen[1:] if keeps else second.seen)
        assert got["X-Trace"] == "7" and got["X-Team"] == "data"
        assert got.get("Accept-Encoding") == "identity"  # the bytes as stored, always
        assert got.get_all("User-Agent") == ["trainer/1"]  # the options' own, once
        assert ("Authorization" in got) == keeps


def test_a_resumed_read_asks_for_the_same_version(recorders: tuple[_Recorder, _Recorder]) -> None:
    first, _ = recorders
    with gopen(f"{first.base}/data.bin", "rb", settings=FAST, offset=1000) as stream:
        assert stream.read() == DATA[1000:]
    (_, headers), = first.seen
    assert headers["Range"] == "bytes=1000-"
    assert headers["User-Agent"].startswith("Python/")  # aiohttp's, as before


def test_a_location_with_a_space_is_encoded(recorders: tuple[_Recorder, _Recorder]) -> None:
    first, _ = recorders
    with gopen(f"{first.base}/space", "rb", settings=FAST) as stream:
        assert stream.read() == DATA
    # encoded as aiohttp encodes it (yarl: a space in a query is "+")
    assert [path for path, _ in first.seen] == ["/space", "/data.bin?x=1+2"]


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[_Recorder, Path]]:
    """A recorder serving over TLS with a self-signed certificate, and that certificate."""
    cert, key = self_signed(tmp_path)
    server = _Recorder()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    serving = _serving(server)
    next(serving)
    yield server, cert
    next(serving, None)


def test_tls_is_verified_with_the_system_certificates(
        tls_server: tuple[_Recorder, Path]) -> None:
    server, cert = tls_server
    url = f"{server.base}/data.bin"
    with pytest.raises(WdsCloudError, match="certificate verify failed") as info:
        gopen(url, "rb", settings=FAST)
    assert "127.0.0.1" in str(info.value)
    trusting = ssl.create_default_context(cafile=str(cert))  # aiohttp's ``ssl=`` option
    with gopen(url, "rb", settings=FAST, storage_options={"https": {"ssl": trusting}}) as s:
        assert isinstance(s._body, AsyncBody) and s.read() == DATA


# -- connections kept for the next request ---------------------------------------------------------

def _read_whole(url: str, n: int = -1) -> bytes:
    with gopen(url, "rb", settings=FAST) as stream:
        assert isinstance(stream._body, DirectBody)
        return stream.read(n)


def test_objects_read_to_their_end_share_one_connection(
        recorders: tuple[_Recorder, _Recorder]) -> None:
    first, _ = recorders
    for _ in range(4):
        assert _read_whole(f"{first.base}/data.bin") == DATA
    assert len(first.ports) == 4 and len(set(first.ports)) == 1
    assert _read_whole(f"{first.base}/data.bin", 10) == DATA[:10]  # left before its end:
    assert _read_whole(f"{first.base}/data.bin") == DATA  # that connection was closed
    assert len(set(first.ports)) == 2 and first.ports[-1] != first.ports[0]


def test_tls_connections_are_kept_too(tls_server: tuple[_Recorder, Path],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    server, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    default_tls.cache_clear()  # loaded again with the test's authority
    try:
        for _ in range(3):
            assert _read_whole(f"{server.base}/data.bin") == DATA
        assert len(server.ports) == 3 and len(set(server.ports)) == 1  # one handshake
    finally:
        default_tls.cache_clear()


@pytest.mark.parametrize(("left", "kept"), [(1, True), (10_240, True), (_DRAIN, True),
                                            (_DRAIN + 1, False)])
def test_an_answer_closed_near_its_end_is_read_out_and_its_connection_kept(
        recorders: tuple[_Recorder, _Recorder], left: int, kept: bool) -> None:
    """A tar reader stops at the end-of-archive blocks, before the archive's padding: an
    answer closed within ``_DRAIN`` bytes of its end is read out and its connection carries
    the next request; one closed farther from its end closes its connection."""
    first, _ = recorders
    assert _read_whole(f"{first.base}/data.bin", len(DATA) - left) == DATA[:-left]
    assert _read_whole(f"{first.base}/data.bin") == DATA
    assert len(first.ports) == 2 and (first.ports[0] == first.ports[1]) == kept


def test_a_rest_that_does_not_come_closes_the_connection(
        recorders: tuple[_Recorder, _Recorder]) -> None:
    """The rest of an answer closed near its end is waited for at most ``_DRAIN_WAIT``
    seconds: then the close returns, the connection is closed, the next read gets a new
    one and the whole object."""
    first, _ = recorders
    first.late = (1000, 3.0)
    stream = gopen(f"{first.base}/data.bin", "rb", settings=FAST)
    assert stream.read(len(DATA) - 1000) == DATA[:-1000]
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < _DRAIN_WAIT + 1.0 < 3.0
    first.late = (0, 0.0)
    assert _read_whole(f"{first.base}/data.bin") == DATA
    assert len(first.ports) == 2 and first.ports[0] != first.ports[1]
    assert first.ended(first.ports[0])


@pytest.mark.parametrize("drop", ["after", "second"])
def test_a_connection_the_server_closed_is_replaced(
        recorders: tuple[_Recorder, _Recorder], drop: str) -> None:
    """The server closes a kept connection (after its answer, or when asked again, as an
    idle timeout does): every read still gets the whole object, on a new connection."""
    first, _ = recorders
    first.drop = drop
    for _ in range(3):
        assert _read_whole(f"{first.base}/data.bin") == DATA
    answered = [p for i, p in enumerate(first.ports) if p not in first.ports[:i]]
    assert len(answered) == 3  # each answer came on a connection of its own
    if drop == "second":  # the requests the kept connections could not carry were sent again
        assert len(first.ports) == 5 and len(first.seen) == 5


_FORKED = """\
import os, sys
from wds_cloud.router import gopen

def read(url):
    with gopen(url, "rb") as stream:
        return len(stream.read())

url = sys.argv[1]
print("parent", read(url), flush=True)
pid = os.fork()
if pid == 0:
    print("child", read(url), flush=True)
    sys.exit(0)
assert os.waitpid(pid, 0)[1] == 0
print("parent", read(url), flush=True)
"""


def test_a_forked_child_leaves_its_parents_connections_to_it(
        recorders: tuple[_Recorder, _Recorder]) -> None:
    """A process keeps a connection, forks, and both read again: the parent goes on with its
    kept connection, the child opens its own, and the child leaves none of its parent's to
    the garbage collector (``-X dev`` prints a ResourceWarning for each): it closed its
    copies as it started."""
    first, _ = recorders
    ran = subprocess.run([sys.executable, "-X", "dev", "-c", _FORKED, f"{first.base}/data.bin"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n") == [f"parent {len(DATA)}", f"child {len(DATA)}",
                                      f"parent {len(DATA)}", ""]
    assert "ResourceWarning" not in ran.stderr, ran.stderr
    parent, child, again = first.ports
    assert again == parent != child


_WORKER = """\
import os, sys
from wds_cloud.router import gopen

url = sys.argv[1]
with gopen(url, "rb") as stream:
    stream.read()  # its connection is kept
wait, go = os.pipe()
pid = os.fork()
if pid == 0:  # a worker that lives on, asking the store for nothing
    os.read(wait, 1)
    os._exit(0)
from wds_cloud.stores import direct
direct._IDLE_SECONDS = 0.0  # the kept connection has been idle too long: closed at the next GET
with gopen(url, "rb") as stream:
    stream.read()
print("closed", flush=True)
sys.stdin.readline()
os.write(go, b"x")
assert os.waitpid(pid, 0)[1] == 0
"""


def test_a_connection_closed_by_the_parent_is_closed_while_a_forked_child_lives(
        recorders: tuple[_Recorder, _Recorder]) -> None:
    """A forked child (a DataLoader worker) does not keep its parent's connections open: a
    kept one the parent closes (idle too long) ends at once, not when the child exits."""
    first, _ = recorders
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, f"{first.base}/data.bin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "closed\n"
        assert first.ended(first.ports[0]), "the child keeps the parent's connection open"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
