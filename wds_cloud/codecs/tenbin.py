"""The ``.ten`` (tenbin) tensor format of webdataset: a list of numpy arrays in aligned chunks.

A buffer is a sequence of chunks, each ``b"~TenBin~"`` + little-endian int64 byte count +
payload zero-padded to a multiple of 64 bytes. Arrays come in pairs of chunks: a header
(int64 values: dtype code such as ``"f4"`` and an 8-character info string, both stored as
NUL-padded ASCII, then ``ndim`` and the dimensions) and the raw C-order data.

Unlike webdataset 1.0.2, ``uint32`` works (its table misspells it) and non-contiguous arrays
are made contiguous instead of failing.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ShardFormatError

__all__ = ["decode_buffer", "encode_buffer"]

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
