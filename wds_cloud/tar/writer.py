"""Writing samples into tar shards: :class:`TarWriter` and :class:`ShardWriter` (webdataset API).

Archives are reproducible: the same samples give the same bytes. Members of a sample are
written in sorted order, every member has the same mtime (``mtime=None`` means 0, i.e.
1970-01-01), uid/gid 0 and the given user/group names, and the gzip header carries no time
or file name. Tar headers are built directly (POSIX ustar; member names that do not fit get a
pax header, or a GNU long-name record with ``format="gnu"``); GNU tar, Python's ``tarfile``
and webdataset read the result.
"""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
import os
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, cast

from ..codecs.encoder import EncoderSpec, EncodingError, make_encoder, numpy_dumps, torch_dumps
from ..errors import ConfigError

__all__ = ["ShardWriter", "TarWriter", "numpy_dumps", "torch_dumps"]

log = logging.getLogger(__name__)

_BLOCK = 512
_RECORD = 20 * _BLOCK  # what tar pads the archive to, as GNU tar and tarfile do
_ZEROS = bytes(_RECORD)
_MAX_OCTAL_SIZE = 8**11 - 1
_JOIN_LIMIT = 1 << 20  # samples smaller than this are written with a single write()
_FORMATS = {
    None: "ustar", "ustar": "ustar", "USTAR_FORMAT": "ustar", tarfile.USTAR_FORMAT: "ustar",
    "pax": "pax", "PAX_FORMAT": "pax", tarfile.PAX_FORMAT: "pax",
    "gnu": "gnu", "GNU_FORMAT": "gnu", tarfile.GNU_FORMAT: "gnu",
}


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(keyword: str, value: bytes) -> bytes:
    body = b" " + keyword.encode("ascii") + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:  # the length counts its own digits
        n = len(str(n)) + len(body)
    return str(n).encode("ascii") + body


def _padding(size: int) -> bytes:
    return _ZEROS[: -size % _BLOCK]


class _Headers:
    """Builds tar headers whose fixed fields (mode, owner, mtime...) are set once."""

    def __init__(self, *, user: str, group: str, mode: int, mtime: int, fmt: str) -> None:
        uname, gname = user.encode("utf-8"), group.encode("utf-8")
        if len(uname) > 32 or len(gname) > 32:
            raise ConfigError(f"tar user and group names are limited to 32 bytes: {user!r}, "
                              f"{group!r}")
        if not 0 <= mode <= 0o7777777 or not 0 <= mtime <= _MAX_OCTAL_SIZE:
            raise ConfigError(f"tar mode {mode:o} or mtime {mtime} out of range")
        t = bytearray(_BLOCK)
        t[100:108], t[108:116], t[116:124] = _octal(mode, 8), _octal(0, 8), _octal(0, 8)
        t[136:148] = _octal(mtime, 12)
        t[148:156] = b" " * 8  # the checksum is computed with its own field as spaces
        t[156:157] = b"0"
        t[257:265] = b"ustar  \0" if fmt == "gnu" else b"ustar\x0000"
        t[265 : 265 + len(uname)], t[297 : 297 + len(gname)] = uname, gname
        if fmt != "gnu":
            t[329:337], t[337:345] = _octal(0, 8), _octal(0, 8)
        self.template, self.base_sum, self.fmt = bytes(t), sum(t), fmt

    def block(self, name: bytes, size: int, typeflag: bytes = b"0", prefix: bytes = b"") -> bytes:
        """One header block (name, prefix and size must fit their fields)."""
        h = bytearray(self.template)
        h[0 : len(name)] = name
        if prefix:
            h[345 : 345 + len(prefix)] = prefix
        if size <= _MAX_OCTAL_SIZE:
            field = _octal(size, 12)
        else:  # GNU base-256 for members of 8 GiB and more
            field = bytes([0x80]) + size.to_bytes(11, "big")
        h[124:136] = field
        h[156:157] = typeflag
        total = self.base_sum + sum(name) + sum(prefix) + sum(field) + typeflag[0] - ord("0")
        h[148:156] = b"%06o\0 " % total
        return bytes(h)

    def member(self, name: bytes, size: int) -> list[bytes]:
        """The header block(s) for a regular file (extended headers first, if needed)."""
        extra: list[bytes] = []
        pax: list[bytes] = []
        prefix = b""
        if len(name) > 100 or (self.fmt == "pax" and not name.isascii()):
            split = _ustar_split(name) if self.fmt == "ustar" else None
            if split is not None:
                prefix, name = split
            elif self.fmt == "gnu":
                long = name + b"\0"
                extra += [self.block(b"././@LongLink", len(long), b"L"), long, _padding(len(long))]
                name = name[:100]
            else:
                pax.append(_pax_record("path", name))
                name = name[:100]
        if size > _MAX_OCTAL_SIZE and self.fmt != "gnu":
            pax.append(_pax_record("size", b"%d" % size))
        if pax:
            records = b"".join(pax)
            extra += [self.block(b"././@PaxHeader", len(records), b"x"), records,
                      _padding(len(records))]
        shown_size = size if size <= _MAX_OCTAL_SIZE or self.fmt == "gnu" else 0
        return [*extra, self.block(name, shown_size, b"0", prefix)]


