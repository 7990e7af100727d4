"""Writing small tar shards for tests, with Python's tarfile (an independent writer)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path


def write_tar(path: Path, samples: Iterable[tuple[str, Mapping[str, bytes]]]) -> str:
    """Write ``(key, {suffix: data})`` samples as members ``key.suffix``; returns the path."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)
