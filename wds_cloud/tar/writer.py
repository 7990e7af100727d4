"""Writing samples into tar shards: :class:`TarWriter` and :class:`ShardWriter` (webdataset API).

Archives are reproducible: the same samples give the same bytes. Members of a sample are written
in sorted order, every member has the same mtime (``mtime=None`` means 0, i.e. 1970-01-01),
uid/gid 0 and the given user/group names, and the gzip header carries no time or file name.
Headers are built by :class:`~wds_cloud.tar.header.HeaderBuilder` and the compression chosen in
:mod:`wds_cloud.tar.compress`; GNU tar, Python's ``tarfile`` and webdataset read the result.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

from ..codecs.encoder import EncoderSpec, EncodingError, make_encoder, numpy_dumps, torch_dumps
from ..errors import ConfigError
from ..settings import Settings
from .compress import compression_for, compressor
from .header import BLOCK, FORMATS, RECORD, HeaderBuilder, padding

__all__ = ["ShardWriter", "TarWriter", "numpy_dumps", "torch_dumps"]

log = logging.getLogger(__name__)

_JOIN_LIMIT = 1 << 20  # samples smaller than this are written with a single write()


@dataclass
class _Packed:
    """A sample ready to be appended: its tar bytes in pieces, and their total size."""

    chunks: list[Any]
    size: int


class _Packer:
    """Turns samples into tar members: encoding, validation, names, headers."""

    def __init__(self, *, user: str = "bigdata", group: str = "bigdata", mode: int = 0o0444,
                 encoder: EncoderSpec = True, keep_meta: bool = False,
                 mtime: float | None = None, format: Any = None) -> None:
        fmt = FORMATS.get(format) if isinstance(format, (str, int, type(None))) else None
        if fmt is None:
            raise ConfigError(f"tar format {format!r} is not supported; use 'ustar', 'pax' or "
                              "'gnu' (or tarfile's USTAR_FORMAT, PAX_FORMAT, GNU_FORMAT)")
        self.encoder = make_encoder(encoder)
        self.keep_meta = bool(keep_meta)
        self.headers = HeaderBuilder(user=user, group=group, mode=mode,
                                mtime=int(mtime or 0), fmt=fmt)

    def pack(self, obj: Any, *, where: str) -> _Packed:
        """Encode ``obj`` and lay it out as tar members; raise before anything is written."""
        sample = self.encoder(obj)
        if not isinstance(sample, dict):
            raise EncodingError(f"{where}: the encoder returned {type(sample).__name__}, "
                                "not a dict sample")
        key = sample.get("__key__")
        if not isinstance(key, str):
            raise EncodingError(f"{where}: every sample needs a '__key__' str (the member name "
                                f"prefix), got {key!r} in a sample with fields {sorted(sample)}")
        chunks: list[Any] = []
        size = 0
        for k in sorted(sample):
            if k[:1] == "_" and (k == "__key__" or not self.keep_meta):
                continue
            v = sample[k]
            if isinstance(v, str):
                v = v.encode("utf-8")
            elif not isinstance(v, (bytes, bytearray, memoryview)):
                raise EncodingError(
                    f"{where}: field {k!r} of sample {key!r} is {type(v).__name__} after "
                    "encoding, not bytes; encode it first or use encoder=True"
                )
            n = len(v) if v.__class__ is bytes else memoryview(v).nbytes
            headers = self.headers.member(f"{key}.{k}".encode("utf-8", "surrogateescape"), n)
            pad = padding(n)
            chunks += headers
            chunks += (v, pad)
            size += sum(map(len, headers)) + n + len(pad)
        return _Packed(chunks, size)


class TarWriter:
    """Write samples (dicts with a ``__key__``) as members of one tar archive.

    ``fileobj`` is a path or URL (opened with ``gopen(url, "wb")`` and closed by
    :meth:`close`) or a binary file object (left open). The archive is gzip-compressed when
    ``compress`` is ``True``/``"gz"`` or the name ends in ``gz`` (``"bz2"``/``"xz"`` likewise).
    ``encoder`` (see :func:`wds_cloud.codecs.encoder.make_encoder`) turns field values into bytes;
    field ``k`` of sample ``key`` becomes member ``key.k``. Metadata fields (``_*``) are
    written only with ``keep_meta=True``. ``mtime`` defaults to 0 so output is reproducible.
    ``format`` is ``"ustar"`` (default), ``"pax"`` or ``"gnu"``. ``storage_options`` (per
    scheme, or flat for the URL's scheme) go to the fsspec filesystem of a URL target;
    ``settings`` are those of the composition root (default: read from the environment when
    the target is opened; :class:`ShardWriter` reads them once for all its shards).

    Remote targets (``s3://``, ``gs://``, ``az://``, ``http(s)://``) receive the object only when
    the archive is complete: leaving a ``with TarWriter(...)`` block by an exception, or calling
    :meth:`abort`, writes nothing.
    """

    def __init__(
        self, fileobj: str | os.PathLike[str] | BinaryIO | IO[bytes], user: str = "bigdata",
        group: str = "bigdata", mode: int = 0o0444, compress: bool | str | None = None,
        encoder: EncoderSpec = True, keep_meta: bool = False, mtime: float | None = None,
        format: Any = None, *, storage_options: Mapping[str, Any] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self._packer = _Packer(user=user, group=group, mode=mode, encoder=encoder,
                               keep_meta=keep_meta, mtime=mtime, format=format)
        kind = compression_for(fileobj, compress)
        self.own_fileobj: IO[bytes] | None = None
        if isinstance(fileobj, (str, os.PathLike)):
            from ..router import gopen

            self.name = os.fspath(fileobj)
            self.own_fileobj = gopen(self.name, "wb", storage_options=storage_options,
                                     settings=settings)
            raw: IO[bytes] = self.own_fileobj
        else:
            self.name = str(getattr(fileobj, "name", "<stream>"))
            raw = fileobj
        self.stream = raw
        self._out = compressor(kind, raw)
        self.offset = 0  # bytes of (uncompressed) tar written so far
        self.closed = False

    def write(self, obj: dict[str, Any]) -> int:
        """Append one sample; return the number of (uncompressed) tar bytes it took."""
        return self._append(self._packer.pack(obj, where=self.name))

    def _append(self, packed: _Packed) -> int:
        if self.closed:
            raise ValueError(f"TarWriter for {self.name!r} is closed")
        if packed.size <= _JOIN_LIMIT:
            self._out.write(b"".join(packed.chunks))
        else:
            for chunk in packed.chunks:
                self._out.write(chunk)
        self.offset += packed.size
        return packed.size

    def close(self) -> None:
        """End the archive (two zero blocks, padded to 10 KiB) and close what we opened."""
        if self.closed:
            return
        self.closed = True
        try:
            end = self.offset + 2 * BLOCK
            self._out.write(bytes(2 * BLOCK + (-end % RECORD)))
            if self._out is not self.stream:
                self._out.close()  # flushes the compressor; leaves the file open
            self.stream.flush()
        finally:
            if self.own_fileobj is not None:
                self.own_fileobj.close()
                self.own_fileobj = None

    def abort(self) -> None:
        """Stop without finishing the archive; a remote target receives nothing."""
        if self.closed:
            return
        self.closed = True
        own, self.own_fileobj = self.own_fileobj, None
        if own is not None:
            abort = getattr(own, "abort", None)
            abort() if abort is not None else own.close()

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.abort() if exc_type is not None else self.close()


_PACKER_OPTIONS = frozenset(("user", "group", "mode", "encoder", "keep_meta", "mtime", "format"))
_WRITER_OPTIONS = _PACKER_OPTIONS | {"compress", "storage_options", "settings"}


class ShardWriter:
    """Write samples into a numbered series of tar shards (``pattern % shard_number``).

    A new shard is started when the current one holds ``maxcount`` samples, or when the next
    sample would take it past ``maxsize`` bytes of (uncompressed) tar; a sample larger than
    ``maxsize`` gets a shard of its own. Shards are opened on the first sample they receive,
    so no empty shard is ever written. ``post(fname)`` runs after each shard is closed.
    ``opener(fname)`` returns the stream to write to (closed by the writer) instead of
    ``gopen(fname, "wb")``. Other keyword arguments go to :class:`TarWriter`. ``verbose``
    logs each new shard at INFO instead of DEBUG.

    Attributes: ``fname`` (current or last shard), ``shard`` (number of the next shard),
    ``count`` and ``size`` (samples and bytes in the current shard), ``total`` (all samples).
    """

    def __init__(
        self, pattern: str, maxcount: int = 100000, maxsize: float = 3e9,
        post: Callable[[str], Any] | None = None, start_shard: int = 0, verbose: int = 0,
        opener: Callable[[str], IO[bytes]] | None = None, **kw: Any,
    ) -> None:
        unknown = set(kw) - _WRITER_OPTIONS
        if unknown:
            raise TypeError(f"ShardWriter got unexpected keyword arguments {sorted(unknown)}")
        try:
            distinct = pattern % 0 != pattern % 1
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"shard pattern {pattern!r} must contain one %d-style field, "
                              "e.g. 'shard-%06d.tar'") from exc
        if not distinct:
            raise ConfigError(f"shard pattern {pattern!r} gives the same name for every shard; "
                              "add a %d-style field, e.g. 'shard-%06d.tar'")
        if maxcount < 1 or maxsize <= 0:
            raise ConfigError(f"maxcount ({maxcount}) and maxsize ({maxsize}) must be positive")
        self.pattern, self.maxcount, self.maxsize = pattern, int(maxcount), float(maxsize)
        if opener is None and kw.get("settings") is None:
            kw["settings"] = Settings.from_env()  # read once for all the shards it writes
        self.post, self.verbose, self.opener, self.kw = post, verbose, opener, kw
        self._packer = _Packer(**{k: v for k, v in kw.items() if k in _PACKER_OPTIONS})
        self.tarstream: TarWriter | None = None
        self._opened: IO[bytes] | None = None
        self.shard = start_shard
        self.fname: str | None = None
        self.total = self.count = self.size = 0

    def write(self, obj: dict[str, Any]) -> None:
        """Write one sample, starting a new shard first if the current one is full."""
        packed = self._packer.pack(obj, where=self.pattern)
        if (self.tarstream is None or self.count >= self.maxcount
                or (self.count > 0 and self.size + packed.size > self.maxsize)):
            self.next_stream()
        assert self.tarstream is not None  # next_stream opened it
        self.tarstream._append(packed)
        self.count += 1
        self.total += 1
        self.size += packed.size

    def next_stream(self) -> None:
        """Close the current shard (if any) and open the next one."""
        self.finish()
        fname = self.pattern % self.shard
        log.log(logging.INFO if self.verbose else logging.DEBUG,
                "writing shard %s (%d samples written so far)", fname, self.total)
        target: Any = fname
        if self.opener is not None:
            target = self._opened = self.opener(fname)
        kw = dict(self.kw)
        if kw.get("compress") is None:  # decide from the shard name even if opener is used
            kw["compress"] = compression_for(fname, None) or False
        self.tarstream = TarWriter(target, **kw)
        self.fname = fname
        self.shard += 1
        self.count = self.size = 0

    def finish(self) -> None:
        """Close the current shard and run ``post`` on it."""
        if self._end_shard(abort=False) and self.post is not None and self.fname is not None:
            self.post(self.fname)

    def close(self) -> None:
        """Finish the last shard; further writes would start a new one."""
        self.finish()

    def abort(self) -> None:
        """Drop the shard being written (finished shards stay); a remote one is never created."""
        self._end_shard(abort=True)

    def _end_shard(self, *, abort: bool) -> bool:
        """Close (or abort) the current shard and the stream ``opener`` gave for it, if any;
        False when no shard was open."""
        if self.tarstream is None:
            return False
        try:
            self.tarstream.abort() if abort else self.tarstream.close()
            if self._opened is not None:
                self._opened.close()
        finally:
            self.tarstream = self._opened = None
        return True

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.abort() if exc_type is not None else self.close()
