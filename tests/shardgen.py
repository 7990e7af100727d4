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


def three_source_spec(s3: Any, gs: Any, tmp: Path, folder: str, *, seed: int,
                      sizes: tuple[tuple[int, int], ...],
                      members: Callable[[str, int, int], Mapping[str, bytes]]) -> Path:
    """A spec file of three sources, ``a`` and ``b`` on the ``s3`` store and ``c`` on ``gs``,
    weighted 0.5 / 0.3 (scale 0.5-1.5) / 0.2; ``sizes``: (shards, samples per shard) each."""
    import yaml

    (na, pa), (nb, pb), (nc, pc) = sizes
    spec = {
        "seed": seed,
        "storage_options": {**s3.storage_options, **gs.storage_options},
        "datasets": [
            {"name": "a", "shards": put_source(s3, tmp, folder, "a", na, pa, members),
             "weight": 0.5},
            {"name": "b", "shards": put_source(s3, tmp, folder, "b", nb, pb, members),
             "weight": 0.3, "scale": [0.5, 1.5]},
            {"name": "c", "shards": put_source(gs, tmp, folder, "c", nc, pc, members),
             "weight": 0.2},
        ],
    }
    path = tmp / "three.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
