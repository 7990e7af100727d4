"""Field decoders by type for :mod:`wds_cloud.codecs.decoder`: basic types and media handlers.

:data:`decoders` maps an extension (the part of the field name after its last dot,
case-sensitive, as in webdataset 1.0.2) to a function ``bytes -> value``; :data:`basichandlers`
is the handler that applies it. Beyond webdataset's table, ``class``, ``count``, ``msgpack``
and ``tenbin`` are decoded too (webdataset's writer produces them), and ``cbor`` uses
``cbor2``. Optional packages are imported on first use; when missing, a
:class:`~wds_cloud.errors.MissingDependencyError` names the extra to install.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import numpy as np

from ..errors import DecodingError, MissingDependencyError
from ..settings import Settings
from ..utils import refuses_code, why_refused

__all__ = [
    "DecodingError",
    "basichandlers",
    "cbor_loads",
    "decoders",
    "json_loads",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "tenbin_loads",
    "torch_audio",
    "torch_load",
    "torch_loads",
    "torch_video",
    "unpickle_loads",
]


#: webdataset 1.0.2's words for each refusal, kept in ours for code that matches on them
_WEBDATASET_REFUSALS = {
    "unpickling": "Unpickling is not allowed for security reasons when enforce_security is set",
    "torch.load": "torch.loads is not allowed for security reasons when enforce_security is set",
}


def refusal(what: str, key: str | None) -> DecodingError:
    """The error raised instead of running pickle / ``torch.load`` in secure mode (see
    :mod:`wds_cloud.utils` for the switches)."""
    theirs = _WEBDATASET_REFUSALS.get(what)
    return DecodingError(k=key, reason=f"refusing {what}, which can run arbitrary code: "
                                       f"{why_refused()}"
                                       + (f" (webdataset: {theirs})" if theirs else ""))


def guarded(what: str, key: str, secure: bool, load: Callable[[bytes], Any], data: bytes) -> Any:
    """``load(data)``, unless secure mode refuses it: ``secure`` is the decoder's setting, the
    module flag ``wds_cloud.utils.enforce_security`` is read now and wins when set."""
    if refuses_code(secure):
        raise refusal(what, key)
    return load(data)


def _import(module: str, what: str, package: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(what, package, extra) from exc


def torch_load(data: bytes, weights_only: bool = False) -> Any:
    """``torch.load`` bytes onto the CPU, unchecked; ``weights_only`` unless the patchable
    ``wds_cloud.autodecode.pytorch_weights_only`` flag was set to True or False."""
    from . import decoder  # the patchable flag lives there, as in webdataset

    torch = _import("torch", "decoding .pth members", "torch", "torch")
    flag = decoder.pytorch_weights_only
    return torch.load(io.BytesIO(data), weights_only=weights_only if flag is None else flag,
                      map_location="cpu")


# The two decoders below are what code calling them directly gets: each call is a composition
# root of its own and reads WDS_SECURE. A Decoder never calls them: it reads the settings once
# and plans ``guarded(torch_load)`` or ``guarded(pickle.loads)`` in their place (see
# :data:`UNSAFE`). Both read the module flag ``wds_cloud.utils.enforce_security`` on each call.
def torch_loads(data: bytes) -> Any:
    """``torch.load`` bytes onto the CPU; refused when ``WDS_SECURE=1`` or the module flag
    ``wds_cloud.utils.enforce_security`` says so."""
    settings = Settings.from_env()
    if refuses_code(settings.secure):
        raise refusal("torch.load", None)
    return torch_load(data, settings.pytorch_weights_only)


def unpickle_loads(data: bytes) -> Any:
    """``pickle.loads``; refused when ``WDS_SECURE=1`` or the module flag
    ``wds_cloud.utils.enforce_security`` says so."""
    if refuses_code(Settings.from_env().secure):
        raise refusal("unpickling", None)
    return pickle.loads(data)


def tenbin_loads(data: bytes) -> Any:
    """Decode a ``.ten`` buffer into a list of arrays."""
    from .tenbin import decode_buffer

    return decode_buffer(data)


def msgpack_loads(data: bytes) -> Any:
    """Decode MessagePack bytes."""
    return _import("msgpack", "decoding msgpack members", "msgpack", "msgpack").unpackb(data)


def cbor_loads(data: bytes) -> Any:
    """Decode CBOR bytes (with ``cbor2``)."""
    return _import("cbor2", "decoding cbor members", "cbor2", "cbor").loads(data)


_scan_json: Callable[[str, int], tuple[Any, int]] = (
    json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, untyped
)
_JSON_SPACE = " \t\n\r"


def json_loads(data: bytes) -> Any:
    """``json.loads(data)``, about 4x faster for the usual case of small UTF-8 documents."""
    try:
        text = data.decode("utf-8")
        obj, end = _scan_json(text, 0)
    except (StopIteration, ValueError):
        # leading space, BOM, UTF-16/32, lone surrogates or invalid JSON: the exact
        # behaviour (and error message) of json.loads
        return json.loads(data)
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        return json.loads(data)
    return obj


_NPY_MAGIC = b"\x93NUMPY"
# dtype, shape, order, offset of the data, item count
_NpyLayout = tuple[Any, tuple[int, ...], Literal["C", "F"], int, int]
_NPY_HEADERS: dict[bytes, _NpyLayout] = {}  # header bytes -> layout
_NPY_HEADERS_MAX = 1024


def _npy_layout(data: bytes) -> _NpyLayout | None:
    """``(dtype, shape, order, offset, count)`` of an ``.npy`` blob, cached by its header.

    Arrays of one dataset share a few headers; numpy parses each with ``ast.literal_eval``,
    which costs far more than the copy of a small array. Object arrays give ``None``.
    """
    if not data.startswith(_NPY_MAGIC) or len(data) < 10:
        return None
    width = 2 if data[6] == 1 else 4
    end = 8 + width + int.from_bytes(data[8:8 + width], "little")
    header = data[:end]
    cached = _NPY_HEADERS.get(header)
    if cached is not None:
        return cached
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    if version not in ((1, 0), (2, 0)):
        return None
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(stream)
    if dtype.hasobject or stream.tell() != end:
        return None
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    layout: _NpyLayout = (dtype, shape, "F" if fortran else "C", end, count)
    if len(_NPY_HEADERS) < _NPY_HEADERS_MAX:
        _NPY_HEADERS[header] = layout
    return layout


def npy_loads(data: bytes) -> Any:
    """Decode ``.npy`` bytes (object arrays refused, as ``numpy.load`` does by default).

    The result is a writable array of its own, like ``numpy.load``'s.
    """
    layout = _npy_layout(data)
    if layout is None:
        return np.lib.format.read_array(io.BytesIO(data))
    dtype, shape, order, offset, count = layout
    if len(data) - offset < count * dtype.itemsize:
        return np.lib.format.read_array(io.BytesIO(data))  # numpy's own error for short data
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order=order).copy(order="K")


def npz_loads(data: bytes) -> dict[str, Any]:
    """Decode ``.npz`` bytes into a dict of arrays."""
    with np.load(io.BytesIO(data)) as archive:
        return dict(archive)


#: Extension (after the last dot, case-sensitive) -> decoder, used by :data:`basichandlers`.
decoders: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), bytes.decode),
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), int),
    **dict.fromkeys(("json", "jsn"), json_loads),
    **dict.fromkeys(("pkl", "pickle", "pyd"), unpickle_loads),
    "pth": torch_loads,
    **dict.fromkeys(("ten", "tb", "tenbin"), tenbin_loads),
    **dict.fromkeys(("mp", "msg", "msgpack"), msgpack_loads),
    "npy": npy_loads,
    "npz": npz_loads,
    "cbor": cbor_loads,
}

#: decoders that read WDS_SECURE per call -> (what they do, the same without the check);
#: a Decoder decides once at construction instead.
UNSAFE: dict[Callable[[bytes], Any], tuple[str, Callable[..., Any]]] = {
    unpickle_loads: ("unpickling", pickle.loads),
    torch_loads: ("torch.load", torch_load),
}


class _BasicHandlers:
    """Handler for the basic types of :data:`decoders` (text, ints, json, npy, pickle, ...)."""

    def _wds_plan(self, key: str) -> Callable[[bytes], Any] | None:
        return decoders.get(key.rpartition(".")[2])

    def __call__(self, key: str, data: bytes) -> Any:
        fn = self._wds_plan(key)
        return None if fn is None else fn(data)

    def __reduce__(self) -> str:
        return "basichandlers"

    def __repr__(self) -> str:
        return "basichandlers"


basichandlers = _BasicHandlers()

_VIDEO_EXTENSIONS = frozenset(("mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv"))
_AUDIO_EXTENSIONS = frozenset(("flac", "mp3", "sox", "wav", "m4a", "ogg", "wma"))


def _via_tempfile(extension: str, data: bytes, read: Callable[[str], Any]) -> Any:
    with tempfile.TemporaryDirectory() as dirname:
        fname = os.path.join(dirname, f"file.{extension}")
        with open(fname, "wb") as stream:
            stream.write(data)
        return read(fname)


def torch_video(key: str, data: bytes) -> Any:
    """Handler decoding video members with ``torchvision.io.read_video`` (extra ``video``)."""
    extension = key.rpartition(".")[2]
    if extension not in _VIDEO_EXTENSIONS:
        return None
    tvio = _import("torchvision.io", "video decoding (torch_video)", "torchvision", "video")
    return _via_tempfile(extension, data, partial(tvio.read_video, pts_unit="sec"))


def torch_audio(key: str, data: bytes) -> Any:
    """Handler decoding audio members with ``torchaudio.load`` (extra ``audio``)."""
    extension = key.rpartition(".")[2]
    if extension not in _AUDIO_EXTENSIONS:
        return None
    torchaudio = _import("torchaudio", "audio decoding (torch_audio)", "torchaudio", "audio")
    return _via_tempfile(extension, data, torchaudio.load)