def _ustar_split(name: bytes) -> tuple[bytes, bytes] | None:
    """Split a long name at a slash into a ustar prefix (<= 155) and name (<= 100)."""
    cut = name.rfind(b"/", 0, 156)
    if cut <= 0 or len(name) - cut - 1 > 100 or cut == len(name) - 1:
        return None
    return name[:cut], name[cut + 1 :]


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
        fmt = _FORMATS.get(format) if isinstance(format, (str, int, type(None))) else None
        if fmt is None:
            raise ConfigError(f"tar format {format!r} is not supported; use 'ustar', 'pax' or "
                              "'gnu' (or tarfile's USTAR_FORMAT, PAX_FORMAT, GNU_FORMAT)")
        self.encoder = make_encoder(encoder)
        self.keep_meta = bool(keep_meta)
        self.headers = _Headers(user=user, group=group, mode=mode,
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
            pad = _padding(n)
            chunks += headers
            chunks += (v, pad)
            size += sum(map(len, headers)) + n + len(pad)
        return _Packed(chunks, size)


def _compression(target: Any, compress: bool | str | None) -> str | None:
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


def _compressor(kind: str | None, raw: IO[bytes]) -> IO[bytes]:
    if kind == "gz":  # no name, mtime 0: reproducible; level 6: zlib's balance of speed/size
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
        return cast(IO[bytes], gz)
    if kind == "bz2":
        return bz2.BZ2File(raw, "wb")
    if kind == "xz":
        return lzma.LZMAFile(raw, "wb")
    return raw


class TarWriter:
    """Write samples (dicts with a ``__key__``) as members of one tar archive.

    ``fileobj`` is a path or URL (opened with ``gopen(url, "wb")`` and closed by
    :meth:`close`) or a binary file object (left open). The archive is gzip-compressed when
    ``compress`` is ``True``/``"gz"`` or the name ends in ``gz`` (``"bz2"``/``"xz"`` likewise).
    ``encoder`` (see :func:`wds_cloud.codecs.encoder.make_encoder`) turns field values into bytes;
    field ``k`` of sample ``key`` becomes member ``key.k``. Metadata fields (``_*``) are
    written only with ``keep_meta=True``. ``mtime`` defaults to 0 so output is reproducible.
    ``format`` is ``"ustar"`` (default), ``"pax"`` or ``"gnu"``. ``storage_options`` (per
    scheme, or flat for the URL's scheme) go to the fsspec filesystem of a URL target.

    Remote targets (``s3://``, ``gs://``, ``az://``, ``http(s)://``) receive the object only when
    the archive is complete: leaving a ``with TarWriter(...)`` block by an exception, or calling
    :meth:`abort`, writes nothing.
    """

    def __init__(
        self, fileobj: str | os.PathLike[str] | BinaryIO | IO[bytes], user: str = "bigdata",
        group: str = "bigdata", mode: int = 0o0444, compress: bool | str | None = None,
        encoder: EncoderSpec = True, keep_meta: bool = False, mtime: float | None = None,
        format: Any = None, *, storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._packer = _Packer(user=user, group=group, mode=mode, encoder=encoder,
                               keep_meta=keep_meta, mtime=mtime, format=format)
        kind = _compression(fileobj, compress)
        self.own_fileobj: IO[bytes] | None = None
        if isinstance(fileobj, (str, os.PathLike)):
            from ..router import gopen

            self.name = os.fspath(fileobj)
            self.own_fileobj = gopen(self.name, "wb", storage_options=storage_options)
            raw: IO[bytes] = self.own_fileobj
        else:
            self.name = str(getattr(fileobj, "name", "<stream>"))
            raw = fileobj
        self.stream = raw
        self._out = _compressor(kind, raw)
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
            end = self.offset + 2 * _BLOCK
            self._out.write(bytes(2 * _BLOCK + (-end % _RECORD)))
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
_WRITER_OPTIONS = _PACKER_OPTIONS | {"compress", "storage_options"}


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
            kw["compress"] = _compression(fname, None) or False
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
