"""A shard resumed at a byte offset, then saved and resumed again: the offsets its reader
records count from the shard's start."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from wds_cloud.tar.shardloop import ShardCursor, samples_from_shards


@pytest.mark.parametrize("where", ["file", "stream"])
def test_offsets_count_from_the_shards_start(tmp_path: Path, where: str) -> None:
    """The offsets a reader records count from the shard's start, not from where a resumed
    stream began: a job preempted twice in one shard resumes where it stopped."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(40):
            for ext, size in (("txt", 300 + i), ("bin", 70_000 if i % 7 == 0 else 20)):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = size
                tar.addfile(info, io.BytesIO(bytes([i]) * size))
    blob = out.getvalue()
    (tmp_path / "a.tar").write_bytes(blob)

    def open_stream(url: str, offset: int = 0) -> io.BufferedIOBase:
        if where == "stream":  # a ranged read of a remote shard
            return io.BytesIO(blob[offset:])
        f = open(url, "rb")  # noqa: SIM115 (closed by the reader, as an opener's stream)
        f.seek(offset)
        return f

    def keys_and_offsets(item: dict[str, object]) -> list[tuple[str, int]]:
        cursor = ShardCursor()
        return [(s["__key__"], cursor.next_offset())
                for s in samples_from_shards([item], open_stream=open_stream, cursor=cursor)]

    url = str(tmp_path / "a.tar")
    whole = keys_and_offsets({"url": url})
    once = keys_and_offsets({"url": url, "offset": whole[9][1], "ordinal": 10})
    assert once == whole[10:]
    twice = keys_and_offsets({"url": url, "offset": once[12][1], "ordinal": 23})
    assert twice == whole[23:]
