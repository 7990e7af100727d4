"""Image decoding for :class:`wds_cloud.codecs.decoder.Decoder`: ``ImageHandler`` and its specs.

An image spec names the result type, the element type and the colour mode, exactly as in
webdataset 1.0.2 (``"rgb8"`` is a ``uint8`` numpy array HxWx3, ``"torchrgb"`` a float tensor
3xHxW in [0, 1], ``"pil"`` a ``PIL.Image.Image`` in RGB, ...). Pillow and torch are imported
on first use; when missing, a :class:`~wds_cloud.errors.MissingDependencyError` names the
extra to install.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import ConfigError, MissingDependencyError

__all__ = ["IMAGE_EXTENSIONS", "ImageHandler", "imagehandler", "imagespecs"]

#: Extensions handed to the image decoder (Pillow's readable formats, as in webdataset).
IMAGE_EXTENSIONS: tuple[str, ...] = (
    "blp", "bmp", "dib", "bufr", "cur", "pcx", "dcx", "dds", "ps", "eps", "fit", "fits", "fli",
    "flc", "ftc", "ftu", "gbr", "gif", "grib", "h5", "hdf", "png", "apng", "jp2", "j2k", "jpc",
    "jpf", "jpx", "j2c", "icns", "ico", "im", "iim", "tif", "tiff", "jfif", "jpe", "jpg", "jpeg",
    "mpg", "mpeg", "msp", "pcd", "pxr", "pbm", "pgm", "ppm", "pnm", "psd", "bw", "rgb", "rgba",
    "sgi", "ras", "tga", "icb", "vda", "vst", "webp", "wmf", "emf", "xbm", "xpm"
)

#: spec -> (array type, element type, mode), as webdataset's ``autodecode.imagespecs``.
imagespecs: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}

_PIL_MODES = {"l": "L", "rgb": "RGB", "rgba": "RGBA"}


def _open_image(data: bytes, mode: str) -> Any:
    try:
        import PIL.Image
    except ImportError as exc:
        raise MissingDependencyError("image decoding", "Pillow", "image") from exc
    with io.BytesIO(data) as stream:
        img = PIL.Image.open(stream)
        img.load()
        return img.convert(mode)


def _to_torch(array: np.ndarray) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("decoding images to tensors", "torch", "torch") from exc
    if array.ndim == 3:
        array = array.transpose(2, 0, 1)
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:  # Pillow's buffer: torch wants memory it may write
        array = array.copy()
    return torch.from_numpy(array)


class ImageHandler:
    """Decode image members (by extension) according to an image spec.

    ``ImageHandler(spec, extensions=IMAGE_EXTENSIONS)`` is a handler ``(key, data) -> value |
    None``: it returns ``None`` (not mine) unless the part of ``key`` after its last dot,
    lower-cased, is one of ``extensions``. Numpy results are HxW (``l``) or HxWxC; torch
    results are HxW or CxHxW; float results are ``float32`` in [0, 1].
    """

    def __init__(self, imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        spec = imagespec.lower() if isinstance(imagespec, str) else imagespec
        if spec not in imagespecs:
            raise ConfigError(
                f"unknown image spec {imagespec!r}; use one of {', '.join(imagespecs)}"
            )
        if isinstance(extensions, str):
            extensions = extensions.split()
        self.imagespec: str = spec
        self.extensions: frozenset[str] = frozenset(e.lower() for e in extensions)
        atype, etype, mode = imagespecs[spec]
        self._atype = atype
        self._float = etype == "float"
        self._pil_mode = _PIL_MODES[mode]

    def decode_image(self, data: bytes) -> Any:
        """Decode image bytes (any extension) according to this handler's spec."""
        img = _open_image(data, self._pil_mode)
        if self._atype == "pil":
            return img
        result = np.asarray(img)
        if self._float:
            result = result.astype(np.float32)
            result /= 255.0
        if self._atype == "torch":
            return _to_torch(result)
        return result

    def _wds_plan(self, key: str) -> Callable[[bytes], Any] | None:
        """The function that decodes members named ``key``, or ``None`` if they are not ours."""
        return self.decode_image if key.rpartition(".")[2].lower() in self.extensions else None

    def __call__(self, key: str, data: bytes) -> Any:
        """Decode ``data`` if ``key``'s extension is an image extension, else return ``None``."""
        return self.decode_image(data) if self._wds_plan(key) is not None else None

    def __repr__(self) -> str:
        return f"ImageHandler({self.imagespec!r})"


def imagehandler(imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    """Lower-case alias of :class:`ImageHandler`, as in webdataset."""
    return ImageHandler(imagespec, extensions)
