"""A stand-in for webdataset's ``testdata/imagenet-000000.tgz``, built when the suite runs.

The real shard (ImageNet samples) is not in the repository snapshot we vendored from, nor in
webdataset's sdist, so the suite reads a shard of the same layout: 47 samples, each with
``cls`` (a class number as text), ``png`` (an RGB image; the first one 600x793, the size the
tests check), ``wnid`` and ``xml``, gzip-compressed. The pixels are a deterministic pattern,
small images after the first, so the suite stays fast.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

NSAMPLES = 47
FIRST_SIZE = (600, 793)  # PIL's (width, height): the tests expect an array of (793, 600, 3)


def _png(index: int, size: tuple[int, int]) -> bytes:
    import numpy as np
    from PIL import Image

    width, height = size
    ys, xs = np.mgrid[0:height, 0:width]
    pixels = np.stack([(xs * 255) // max(width - 1, 1), (ys * 255) // max(height - 1, 1),
                       np.full_like(xs, (index * 37) % 256)], axis=-1).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG", compress_level=1)
    return out.getvalue()


def _members(index: int) -> dict[str, bytes]:
    wnid = f"n{1440764 + index * 1000:08d}"
    size = FIRST_SIZE if index == 0 else (32 + index % 7 * 8, 24 + index % 5 * 8)
    xml = (f"<annotation><filename>{wnid}_{index}</filename><size><width>{size[0]}</width>"
           f"<height>{size[1]}</height><depth>3</depth></size></annotation>\n")
    return {"cls": str(index * 21 % 1000).encode(), "png": _png(index, size),
            "wnid": wnid.encode(), "xml": xml.encode()}


def build(path: Path) -> Path:
    """Write the stand-in shard to ``path`` and return it."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for index in range(NSAMPLES):
            key = f"n{1440764 + index * 1000:08d}_{index:05d}"
            for ext, data in _members(index).items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_600_000_000
                tar.addfile(info, io.BytesIO(data))
    return path
