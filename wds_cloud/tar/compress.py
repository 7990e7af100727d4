"""Compression of shards: gzip, bzip2 and xz. Reading detects it by magic bytes; writing chooses it
by argument or file name (:func:`compression_for`, :func:`compressor`).

Reading: :func:`tar_source` peeks at the start of a stream and returns a ``read(n)`` function
over the tar bytes, decompressing on the fly (concatenated compressed members are read in turn)
without ever seeking. Damaged or truncated compressed data raises
:class:`~wds_cloud.errors.ShardFormatError` with the offset in the uncompressed stream.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import zlib
from collections.abc import Callable
from typing import IO, Any, BinaryIO, cast

from ..errors import ConfigError, ShardFormatError
from ..urls import redact

__all__ = ["CHUNK_SIZE", "Decompressed", "compression_for", "compressor", "tar_source"]

CHUNK_SIZE = 1 << 20  # bytes read ahead at a time
_GZIP_MAGIC = b"\x1f\x8b\x08"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZ2_MAGIC = re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)")


class Decompressed:
    """``read(n)`` over the decompressed bytes of a gzip/bzip2/xz stream (members concatenated)."""

    def __init__(self, read: Callable[[int], bytes], head: bytes, kind: str, url: str) -> None:
        self._read, self._input, self.kind, self._url = read, head, kind, url
        self._dec = self._new()
        self.produced = 0  # uncompressed bytes handed out, for error offsets

    def _new(self) -> Any:
        if self.kind == "gzip":
            return zlib.decompressobj(wbits=31)
        return bz2.BZ2Decompressor() if self.kind == "bzip2" else lzma.LZMADecompressor()

    def _error(self, what: str) -> ShardFormatError:
        return ShardFormatError(
            f"{what}; the {self.kind}-compressed shard is damaged or truncated: re-create or "
            f"re-download it", url=redact(self._url), offset=self.produced,
        )

    def _more_input(self, need: int) -> bool:
        """Read until ``self._input`` holds ``need`` bytes; False at end of stream."""
        while len(self._input) < need:
            data = self._read(CHUNK_SIZE)
            if not data:
                return False
            self._input += data
        return True

    def _next_member(self) -> bool:
        """After a member's end: start the next one; False at a clean end of stream."""
        self._input = self._dec.unused_data + self._input
        while True:
            self._input = self._input.lstrip(b"\0")  # zero padding between members is allowed
            if self._input or not self._more_input(1):
                break
        if not self._input:
            return False
        self._more_input(6)
        if not (self._input.startswith(_GZIP_MAGIC) if self.kind == "gzip"
                else self._input.startswith(_XZ_MAGIC) if self.kind == "xz"
                else _BZ2_MAGIC.match(self._input)):
            raise self._error(f"trailing garbage after the {self.kind} data")
        self._dec = self._new()
        return True

    def read(self, n: int) -> bytes:
        """Up to ``n`` decompressed bytes; ``b""`` only at the end of the stream."""
        if n <= 0:
            return b""
        while True:
            if self._dec.eof:
                if not self._next_member():
                    return b""
                continue
            # bz2/lzma buffer their input: feed more only when they ask for it
            if self._input or not getattr(self._dec, "needs_input", True) or self._more_input(1):
                out = self._decompress(self._input, n)
            else:
                out = self._decompress(b"", n)  # end of input: whatever is still pending
                if not out:
                    raise self._error(f"the {self.kind} stream ends early")
            if out:
                self.produced += len(out)
                return out

    def _decompress(self, data: bytes, n: int) -> bytes:
        try:
            out: bytes = self._dec.decompress(data, n)
        except (zlib.error, lzma.LZMAError, OSError, EOFError) as exc:
            raise self._error(f"corrupt {self.kind} data ({exc})") from exc
        # after the end of a member, the rest of the input is in unused_data (only)
        self._input = b"" if self._dec.eof else getattr(self._dec, "unconsumed_tail", b"")
        return out


def _read_of(stream: BinaryIO) -> Callable[[int], bytes]:
    """``stream.read``, or for a buffered file with nothing in its buffer (a local shard, a
    cached one) its raw file's ``read``: one copy from the page cache into each ``bytes``, and
    no small reads through the buffer (100 KB members: about 5% faster). The buffered stream
    stays consistent: its buffer stays empty. The reader copes with the short reads a raw
    file may give (FUSE, NFS)."""
    if type(stream) is io.BufferedReader and type(stream.raw) is io.FileIO:
        try:
            if stream.tell() == stream.raw.tell():  # (a pipe cannot tell: read as it is)
                return stream.raw.read
        except OSError:
            pass
    return stream.read


def tar_source(stream: BinaryIO, url: str, *, peek: int = CHUNK_SIZE
               ) -> tuple[Callable[[int], bytes], bytes]:
    """``(read, first_bytes)`` for the tar bytes of ``stream``, decompressing when needed;
    ``peek``: how much to read first (at least the 10 bytes that tell the compression)."""
    read = _read_of(stream)
    head = read(peek)
    if not isinstance(head, (bytes, bytearray)):
        raise TypeError(f"the stream of {redact(url)!r} returned {type(head).__name__}, not "
                        f"bytes: open shards in binary mode ('rb')")
    while head and len(head) < 10:
        more = read(max(peek, 10))
        if not more:
            break
        head += more
    head = head if type(head) is bytes else bytes(head)  # data handed out must be bytes
    kind = ("gzip" if head.startswith(_GZIP_MAGIC) else "xz" if head.startswith(_XZ_MAGIC)
            else "bzip2" if _BZ2_MAGIC.match(head) else "")
    if not kind:
        return read, head
    return Decompressed(read, head, kind, url).read, b""


# -- writing ----------------------------------------------------------------------------------

def compression_for(target: Any, compress: bool | str | None) -> str | None:
    """``gz``, ``bz2``, ``xz`` or ``None`` for TarWriter's ``compress`` (``None``: from the
    target's file name)."""
    if compress is False:
        return None
    if compress is True or compress == "gz":
        return "gz"
    if compress in ("bz2", "xz"):
        return str(compress)
    if compress is not None:
        raise ConfigError(f"compress={compress!r}: use True/'gz', 'bz2', 'xz', False or None")
    name = os.fspath(target) if isinstance(target, (str, os.PathLike)) else ""
    for suffix in ("gz", "bz2", "xz"):
        if isinstance(name, str) and name.endswith(suffix):
            return suffix
    return None


def compressor(kind: str | None, raw: IO[bytes]) -> IO[bytes]:
    """A stream that writes ``raw`` compressed as ``kind`` (reproducibly for gzip)."""
    if kind == "gz":  # no name, mtime 0: reproducible; level 6: zlib's balance of speed/size
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
        return cast(IO[bytes], gz)
    if kind == "bz2":
        return bz2.BZ2File(raw, "wb")
    if kind == "xz":
        return lzma.LZMAFile(raw, "wb")
    return raw
