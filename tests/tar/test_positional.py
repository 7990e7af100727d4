"""Local files are read with positional reads (:mod:`wds_cloud.tar.positional`), or as views
of a memory map with ``zero_copy``: the same members, offsets and errors as the streaming
reader gives for the same bytes."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from wds_cloud.errors import ShardFormatError
from wds_cloud.tar import positional
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


def _read(stream: io.RawIOBase | io.BufferedIOBase, zero_copy: bool = False,
          ) -> list[tuple[str, bytes | memoryview, int]]:
    marks = [(0, 0, [], False)]
    out = []
    for batch in iter_member_batches(stream, marks=marks, chunk_size=1 << 20,  # type: ignore[arg-type]
                                     zero_copy=zero_copy):
        out += [(name, data, member_start(marks[0], batch, j))
                for j, (name, data) in enumerate(batch)]
    return out


def test_a_local_file_reads_as_a_stream(tmp_path: Path) -> None:
    blob = _mixed()
    path = tmp_path / "a.tar"
    path.write_bytes(blob)
    with open(path, "rb") as f:
        assert positional.positional(f) is not None
    expected = _read(io.BytesIO(blob))
    assert len(expected) > 600
    with open(path, "rb") as f:
        assert _read(f) == expected
        assert expected[-1][2] < f.tell() < len(blob)  # left where reading stopped
    with open(path, "rb", buffering=0) as f:
        assert _read(f) == expected
    # from an offset (a resumed shard): offsets count from there, as for any stream
    start = expected[5][2]
    with open(path, "rb") as f:
        f.seek(start)
        assert _read(f) == _read(io.BytesIO(blob[start:]))


def test_zero_copy_gives_views_of_the_same_bytes(tmp_path: Path) -> None:
    blob = _mixed()
    path = tmp_path / "a.tar"
    path.write_bytes(blob)
    expected = _read(io.BytesIO(blob))
    with open(path, "rb") as f:
        views = _read(f, zero_copy=True)
    assert {type(data) for _, data, _ in views} == {memoryview}
    assert [(n, bytes(d), at) for n, d, at in views] == expected
    path.unlink()  # the views keep the map (and so the file's bytes) alive
    assert bytes(views[4][1]) == expected[4][1]
    start = expected[5][2]  # from an offset, too
    with open(tmp_path / "b.tar", "wb") as f:
        f.write(blob)
    with open(tmp_path / "b.tar", "rb") as f:
        f.seek(start)
        assert [(n, bytes(d), at) for n, d, at in _read(f, zero_copy=True)] == \
            _read(io.BytesIO(blob[start:]))
    # a stream that is no plain file gives bytes
    assert {type(d) for _, d, _ in _read(io.BytesIO(blob), zero_copy=True)} == {bytes}


def test_large_members_never_pass_through_a_window(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard of images with a small .json and .cls each: the windows read are a small
    part of the file (the images' bytes are read on their own, once)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(40):
            for ext, size in (("jpg", 100_000 + i), ("json", 90), ("cls", 2)):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = size
                tar.addfile(info, io.BytesIO(bytes([i]) * size))
    (tmp_path / "img.tar").write_bytes(out.getvalue())
    windows: list[int] = []
    window = positional.FileRead.window

    def counted(self: positional.FileRead, offset: int, n: int) -> bytes:
        data = window(self, offset, n)
        windows.append(len(data))
        return data

    monkeypatch.setattr(positional.FileRead, "window", counted)
    with open(tmp_path / "img.tar", "rb") as f:
        got = _read(f)
    assert got == _read(io.BytesIO(out.getvalue()))
    assert len(got) == 120
    assert sum(windows) < len(out.getvalue()) / 5, windows


def test_what_is_read_as_a_stream(tmp_path: Path) -> None:
    zipped = tmp_path / "a.tar.gz"
    zipped.write_bytes(gzip.compress(_mixed()))
    with open(zipped, "rb") as f:
        assert positional.positional(f) is None
        assert _read(f) == _read(io.BytesIO(_mixed()))
    with open(tmp_path / "a.tar.gz", "rb") as f:
        f.seek(3)
        assert positional.positional(f) is None  # not at a block boundary
    assert positional.positional(io.BytesIO(_mixed())) is None
    small = tmp_path / "small.tar"  # any regular file, however small, is read positionally
    with tarfile.open(small, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("s0.a", "s0.b"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    with open(small, "rb") as f:
        assert positional.positional(f) is not None
        assert [(name, data) for name, data, _ in _read(f)] == [("s0.a", b"abc"),
                                                                ("s0.b", b"abc")]


@pytest.mark.parametrize(("member", "into"),
                         [(4, 300), (4, 512 + 2_000_000), (4, 512 + (3 << 20) + 6),
                          (2, 512 + 100_000 + 10), (-3, 512 + 100)],
                         ids=["header", "large-data", "large-padding", "small-padding",
                              "small-run-data"])
@pytest.mark.parametrize("zero_copy", [False, True], ids=["bytes", "views"])
def test_a_cut_file_raises_after_the_whole_members(tmp_path: Path, member: int,
                                                     into: int, zero_copy: bool) -> None:
    blob = _mixed()
    cut = blob[:_read(io.BytesIO(blob))[member][2] + into]
    path = tmp_path / "cut.tar"
    path.write_bytes(cut)
    got: list[str] = []
    with open(path, "rb") as f, pytest.raises(ShardFormatError) as mine:
        for batch in iter_member_batches(f, zero_copy=zero_copy):
            got += [name for name, _ in batch]
    theirs: list[str] = []
    with pytest.raises(ShardFormatError) as other:
        for batch in iter_member_batches(io.BytesIO(cut)):
            theirs += [name for name, _ in batch]
    assert got == theirs
    assert (mine.value.member, mine.value.offset) == (other.value.member, other.value.offset)

