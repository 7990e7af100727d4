"""Byte streams shared by the openers and the cache."""

from __future__ import annotations

import io

__all__ = ["SequentialStream"]


class SequentialStream(io.RawIOBase):
    """A readable, forward-only raw stream of one object whose ``read()`` to the end goes in
    large pieces (not io's 8 KiB ones); subclasses define ``readinto`` and keep ``_pos``,
    ``_size`` and ``_version``."""

    _pos: int = 0
    _size: int | None = None
    _version: str | None = None

    @property
    def size(self) -> int | None:
        """The object's size in bytes, if the store said."""
        return self._size

    @property
    def version(self) -> str | None:
        """The ETag/generation pinned at open, if the store gave one."""
        return self._version

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        chunk = bytearray(4 * 2**20)
        parts = []
        while n := self.readinto(chunk):
            parts.append(bytes(chunk[:n]))
        return b"".join(parts)
