"""Writing small tar shards for tests, with Python's tarfile (an independent writer)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


def write_tar(path: Path, samples: Iterable[tuple[str, Mapping[str, bytes]]]) -> str:
    """Write ``(key, {suffix: data})`` samples as members ``key.suffix``; returns the path."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def put_source(store: Any, tmp: Path, folder: str, name: str, shards: int, per_shard: int,
               members: Callable[[str, int, int], Mapping[str, bytes]]) -> str:
    """Write ``shards`` tar shards of ``per_shard`` samples (keys ``<name><shard>-<i>``, members
    from ``members(name, shard, i)``) to ``store`` under ``folder/``; their brace pattern."""
    for s in range(shards):
        path = tmp / f"{name}-{s}.tar"
        write_tar(path, [(f"{name}{s:02d}-{i:04d}", members(name, s, i))
                         for i in range(per_shard)])
        store.put(f"{folder}/{name}-{s:03d}.tar", path.read_bytes())
    return str(store.url(f"{folder}/{name}-{{000..{shards - 1:03d}}}.tar"))
