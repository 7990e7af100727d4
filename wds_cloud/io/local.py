"""Local paths, ``file:`` URLs and ``-`` (standard input and output) as shard streams.

Read streams of local files carry ``local_path``. Writes go to a temporary name beside the
target and are renamed into place when closed, so a reader never sees half a shard.
"""

from __future__ import annotations

import contextlib
import glob as globmod
import io
import os
import secrets
import sys
from typing import Any, BinaryIO, cast

from ..errors import AccessDeniedError, ConfigError, OpenError, ShardNotFoundError
from ..urls import file_url_path, split_scheme

__all__ = ["LocalOpener", "StdioOpener"]

class LocalOpener:
    """Local paths and ``file:`` URLs; read streams carry ``local_path``.

    A regular file is written under a temporary name in its directory and renamed into place
    when closed, so a reader never sees half a shard; ``abort()`` on the stream removes it.
    """

    #: ``open(url, "rb", offset=n)`` starts at byte n (a seek)
    ranged = True

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        scheme, rest = split_scheme(url)
        path = file_url_path(rest) if scheme else url
        bufsize = options.pop("bufsize", -1)
        offset = int(options.pop("offset", 0) or 0)
        if options:
            raise ConfigError(f"options {sorted(options)} are not used when opening local {url!r}")
        writing = "w" in mode
        try:
            if writing and (not os.path.exists(path) or os.path.isfile(path)):
                return cast(BinaryIO, _AtomicFile(path, bufsize))
            stream = open(path, mode, buffering=bufsize)  # noqa: SIM115 (the caller closes it)
        except FileNotFoundError as exc:
            if writing:
                raise OpenError(f"cannot create {path!r}: its directory does not exist",
                                url=url) from exc
            raise ShardNotFoundError(f"no such file: {path!r}", url=url) from exc
        except PermissionError as exc:
            doing = "writing" if writing else "reading"
            raise AccessDeniedError(f"permission denied {doing} {path!r}", url=url) from exc
        except IsADirectoryError as exc:
            raise OpenError(f"{path!r} is a directory, not a shard", url=url) from exc
        if not writing:
            stream.local_path = os.path.abspath(path)  # type: ignore[attr-defined]
            if offset:
                stream.seek(offset)
        return cast(BinaryIO, stream)

    def glob(self, pattern: str, *, storage_options: Any = None) -> list[str]:
        """Local paths (or ``file:`` URLs, as given) matching ``pattern``."""
        scheme, rest = split_scheme(pattern)
        if not scheme:
            return _existing(globmod.glob(pattern, recursive=True))
        prefix = "file://" if rest.startswith("//") else "file:"
        path = file_url_path(rest)
        return sorted(prefix + found for found in _existing(globmod.glob(path, recursive=True)))


def _existing(found: list[str]) -> list[str]:
    # glob("missing/**", recursive=True) answers ["missing/"] for a directory that is not there
    return sorted(path for path in found if os.path.lexists(path))


class _AtomicFile(io.BufferedWriter):
    """A file written as ``.NAME.tmp-…`` beside ``path`` and renamed to ``path`` on close."""

    def __init__(self, path: str, bufsize: int) -> None:
        directory, name = os.path.split(os.path.abspath(path))
        self._tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        self._path = path
        # O_EXCL: a name of our own; mode 0o666 lets the umask apply as for any new file
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        super().__init__(io.FileIO(fd, "wb"), bufsize if bufsize > 0 else io.DEFAULT_BUFFER_SIZE)

    @property
    def name(self) -> str:
        return self._path

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
            os.replace(self._tmp, self._path)
        except BaseException:
            self._remove()
            raise

    def abort(self) -> None:
        """Close and delete the temporary file; ``path`` is left as it was."""
        if not self.closed:
            try:
                super().close()
            finally:
                self._remove()

    def _remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        # a ``with`` block that raised leaves ``path`` as it was
        self.abort() if exc_type is not None else self.close()

    def __del__(self) -> None:
        # dropped without close() (``np.save(gopen(path, "wb"), a)``): published, as a plain
        # file's bytes are when it is collected (and __init__ may have failed half-way)
        with contextlib.suppress(ValueError, AttributeError, OSError):
            if not self.closed:
                self.close()


class StdioOpener:
    """``-``: standard input for reading, standard output for writing."""

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        options.pop("bufsize", None)
        if options:
            raise ConfigError(f"options {sorted(options)} are not used when opening '-'")
        stream = sys.stdout.buffer if "w" in mode else sys.stdin.buffer
        return cast(BinaryIO, _Unclosable(stream))


class _Unclosable(io.RawIOBase):
    """Wraps stdin/stdout so closing a shard does not close the process's own streams."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return cast(bytes, self._stream.read(size))

    def readinto(self, buffer: Any) -> int:
        return cast(int, self._stream.readinto(buffer))

    def write(self, data: Any) -> int:
        return cast(int, self._stream.write(data))

    def close(self) -> None:
        if not self.closed:
            self._stream.flush() if self._stream.writable() else None
        super().close()
