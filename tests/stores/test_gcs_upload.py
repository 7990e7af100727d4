"""GCS resumable uploads against a small server of our own that keeps only part of a chunk, as
GCS may: the answer's ``Range`` says how far it got, and the rest of the chunk is sent again.

(fake-gcs-server always keeps whole chunks; the uploads against it, with faults, are in
test_cloudstores.py.)"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from wds_cloud.router import gopen
from wds_cloud.settings import Settings
from wds_cloud.stores import base as fsspecstore

KiB = 2**10
PART = 256 * KiB  # GCS's chunk granularity
DATA = random.Random(3).randbytes(600 * KiB)


class _Session(BaseHTTPRequestHandler):
    """One resumable upload session: the first chunk is kept only up to its middle."""

    kept: ClassVar[bytearray] = bytearray()
    ranges: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "upload_id=" not in self.path:  # starting: the session URL
            host, port = self.server.server_address[:2]
            self._answer(200, Location=f"http://{host}:{port}{self.path}&upload_id=u1")
            return
        content_range = self.headers["Content-Range"]
        self.ranges.append(content_range)
        first, _, size = map(int, re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)",
                                               content_range).groups())
        assert first == len(self.kept), (first, len(self.kept))
        self.kept += body[: PART // 2] if len(self.ranges) == 1 else body
        if len(self.kept) == size:
            self._answer(200)
        else:
            self._answer(308, Range=f"bytes=0-{len(self.kept) - 1}")

    def do_DELETE(self) -> None:
        self._answer(499)

    def _answer(self, status: int, **headers: str) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": "0"}.items():
            self.send_header(name, value)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def session_server() -> Iterator[str]:
    _Session.kept, _Session.ranges = bytearray(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Session)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_chunk_kept_in_part_is_sent_again_from_where_the_server_stopped(
        session_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsspecstore, "_PART", PART)
    options = {"gs": {"endpoint_url": session_server, "token": "anon", "project": "p",
                      "skip_instance_cache": True}}
    with gopen("gs://bkt/k.tar", "wb", settings=Settings(retries=0),
               storage_options=options) as f:
        f.write(DATA)
    assert bytes(_Session.kept) == DATA
    size = len(DATA)
    assert _Session.ranges == [f"bytes 0-{PART - 1}/{size}",
                               f"bytes {PART // 2}-{PART - 1}/{size}",
                               f"bytes {PART}-{2 * PART - 1}/{size}",
                               f"bytes {2 * PART}-{size - 1}/{size}"]
