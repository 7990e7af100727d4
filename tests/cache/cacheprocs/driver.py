"""Drives tests/cache/cacheprocs/child.py from a test, line by line over its stdin and stdout.

``Children(tmp)`` makes the children of one test (``spawn(mode, cache, urls, ...)``; their
argument files and stderr go to ``tmp``) and kills every one left when it is closed; each
child also gets SIGKILL if the test process dies. A :class:`Child`'s stdout lines are collected
by a thread; ``expect`` waits for one (``WAIT`` seconds at most, then the test fails with the
child's last lines and its stderr), ``send`` writes one, ``finish`` waits for the exit.
``release`` and ``let_go`` are the two ends of a run: the children's ``ready`` and ``done``
(see child.py).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from stores.procs import child_env

__all__ = ["CHILD", "WAIT", "Child", "Children", "Spawn", "let_go", "release"]

CHILD = Path(__file__).with_name("child.py")
WAIT = 60.0  # seconds any awaited condition may take on a loaded machine before the test fails


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Child:
    """One child process; its stdout lines are collected by a thread (all of them in
    ``lines``, the ones not yet expected in a queue)."""

    def __init__(self, argv: list[str], *, env: dict[str, str], stderr: Path) -> None:
        self.stderr_path = stderr
        self.mode = argv[2]
        with open(stderr, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                text=True, bufsize=1, preexec_fn=_die_with_parent)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def _fail(self, why: str) -> None:
        pytest.fail(f"child {self.mode} (pid {self.proc.pid}) {why}; stdout "
                    f"{self.lines[-5:]}; stderr tail:\n{self.stderr()[-3000:]}", pytrace=False)

    def expect(self, prefix: str, timeout: float = WAIT) -> str:
        """The next stdout line starting with ``prefix`` (earlier lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"did not print {prefix!r} within {timeout:g} s")
            if line is None:
                self._queue.put(None)
                self._fail(f"exited ({self.proc.wait()}) before printing {prefix!r}")
            elif line.startswith(prefix):
                return line

    def send(self, line: str = "go") -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def finish(self, timeout: float = WAIT) -> int:
        """Wait for the child to exit; its exit status (all its stdout is in ``lines``)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"did not exit within {timeout:g} s")
        self._reader.join(timeout)
        return code

    def kill(self) -> int:
        """SIGKILL (a no-op if it has exited), and reap it: its locks are free afterwards."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.finish()

    def stop(self) -> None:
        """Kill the child if it lives, reap it and close its pipes (at the end of a test)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


Spawn = Callable[..., Child]


class Children:
    """The children of one test: their files go to ``tmp``; closing stops every one."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.children: list[Child] = []

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in self.children:
            child.stop()

    def spawn(self, mode: str, cache: Path, urls: list[str], *,
              expect: dict[str, str] | None = None, first: int = 0,
              verbose: bool = True) -> Child:
        """A child.py ``mode`` process reading ``urls`` through ``cache``; ``expect`` is
        ``{url: sha256}`` (mode ``shards``), ``first`` the bytes to read first (mode ``hold``),
        ``verbose`` whether the cache's lines go to its stderr (``WDS_VERBOSE_CACHE``)."""
        n = len(self.children)
        urls_file = self.tmp / f"urls-{n}.json"
        urls_file.write_text(json.dumps(urls))
        argv = [sys.executable, str(CHILD), mode, "--cache", str(cache), "--urls", str(urls_file),
                "--first", str(first)]
        if expect is not None:
            expect_file = self.tmp / f"expect-{n}.json"
            expect_file.write_text(json.dumps(expect))
            argv += ["--expect", str(expect_file)]
        env = child_env({"WDS_VERBOSE_CACHE": "1" if verbose else "0"})
        self.children.append(Child(argv, env=env, stderr=self.tmp / f"child-{n}.err"))
        return self.children[-1]


def release(*children: Child) -> None:
    """Wait until every child printed ``ready``, then let them all start."""
    for child in children:
        child.expect("ready")  # imported and built what it reads; now waits on stdin
    for child in children:
        child.send()


def let_go(*children: Child) -> None:
    """Tell children that wait for a last line to exit; each must exit with status 0."""
    for child in children:
        child.send("exit")
    for child in children:
        assert child.finish() == 0, child.stderr()[-3000:]
