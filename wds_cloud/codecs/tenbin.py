"""The ``.ten`` (tenbin) tensor format of webdataset: a list of numpy arrays in aligned chunks.

A buffer is a sequence of chunks, each ``b"~TenBin~"`` + little-endian int64 byte count +
payload zero-padded to a multiple of 64 bytes. Arrays come in pairs of chunks: a header
(int64 values: dtype code such as ``"f4"`` and an 8-character info string, both stored as
NUL-padded ASCII, then ``ndim`` and the dimensions) and the raw C-order data.

Unlike webdataset 1.0.2, ``uint32`` works (its table misspells it) and non-contiguous arrays
are made contiguous instead of failing.

webdataset's whole ``tenbin`` module is here too, with its names: files (``save``/``load``,
``.ten``), streams (``write``/``read``, chunk by chunk), and the pieces (``encode_list``,
``encode_chunks``, ``str64``, ...), all writing and reading the same format as
:func:`encode_buffer`/:func:`decode_buffer`. (webdataset's ``check_acceptable_input_type``
raised for every type that is *not* 64-bit; here it refuses the 64-bit ones unless
``allow64``, as its message says.)
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable, Sequence
from typing import IO, Any

import numpy as np

from ..errors import ShardFormatError

__all__ = [
    "bytedata",
    "bytelen",
    "check_acceptable_input_type",
    "check_infos",
    "decode_buffer",
    "decode_chunks",
    "decode_header",
    "decode_list",
    "encode_buffer",
    "encode_chunks",
    "encode_header",
    "encode_list",
    "load",
    "long_to_short",
    "magic",
    "magic_bytes",
    "magic_str",
    "read",
    "read_chunk",
    "roundup",
    "save",
    "short_to_long",
    "str64",
    "unstr64",
    "write",
    "write_chunk",
]

_MAGIC = b"~TenBin~"
_ALIGN = 64
_CODES = {
    "float16": "f2", "float32": "f4", "float64": "f8",
    "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
    "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8",
}
_DTYPES = {code: np.dtype(name) for name, code in _CODES.items()}
_LEN = struct.Struct("<q")


def _str8(text: str) -> bytes:
    raw = text.encode("ascii")
    if len(raw) > 8:
        raise ValueError(f"tenbin info string {text!r} is longer than 8 ASCII characters")
    return raw.ljust(8, b"\0")


def _padding(n: int) -> bytes:
    return b"\0" * (-n % _ALIGN)


def encode_buffer(arrays: Sequence[Any], infos: Sequence[str] | None = None) -> bytes:
    """Encode a list of numpy arrays (``infos``: optional 8-char labels) as one tenbin buffer."""
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"encode_buffer needs a list of arrays, got {type(arrays).__name__}")
    labels = list(infos) if infos else [""]
    if infos and len(labels) != len(arrays):
        raise ValueError(f"got {len(labels)} infos for {len(arrays)} arrays; give one per array")
    parts: list[bytes] = []
    for i, item in enumerate(arrays):
        a = np.ascontiguousarray(item)
        code = _CODES.get(a.dtype.name)
        if code is None:
            raise ValueError(
                f"tenbin cannot store dtype {a.dtype.name}; use one of {', '.join(_CODES)}"
            )
        if a.ndim >= 10:
            raise ValueError(f"tenbin stores at most 9 dimensions, got shape {a.shape}")
        dims = struct.pack(f"<{a.ndim + 1}q", a.ndim, *a.shape)
        header = _str8(code) + _str8(labels[i % len(labels)]) + dims
        for chunk in (header, a.tobytes()):
            parts += [_MAGIC, _LEN.pack(len(chunk)), chunk, _padding(len(chunk))]
    return b"".join(parts)


def _chunks(buf: bytes | bytearray | memoryview) -> list[memoryview]:
    view = memoryview(buf).cast("B")
    chunks = []
    offset, total = 0, len(view)
    while offset < total:
        if view[offset : offset + 8] != _MAGIC or offset + 16 > total:
            raise ShardFormatError("not a tenbin buffer: chunk magic missing", offset=offset)
        (nbytes,) = _LEN.unpack_from(view, offset + 8)
        start = offset + 16
        if nbytes < 0 or start + nbytes > total:
            raise ShardFormatError(f"tenbin chunk of {nbytes} bytes is truncated", offset=offset)
        chunks.append(view[start : start + nbytes])
        offset = start + nbytes + (-nbytes % _ALIGN)
    return chunks


def decode_buffer(
    buf: bytes | bytearray | memoryview, infos: bool = False
) -> list[np.ndarray] | tuple[list[np.ndarray], list[str]]:
    """Decode a tenbin buffer into a list of read-only arrays (``infos=True``: and labels)."""
    chunks = _chunks(buf)
    if len(chunks) % 2:
        raise ShardFormatError("tenbin buffer has a header without its data chunk")
    arrays, labels = [], []
    for header, data in zip(chunks[::2], chunks[1::2], strict=True):
        code = bytes(header[:8]).rstrip(b"\0").decode("ascii", "replace")
        dtype = _DTYPES.get(code)
        if dtype is None:
            raise ShardFormatError(f"tenbin header has unknown dtype code {code!r}")
        (ndim,) = _LEN.unpack_from(header, 16)
        shape = struct.unpack_from(f"<{ndim}q", header, 24)
        arrays.append(np.frombuffer(data, dtype=dtype, count=int(np.prod(shape))).reshape(shape))
        labels.append(bytes(header[8:16]).rstrip(b"\0").decode("ascii", "replace"))
    return (arrays, labels) if infos else arrays


#: dtype name -> tenbin code, and back (webdataset's tables, with ``uint32`` spelled right)
long_to_short: dict[str, str] = dict(_CODES)
short_to_long: dict[str, str] = {v: k for k, v in long_to_short.items()}
#: the chunk marker, as text, as the int64 webdataset compares and as bytes
magic_str = _MAGIC.decode("ascii")
magic: int = _LEN.unpack(_MAGIC)[0]
magic_bytes: bytes = _MAGIC


def bytelen(a: Any) -> int:
    """The size in bytes of an array (``nbytes``) or of bytes."""
    if hasattr(a, "nbytes"):
        return int(a.nbytes)
    if isinstance(a, (bytearray, bytes)):
        return len(a)
    raise ValueError(a, "cannot determine nbytes")


def bytedata(a: Any) -> Any:
    """The bytes of bytes, or the buffer (``.data``) of an array."""
    if isinstance(a, (bytearray, bytes, memoryview)):
        return a
    if hasattr(a, "data"):
        return a.data
    raise ValueError(a, "cannot return bytedata")


def check_acceptable_input_type(data: Iterable[Any], allow64: bool) -> None:
    """Raise ``ValueError`` for an array tenbin cannot store, or a 64-bit one unless
    ``allow64``."""
    for a in data:
        if a.dtype.name not in long_to_short:
            raise ValueError(f"tenbin cannot store dtype {a.dtype.name}")
        if not allow64 and a.dtype.name in ("float64", "int64", "uint64"):
            raise ValueError("64 bit datatypes not allowed unless explicitly enabled")


def str64(s: str) -> int:
    """Up to 8 ASCII characters as one int64 (NUL-padded), as tenbin headers store them."""
    result: int = _LEN.unpack(_str8(s))[0]
    return result


def unstr64(i: int) -> str:
    """The inverse of :func:`str64`."""
    return _LEN.pack(int(i)).decode("ascii").strip("\0")


def check_infos(data: list[Any], infos: list[str], required_infos: Any = None) -> Any:
    """``data``, or ``(data, infos)`` when ``required_infos`` is True; a list of required
    infos must match ``infos`` one by one (``ValueError`` otherwise)."""
    if required_infos is False or required_infos is None:
        return data
    if required_infos is True:
        return data, infos
    if not isinstance(required_infos, (tuple, list)):
        raise ValueError("required_infos must be tuple or list")
    for required, actual in zip(required_infos, infos, strict=False):
        if required != actual:
            raise ValueError(f"actual info {actual} doesn't match required info {required}")
    return data


def encode_header(a: Any, info: str = "") -> bytes:
    """The header chunk of array ``a``: dtype code, ``info``, rank and shape as int64s."""
    if a.ndim >= 10:
        raise ValueError("too many dimensions")
    if a.dtype.name not in long_to_short:
        raise ValueError("unsupported array type")
    header = [str64(long_to_short[a.dtype.name]), str64(info), a.ndim, *a.shape]
    return struct.pack(f"<{len(header)}q", *header)


def decode_header(h: Any) -> tuple[tuple[int, ...], np.dtype[Any], str]:
    """``(shape, dtype, info)`` of a header chunk."""
    values = np.frombuffer(h, dtype="<i8")
    code = unstr64(int(values[0]))
    if code not in short_to_long:
        raise ValueError("unsupported array type")
    rank = int(values[2])
    return tuple(int(d) for d in values[3 : 3 + rank]), np.dtype(short_to_long[code]), \
        unstr64(int(values[1]))


def encode_list(arrays: Sequence[Any], infos: Sequence[str] | None = None) -> list[Any]:
    """The chunks of ``arrays``: a header and the data of each (``infos`` repeat if short)."""
    labels = list(infos) if infos is not None else [""]
    if infos is not None and len(labels) != len(arrays):
        raise ValueError(f"length of list {arrays} must match length of infos {labels}")
    result: list[Any] = []
    for i, item in enumerate(arrays):
        a = np.ascontiguousarray(item)
        result += [encode_header(a, labels[i % len(labels)]), a.tobytes()]
    return result


def decode_list(chunks: Sequence[Any], infos: Any = False) -> Any:
    """The arrays of header and data chunks (see :func:`check_infos` for ``infos``)."""
    result, labels = [], []
    for header, data in zip(chunks[::2], chunks[1::2], strict=False):
        shape, dtype, info = decode_header(header)
        count = int(np.prod(shape))
        result.append(np.frombuffer(data, dtype=dtype, count=count).reshape(shape))
        labels.append(info)
    return check_infos(result, labels, infos)


def roundup(n: int, k: int = 64) -> int:
    """``n`` rounded up to a multiple of ``k``."""
    return k * ((n + k - 1) // k)


def encode_chunks(chunks: Iterable[Any]) -> bytearray:
    """Chunks as one buffer: each marked, counted and padded to 64 bytes."""
    result = bytearray()
    for b in chunks:
        n = bytelen(b)
        result += _MAGIC + _LEN.pack(n) + bytes(bytedata(b)) + _padding(n)
    return result


def decode_chunks(buf: bytes | bytearray | memoryview) -> list[memoryview]:
    """The chunks of a buffer (``ShardFormatError``, a ``ValueError``, if it is not one)."""
    return _chunks(buf)


def write_chunk(stream: IO[bytes], buf: Any) -> None:
    """Write one chunk of ``buf`` to ``stream``."""
    n = bytelen(buf)
    stream.write(_MAGIC + _LEN.pack(n))
    stream.write(bytedata(buf))
    stream.write(_padding(n))


def read_chunk(stream: IO[bytes]) -> bytes | None:
    """Read one chunk from ``stream``; ``None`` at its end."""
    mark = stream.read(8)
    if mark == b"":
        return None
    if mark != _MAGIC:
        raise ValueError("magic number does not match")
    (nbytes,) = _LEN.unpack(stream.read(8))
    if nbytes < 0:
        raise ValueError("negative nbytes")
    data = stream.read(nbytes)
    stream.read(-nbytes % _ALIGN)
    return data


def write(stream: IO[bytes], arrays: Sequence[Any], infos: Sequence[str] | None = None) -> None:
    """Write ``arrays`` to ``stream``, chunk by chunk."""
    for chunk in encode_list(arrays, infos=infos):
        write_chunk(stream, chunk)


def read(stream: IO[bytes], n: int = sys.maxsize, infos: Any = False) -> Any:
    """Read up to ``n`` arrays from ``stream`` (see :func:`check_infos` for ``infos``)."""
    chunks: list[bytes] = []
    for _ in range(n):
        header = read_chunk(stream)
        if header is None:
            break
        data = read_chunk(stream)
        if data is None:
            raise ValueError("premature EOF")
        chunks += [header, data]
    return decode_list(chunks, infos=infos)


def save(fname: str, *args: Any, infos: Sequence[str] | None = None, nocheck: bool = False) -> None:
    """Save the arrays ``args`` in file ``fname`` (which must end in ``.ten`` unless
    ``nocheck``)."""
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError("file name should end in .ten")
    with open(fname, "wb") as stream:
        write(stream, args, infos=infos)


def load(fname: str, infos: Any = False, nocheck: bool = False) -> Any:
    """The arrays saved in file ``fname`` (see :func:`save`)."""
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError("file name should end in .ten")
    with open(fname, "rb") as stream:
        return read(stream, infos=infos)
