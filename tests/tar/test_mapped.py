"""Local files are read through a memory map (:mod:`wds_cloud.tar.mapped`): the same members,
offsets and errors as the streaming reader gives for the same bytes."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from wds_cloud.errors import ShardFormatError
from wds_cloud.tar import mapped
from wds_cloud.tar.reader import iter_member_batches, member_start


def _mixed() -> bytes:
    """Small, large (past the 1 MiB window), long-named and pax members, in runs."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        sizes = [3, 700, 100_000, 2, (3 << 20) + 5, *([4096, 90] * 300), 70_000, 0, 1]
        for i, size in enumerate(sizes):
            name = f"s{i // 2:05d}.{'ab'[i % 2]}" if i % 97 else f"{'d' * 120}/s{i:05d}.x"
            info = tarfile.TarInfo(name)
            info.size = size
            if i == 7:
                info.pax_headers = {"comment": "é" * 40}
            tar.addfile(info, io.BytesIO(bytes([i % 251]) * size))
    return out.getvalue()


def _read(stream: io.RawIOBase | io.BufferedIOBase) -> list[tuple[str, bytes, int]]:
    marks = [(0, 0, [], False)]
    out = []
    for batch in iter_member_batches(stream, marks=marks, chunk_size=1 << 20):  # type: ignore[arg-type]
        out += [(name, data, member_start(marks[0], batch, j))
                for j, (name, data) in enumerate(batch)]
    return out


def test_a_local_file_is_mapped_and_reads_as_a_stream(tmp_path: Path) -> None:
    blob = _mixed()
    path = tmp_path / "a.tar"
    path.write_bytes(blob)
    with open(path, "rb") as f:
        m = mapped.map_file(f)
        assert m is not None
        m.close()
    expected = _read(io.BytesIO(blob))
    assert len(expected) > 600
    with open(path, "rb") as f:
        assert _read(f) == expected
    with open(path, "rb", buffering=0) as f:
        assert _read(f) == expected
    # from an offset (a resumed shard): offsets count from there, as for any stream
    start = expected[5][2]
    with open(path, "rb") as f:
        f.seek(start)
        assert _read(f) == _read(io.BytesIO(blob[start:]))


def test_what_is_not_mapped(tmp_path: Path) -> None:
    small = tmp_path / "small.tar"
    small.write_bytes(_mixed()[:4096])
    zipped = tmp_path / "a.tar.gz"
    zipped.write_bytes(gzip.compress(_mixed()))
    with open(small, "rb") as f:
        assert mapped.map_file(f) is None  # too small to pay
    with open(zipped, "rb") as f:
        assert mapped.map_file(f) is None
        assert _read(f) == _read(io.BytesIO(_mixed()))
    with open(tmp_path / "a.tar.gz", "rb") as f:
        f.seek(3)
        assert mapped.map_file(f) is None  # not at a block boundary
    assert mapped.map_file(io.BytesIO(_mixed())) is None
    # large members only: exact reads pay better than a map
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, size in enumerate((100_000, 70_000, 3)):
            info = tarfile.TarInfo(f"s{i}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    (tmp_path / "large.tar").write_bytes(out.getvalue())
    with open(tmp_path / "large.tar", "rb") as f:
        assert mapped.map_file(f) is None
        assert [name for batch in iter_member_batches(f) for name, _ in batch] == \
            ["s0.bin", "s1.bin", "s2.bin"]


@pytest.mark.parametrize(("member", "into"), [(4, 300), (4, 512 + 2_000_000), (-3, 512 + 100)],
                         ids=["header", "large-data", "small-run-data"])
def test_a_cut_file_raises_after_the_whole_members(tmp_path: Path, member: int,
                                                     into: int) -> None:
    blob = _mixed()
    cut = blob[:_read(io.BytesIO(blob))[member][2] + into]
    path = tmp_path / "cut.tar"
    path.write_bytes(cut)
    got: list[str] = []
    with open(path, "rb") as f, pytest.raises(ShardFormatError) as mine:
        for batch in iter_member_batches(f):
            got += [name for name, _ in batch]
    theirs: list[str] = []
    with pytest.raises(ShardFormatError) as other:
        for batch in iter_member_batches(io.BytesIO(cut)):
            theirs += [name for name, _ in batch]
    assert got == theirs
    assert (mine.value.member, mine.value.offset) == (other.value.member, other.value.offset)
