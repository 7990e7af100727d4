"""``pipe:CMD``: a shell command's stdout (reading) or stdin (writing) as a shard stream.

The command's exit status is checked when its output ends: a command that fails raises
:class:`~wds_cloud.errors.PipeError` with the tail of its stderr instead of delivering a silently
short shard. Closing a read stream before the end kills the command.
"""

from __future__ import annotations

import io
import subprocess
import threading
from collections import deque
from typing import Any, BinaryIO, cast

from ..errors import ConfigError, PipeError
from ..urls import split_scheme

__all__ = ["PipeOpener"]


class _PipeStream(io.RawIOBase):
    """The stdout (or stdin) of a ``pipe:`` command; checks its exit status at end of stream.

    A command that exits non-zero raises :class:`PipeError` with the tail of its stderr instead
    of delivering a silently short shard. Closing before the end kills the command.
    """

    _STDERR_TAIL = 4096

    def __init__(self, proc: subprocess.Popen[bytes], url: str, command: str, mode: str) -> None:
        self._proc = proc
        self._url = url
        self._command = command
        self._writing = "w" in mode
        self._pipe = cast(BinaryIO, proc.stdin if self._writing else proc.stdout)
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._stderr_thread = threading.Thread(
            target=self._drain_stderr, name="wds-pipe-stderr", daemon=True
        )
        self._stderr_thread.start()
        self._checked = False

    def _drain_stderr(self) -> None:
        stderr = self._proc.stderr
        while stderr is not None and (chunk := stderr.read(4096)):
            self._tail.append(chunk)
            self._tail_size += len(chunk)
            while self._tail_size - len(self._tail[0]) >= self._STDERR_TAIL:
                self._tail_size -= len(self._tail.popleft())

    @property
    def command(self) -> str:
        """The shell command."""
        return self._command

    @property
    def child_pid(self) -> int:
        """The process id of the shell running the command."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The command's exit status once it has exited (negative: killed by that signal)."""
        return self._proc.poll()

    def readable(self) -> bool:
        return not self._writing

    def writable(self) -> bool:
        return self._writing

    def readinto(self, buffer: Any) -> int:
        n: int = self._pipe.readinto(buffer)  # type: ignore[attr-defined]
        if n == 0 and len(memoryview(buffer)) > 0:
            self._check_exit()
        return n

    def write(self, data: Any) -> int:
        try:
            return self._pipe.write(data)
        except BrokenPipeError as exc:
            self._check_exit()
            raise PipeError(
                f"pipe command stopped reading: {self._command!r}", url=self._url,
                command=self._command,
            ) from exc

    def _check_exit(self) -> None:
        if self._checked:
            return
        self._checked = True
        returncode = self._proc.wait()
        self._stderr_thread.join(timeout=5)
        if returncode != 0:
            tail = b"".join(self._tail).decode("utf-8", "replace")[-self._STDERR_TAIL:]
            raise PipeError(
                f"pipe command exited with status {returncode}: {self._command!r}"
                + (f"; stderr ends with: {tail.strip()}" if tail.strip() else ""),
                url=self._url, command=self._command, returncode=returncode, stderr=tail,
            )

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._writing:
                self._pipe.close()
                self._check_exit()
            elif not self._checked:
                # the reader stopped early: the command's fate is no longer our business
                self._checked = True
                self._proc.kill()
                self._pipe.close()
                self._proc.wait()
        finally:
            super().close()


class PipeOpener:
    """``pipe:CMD``: run ``CMD`` in a shell and read its stdout (or write its stdin)."""

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        bufsize = options.pop("bufsize", io.DEFAULT_BUFFER_SIZE)
        if options:
            raise ConfigError(f"options {sorted(options)} are not used by pipe: URLs ({url!r})")
        command = split_scheme(url)[1]
        writing = "w" in mode
        try:
            proc = subprocess.Popen(
                command, shell=True, bufsize=0,
                stdin=subprocess.PIPE if writing else subprocess.DEVNULL,
                stdout=None if writing else subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise PipeError(f"cannot start pipe command {command!r}: {exc}", url=url,
                            command=command) from exc
        raw = _PipeStream(proc, url, command, mode)
        size = bufsize if bufsize and bufsize > 0 else io.DEFAULT_BUFFER_SIZE
        buffered = io.BufferedWriter(raw, size) if writing else io.BufferedReader(raw, size)
        return cast(BinaryIO, buffered)
