"""Python's ``http.server`` on 127.0.0.1, a server that ignores ``Range`` (as many mirrors do):
the ``no_ranges`` fixture, for the tests of listings and of resumes against it."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that closes before the whole body is sent: what the tests are about


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def no_ranges(tmp_path: Path) -> Iterator[str]:
    """The base URL of ``http.server`` serving ``tmp_path``: whole files, Range ignored."""
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
