"""Encoding sample fields to bytes by extension, as webdataset 1.0.2's ``writer`` does.

:func:`make_encoder` turns TarWriter's ``encoder=`` argument into a function ``sample ->
sample of bytes``: ``True`` encodes by extension with :data:`default_handlers`, a dict uses
that extension -> function table, a callable is used as is, ``False``/``None`` leaves values
alone. By extension: ``bytes`` are stored as they are and ``str`` as UTF-8 whatever the
extension; other values go to the handler of the field's last extension (lower-cased);
``x.gz`` fields are encoded as ``x`` then gzip-compressed. Metadata fields (``_*``) must be
``str``.

Unlike webdataset, output is reproducible (gzip and ``.npz`` carry no timestamps), ``pbm`` /
``pgm`` / ``pnm`` work (webdataset asks Pillow for formats it does not have), float images are
rounded, not truncated, to 8 bits, and ``pkl``, ``pnm``, ``webp`` and ``bmp`` are encoded too.
"""

from __future__ import annotations

import gzip
import importlib
import io
import json
import pickle
import zipfile
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from ..errors import ConfigError, EncodingError, MissingDependencyError

__all__ = [
    "EncodingError",
    "add_handlers",
    "bytestr",
    "cbor_dumps",
    "default_handlers",
    "encode_based_on_extension",
    "encode_based_on_extension1",
    "imageencoder",
    "make_encoder",
    "make_handlers",
    "mp_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "torch_dumps",
]

Encoder = Callable[[dict[str, Any]], dict[str, Any]]
EncoderSpec = bool | None | Mapping[str, Callable[[Any], bytes]] | Encoder
_BYTES_LIKE = (bytes, bytearray, memoryview)
# format names webdataset uses -> (Pillow format, mode to convert to first)
_IMAGE_FORMATS: dict[str, tuple[str, str | None]] = {
    "JPG": ("JPEG", None), "JPEG": ("JPEG", None), "IMG": ("PPM", None), "IMAGE": ("PPM", None),
    "PBM": ("PPM", "1"), "PGM": ("PPM", "L"), "PNM": ("PPM", None), "TIF": ("TIFF", None),
}


def _import(module: str, what: str, package: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(what, package, extra) from exc


def _to_pil(image: Any, pil_image: Any) -> Any:
    if isinstance(image, pil_image.Image):
        return image
    if not isinstance(image, np.ndarray):
        raise TypeError(f"an image must be a PIL image or a numpy array, got {type(image)}")
    if image.dtype.kind == "f":
        lo, hi = float(np.amin(image)), float(np.amax(image))
        if lo <= -0.001 or hi >= 1.001:
            raise ValueError(f"float image values must lie in [0, 1], got [{lo}, {hi}]")
        # truncated, not rounded: webdataset's bytes for the same array
        image = (np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
        raise ValueError(f"an image array must be HxW, HxWx3 or HxWx4, got shape {image.shape}")
    return pil_image.fromarray(image)


def imageencoder(image: Any, format: str = "PNG") -> bytes:
    """Compress a PIL image or a numpy array (uint8, or float in [0, 1]) with Pillow.

    ``format`` is a Pillow format or one of webdataset's names (``jpg``, ``img``, ``pbm``...);
    JPEG is written at quality 100, as in webdataset.
    """
    pil_image = _import("PIL.Image", "image encoding", "Pillow", "image")
    img = _to_pil(image, pil_image)
    fmt, mode = _IMAGE_FORMATS.get(format.upper(), (format.upper(), None))
    if mode is not None and img.mode != mode:
        img = img.convert(mode)
    opts = {"quality": 100} if fmt == "JPEG" else {}
    with io.BytesIO() as result:
        img.save(result, format=fmt, **opts)
        return result.getvalue()


def bytestr(data: Any) -> bytes:
    """``data`` as bytes: bytes as is, anything else through ``str`` and ASCII."""
    if isinstance(data, bytes):
        return data
    return (data if isinstance(data, str) else str(data)).encode("ascii")


def torch_dumps(data: Any) -> bytes:
    """``torch.save`` into bytes."""
    torch = _import("torch", "encoding .pth fields", "torch", "torch")
    stream = io.BytesIO()
    torch.save(data, stream)
    return stream.getvalue()


def numpy_dumps(data: Any) -> bytes:
    """An array as ``.npy`` bytes."""
    stream = io.BytesIO()
    np.lib.format.write_array(stream, np.asanyarray(data))
    return stream.getvalue()


def numpy_npz_dumps(data: Mapping[str, Any]) -> bytes:
    """A dict of arrays as compressed ``.npz`` bytes, with fixed zip timestamps."""
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise TypeError(f"npz needs a dict of str -> array, got {type(data).__name__}")
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, value in data.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o600 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value))
    return stream.getvalue()


