"""Tar header fields, parsed and built: numbers, checksums, names and pax records (no I/O).

:func:`first_bad_header` checks the checksums of all the headers found in a buffer at once
with numpy, which is what keeps :mod:`wds_cloud.tar.reader` fast on small members.
:class:`HeaderBuilder` builds the headers :mod:`wds_cloud.tar.writer` writes (POSIX ustar; names
that do not fit get a pax header, or a GNU long-name record with ``format="gnu"``).
"""

from __future__ import annotations

import mmap
import re
import tarfile
import zlib

from ..errors import ConfigError

__all__ = [
    "BLOCK",
    "FORMATS",
    "RECORD",
    "HeaderBuilder",
    "checksum_ok",
    "first_bad_header",
    "header_name",
    "padded",
    "padding",
    "parse_number",
    "parse_pax",
    "pax_overrides",
    "unsigned_sum",
]

BLOCK = 512
RECORD = 20 * BLOCK  # what tar pads the archive to, as GNU tar and tarfile do
_ZEROS = bytes(RECORD)
_MAX_OCTAL_SIZE = 8**11 - 1
#: the ``format`` values TarWriter takes, as webdataset and tarfile name them
FORMATS = {
    None: "ustar", "ustar": "ustar", "USTAR_FORMAT": "ustar", tarfile.USTAR_FORMAT: "ustar",
    "pax": "pax", "PAX_FORMAT": "pax", tarfile.PAX_FORMAT: "pax",
    "gnu": "gnu", "GNU_FORMAT": "gnu", tarfile.GNU_FORMAT: "gnu",
}

_NUMPY_MIN = 16  # batches with fewer headers are checked in pure Python
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")


def parse_number(field: bytes) -> int:
    """A tar numeric field: octal text (NUL/space terminated) or GNU base-256.

    Raises ``ValueError`` for anything else; accepts what :mod:`tarfile` accepts.
    """
    if field and field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    nul = field.find(b"\0")
    text = (field if nul < 0 else field[:nul]).decode("ascii").strip()
    return int(text or "0", 8)


def unsigned_sum(header: bytes) -> int:
    """The unsigned byte sum of a header with its checksum field counted as spaces."""
    # adler32's low half is 1 + the byte sum mod 65521; pieces of < 257 bytes cannot wrap
    adler = zlib.adler32
    return (
        (adler(header[:148]) & 0xFFFF) + (adler(header[156:404]) & 0xFFFF)
        + (adler(header[404:BLOCK]) & 0xFFFF) - 3 + 256  # the chksum field counts as 8 spaces
    )


def checksum_ok(header: bytes) -> bool:
    """Whether a 512-byte header's checksum holds (unsigned, or the signed variant)."""
    field = header[148:156]
    if header.isascii():  # no byte >= 128: the sum of all 512 cannot wrap adler32's low half
        adler = zlib.adler32
        unsigned = (adler(header) & 0xFFFF) - (adler(field) & 0xFFFF) + 256
        if field == b"%06o\0 " % unsigned:  # the usual form, as tar and TarWriter write it
            return True
    else:
        unsigned = unsigned_sum(header)
    try:
        stored = int(field[:6], 8) if field[6:] == b"\0 " else parse_number(field)
    except ValueError:
        return False
    if stored == unsigned:
        return True
    high = sum(1 for b in header[:148] if b >= 128) + sum(1 for b in header[156:] if b >= 128)
    return high > 0 and stored == unsigned - 256 * high