def tenbin_dumps(x: Any) -> bytes:
    """An array, or a list of arrays, in the ``.ten`` format."""
    from .tenbin import encode_buffer

    return encode_buffer(x if isinstance(x, list) else [x])


def cbor_dumps(x: Any) -> bytes:
    """CBOR bytes (with ``cbor2``)."""
    return bytes(_import("cbor2", "encoding cbor fields", "cbor2", "cbor").dumps(x))


def mp_dumps(x: Any) -> bytes:
    """MessagePack bytes."""
    return bytes(_import("msgpack", "encoding msgpack fields", "msgpack", "msgpack").packb(x))


def _int_bytes(x: Any) -> bytes:
    return str(x).encode("ascii")


def _text_bytes(x: Any) -> bytes:
    if not isinstance(x, str):
        raise TypeError(f"a text field needs str, got {type(x).__name__}")
    return x.encode("utf-8")


def _json_bytes(x: Any) -> bytes:
    return json.dumps(x).encode("utf-8")


def add_handlers(d: dict[str, Any], keys: str | list[str], value: Callable[[Any], Any]) -> None:
    """Map each of ``keys`` (a list or a space-separated string) to ``value`` in ``d``."""
    for k in keys.split() if isinstance(keys, str) else keys:
        d[k] = value


def make_handlers() -> dict[str, Callable[[Any], bytes]]:
    """A fresh extension -> encoder table (the one ``encoder=True`` uses)."""
    handlers: dict[str, Callable[[Any], bytes]] = {}
    add_handlers(handlers, "cls cls2 class count index inx id", _int_bytes)
    add_handlers(handlers, "txt text transcript html htm", _text_bytes)
    add_handlers(handlers, "pyd pickle pkl", pickle.dumps)
    add_handlers(handlers, "pth", torch_dumps)
    add_handlers(handlers, "npy", numpy_dumps)
    add_handlers(handlers, "npz", numpy_npz_dumps)
    add_handlers(handlers, "ten tenbin tb", tenbin_dumps)
    add_handlers(handlers, "json jsn", _json_bytes)
    add_handlers(handlers, "mp msgpack msg", mp_dumps)
    add_handlers(handlers, "cbor", cbor_dumps)
    add_handlers(handlers, "jpg jpeg img image", partial(imageencoder, format="jpg"))
    for ext in ("png", "pbm", "pgm", "ppm", "pnm", "webp", "bmp"):
        add_handlers(handlers, ext, partial(imageencoder, format=ext))
    add_handlers(handlers, "tiff tif", partial(imageencoder, format="tiff"))
    return handlers


default_handlers = make_handlers()


def encode_based_on_extension1(
    data: Any, tname: str, handlers: Mapping[str, Callable[[Any], Any]]
) -> Any:
    """Encode one field named ``tname``; raise :class:`EncodingError` naming it."""
    if tname[:1] == "_":
        if not isinstance(data, str):
            raise EncodingError(f"metadata field {tname!r} must be str, got {type(data).__name__}")
        return data
    compress = tname.endswith(".gz")
    name = tname[:-3] if compress else tname
    if isinstance(data, _BYTES_LIKE):
        result = data
    elif isinstance(data, str):
        result = data.encode("utf-8")
    else:
        extension = name.rpartition(".")[2].lower()
        handler = handlers.get(extension)
        if handler is None:
            raise EncodingError(
                f"no encoder for field {tname!r} ({type(data).__name__}): store bytes or str, "
                f"or pass encoder= a dict with an entry for {extension!r}"
            )
        try:
            result = handler(data)
        except MissingDependencyError:
            raise
        except Exception as exc:
            raise EncodingError(
                f"cannot encode field {tname!r} ({type(data).__name__}) as {extension!r}: {exc}"
            ) from exc
    return gzip.compress(result, mtime=0) if compress else result


def encode_based_on_extension(
    sample: Mapping[str, Any], handlers: Mapping[str, Callable[[Any], Any]]
) -> dict[str, Any]:
    """Encode every field of ``sample`` with :func:`encode_based_on_extension1`."""
    return {
        k: v if v.__class__ is bytes and k[:1] != "_" and not k.endswith(".gz")
        else encode_based_on_extension1(v, k, handlers)
        for k, v in sample.items()
    }


def _identity(sample: dict[str, Any]) -> dict[str, Any]:
    return sample


def make_encoder(spec: EncoderSpec) -> Encoder:
    """Turn TarWriter's ``encoder=`` (``True``, ``False``/``None``, a dict or a callable) into
    a function ``sample -> sample``."""
    if spec is False or spec is None:
        return _identity
    if spec is True:
        return partial(encode_based_on_extension, handlers=default_handlers)
    if isinstance(spec, Mapping):
        return partial(encode_based_on_extension, handlers=dict(spec))
    if callable(spec):
        return spec
    raise ConfigError(
        f"encoder={spec!r} is not understood: pass True (encode by extension), False (values "
        "are bytes already), a dict of extension -> function, or a function sample -> sample"
    )