def first_bad_header(buf: bytes | mmap.mmap, headers: list[int], *, vectorize: bool = True) -> int:
    """Offset in ``buf`` of the first of the ``headers`` failing its checksum, or -1; checked
    with numpy when they are many and ``vectorize``."""
    if len(headers) < _NUMPY_MIN or not vectorize:
        candidates: list[int] = headers
    else:
        import numpy as np  # only shards of many small members pay for it

        nblocks = len(buf) // BLOCK
        blocks = np.frombuffer(buf, np.uint8, nblocks * BLOCK).reshape(nblocks, BLOCK)
        rows = blocks[np.array(headers, dtype=np.intp) // BLOCK]
        total = rows.sum(axis=1, dtype=np.int32)
        field = rows[:, 148:156].astype(np.int32)
        total -= field.sum(axis=1)
        digits = field[:, :6] - 48  # the usual "%06o\0" form; others are re-checked below
        stored = digits[:, 0]
        for i in range(1, 6):
            stored = stored * 8 + digits[:, i]
        usual = (field[:, 6] == 0) & ((digits >= 0) & (digits <= 7)).all(axis=1)
        candidates = [headers[i] for i in np.flatnonzero(~usual | (total + 256 != stored))]
    adler = zlib.adler32
    for pos in sorted(candidates) if len(candidates) > 1 else candidates:
        header = buf[pos:pos + BLOCK]
        if header.isascii():  # checksum_ok's usual case, inlined: a few per small window
            chksum = header[148:156]
            if chksum == b"%06o\0 " % ((adler(header) & 0xFFFF) - (adler(chksum) & 0xFFFF) + 256):
                continue
        if not checksum_ok(header):
            return pos
    return -1


def parse_pax(data: bytes) -> dict[str, str]:
    """Records ``"<len> <keyword>=<value>\\n"`` of a pax header into a dict (values decoded).

    Trailing NUL padding is ignored; a malformed record raises ``ValueError``.
    """
    out: dict[str, str] = {}
    pos, size = 0, len(data)
    while pos < size and data[pos] != 0:
        m = _PAX_RECORD.match(data, pos)
        length = int(m.group(1)) if m else 0
        end = pos + length
        if m is None or end > size or end <= m.end() or data[end - 1] != 0x0A:
            raise ValueError(f"malformed pax record at byte {pos} of the pax header")
        key = m.group(2).decode("utf-8", "surrogateescape")
        out[key] = data[m.end():end - 1].decode("utf-8", "surrogateescape")
        pos = end
    return out


def header_name(header: bytes) -> str:
    """The member name of a ustar/v7 header (with the ustar prefix), decoded."""
    nul = header.find(b"\0", 0, 100)
    name = header[:nul if nul >= 0 else 100]
    if header[345] and header[257:263] == b"ustar\0":  # POSIX ustar: prefix + "/" + name
        nul = header.find(b"\0", 345, 500)
        name = header[345:nul if nul >= 0 else 500] + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def padded(size: int) -> int:
    """``size`` rounded up to whole 512-byte blocks."""
    return (size + BLOCK - 1) & -BLOCK


def pax_overrides(data: bytes) -> tuple[str | None, int | None]:
    """``(path, size)`` set by a pax header (None if not); ``ValueError`` if it is malformed or
    describes a sparse file. Headers without such records (e.g. only times, as webdataset's
    TarWriter writes) are not parsed at all, whichever path reads them."""
    if b"path=" not in data and b"size=" not in data and b"GNU.sparse" not in data:
        return None, None
    records = parse_pax(data)
    if any(key.startswith("GNU.sparse.") for key in records):
        raise ValueError("GNU sparse members are not supported: re-create the shard without "
                         "--sparse")
    size = int(records["size"]) if "size" in records else None
    if size is not None and size < 0:
        raise ValueError(f"negative size {size}")
    return records.get("path"), size


# -- building ---------------------------------------------------------------------------------

def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(keyword: str, value: bytes) -> bytes:
    body = b" " + keyword.encode("ascii") + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:  # the length counts its own digits
        n = len(str(n)) + len(body)
    return str(n).encode("ascii") + body


def padding(size: int) -> bytes:
    return _ZEROS[: -size % BLOCK]


class HeaderBuilder:
    """Builds tar headers whose fixed fields (mode, owner, mtime...) are set once."""

    def __init__(self, *, user: str, group: str, mode: int, mtime: int, fmt: str) -> None:
        uname, gname = user.encode("utf-8"), group.encode("utf-8")
        if len(uname) > 32 or len(gname) > 32:
            raise ConfigError(f"tar user and group names are limited to 32 bytes: {user!r}, "
                              f"{group!r}")
        if not 0 <= mode <= 0o7777777 or not 0 <= mtime <= _MAX_OCTAL_SIZE:
            raise ConfigError(f"tar mode {mode:o} or mtime {mtime} out of range")
        t = bytearray(BLOCK)
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
                extra += [self.block(b"././@LongLink", len(long), b"L"), long, padding(len(long))]
                name = name[:100]
            else:
                pax.append(_pax_record("path", name))
                name = name[:100]
        if size > _MAX_OCTAL_SIZE and self.fmt != "gnu":
            pax.append(_pax_record("size", b"%d" % size))
        if pax:
            records = b"".join(pax)
            extra += [self.block(b"././@PaxHeader", len(records), b"x"), records,
                      padding(len(records))]
        shown_size = size if size <= _MAX_OCTAL_SIZE or self.fmt == "gnu" else 0
        return [*extra, self.block(name, shown_size, b"0", prefix)]


def _ustar_split(name: bytes) -> tuple[bytes, bytes] | None:
    """Split a long name at a slash into a ustar prefix (<= 155) and name (<= 100)."""
    cut = name.rfind(b"/", 0, 156)
    if cut <= 0 or len(name) - cut - 1 > 100 or cut == len(name) - 1:
        return None
    return name[:cut], name[cut + 1 :]
