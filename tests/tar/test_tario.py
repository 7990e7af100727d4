"""The streaming tar reader and grouping into samples, checked against Python's tarfile and
webdataset 1.0.2 on archives the tests write themselves."""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import lzma
import os
import shutil
import subprocess
import tarfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import webdataset

import wds_cloud
from wds_cloud.errors import OpenError, PipeError, ShardFormatError, ShardNotFoundError
from wds_cloud.handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
)
from wds_cloud.tar import reader as tarformat
from wds_cloud.tar import samples as tario
from wds_cloud.tar.shardloop import samples_from_shards

Entry = tuple[str, Any]  # (name, bytes) for a file, or (name, Special(type)) for others


class Special:
    """A non-regular member of the given tarfile type."""

    def __init__(self, kind: bytes) -> None:
        self.kind = kind


DIR, SYM, LNK = Special(tarfile.DIRTYPE), Special(tarfile.SYMTYPE), Special(tarfile.LNKTYPE)
FIFO, CHR, BLK = Special(tarfile.FIFOTYPE), Special(tarfile.CHRTYPE), Special(tarfile.BLKTYPE)


# ---------------------------------------------------------------------------------- helpers

def tar_bytes(entries: Iterable[Entry], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar archive written by Python's tarfile; non-bytes values are TarInfo types."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, value in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if isinstance(value, bytes):
                info.size = len(value)
                tf.addfile(info, io.BytesIO(value))
            else:
                info.type = value.kind
                if value.kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    info.linkname = "target-" + "z" * (120 if fmt != tarfile.USTAR_FORMAT else 9)
                tf.addfile(info)
    return out.getvalue()


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    """Regular members as Python's tarfile reads them in stream mode."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg()]  # type: ignore[union-attr]


def ours_members(data: bytes, chunk_size: int = tarformat.CHUNK_SIZE) -> list[tuple[str, bytes]]:
    stream = io.BytesIO(data)
    return [m for batch in tarformat.iter_member_batches(stream, url="mem://shard.tar",
                                                         chunk_size=chunk_size) for m in batch]


def open_rb(url: str) -> Any:
    return open(url, "rb")


def ours_samples(urls: list[str], **kw: Any) -> list[dict[str, Any]]:
    return list(samples_from_shards([{"url": u} for u in urls], open_stream=open_rb, **kw))


def wds_samples(urls: list[str], **kw: Any) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(webdataset.tarfile_samples([{"url": u} for u in urls], **kw))


def sample_entries(n: int, exts: tuple[str, ...] = ("txt", "cls", "json"), *, seed: int = 0,
                   prefix: str = "s") -> list[Entry]:
    rng = __import__("random").Random(seed)
    return [(f"{prefix}{i:05d}.{ext}", rng.randbytes(rng.randint(0, 700)))
            for i in range(n) for ext in exts]


class ShortReads(io.RawIOBase):
    """A pipe-like stream: each read returns at most ``step`` bytes; records close()."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._step if n < 0 else min(n, self._step)
        out = self._data[self._pos:self._pos + n]
        self._pos += len(out)
        return out


class FailingStream(io.RawIOBase):
    """Serves ``data``, then raises ``exc`` instead of the rest."""

    def __init__(self, data: bytes, exc: BaseException) -> None:
        self._data, self._exc, self._done = data, exc, False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._done:
            raise self._exc
        self._done = True
        return self._data


# ------------------------------------------------------------------------- tar formats

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_match_tarfile(fmt: str) -> None:
    entries: list[Entry] = [
        ("a.txt", b"hello"), ("a.cls", b""), ("dir/b.bin", bytes(512)),
        ("dir/sub/c.json", b"x" * 513), ("d" * 90 + "/" + "e" * 90 + ".txt", b"ustar prefix"),
    ]
    if fmt != "ustar":
        entries += [("l" * 150 + ".txt", b"long name"), ("ünï/cödé.txt", "ü".encode() * 300)]
    data = tar_bytes(entries, FORMATS[fmt])
    expected = [(n, v) for n, v in entries if isinstance(v, bytes)]
    assert tarfile_members(data) == expected
    assert ours_members(data) == expected
    assert ours_members(data, chunk_size=512) == expected
    assert all(type(v) is bytes for _, v in ours_members(data))


def test_gnu_long_names_and_long_links() -> None:
    entries: list[Entry] = [
        ("x" * 300 + ".txt", b"1"), ("link.txt", SYM), ("hard.txt", LNK),
        ("y" * 200 + "/z.cls", b"2"),
    ]
    data = tar_bytes(entries, tarfile.GNU_FORMAT)
    assert b"././@LongLink" in data
    assert ours_members(data) == tarfile_members(data) == [
        ("x" * 300 + ".txt", b"1"), ("y" * 200 + "/z.cls", b"2")]


def test_pax_path_and_size_override() -> None:
    info = tarfile.TarInfo("short.txt")
    info.size = 5
    info.pax_headers = {"path": "a/much/longer/ñame.TXT", "comment": "ignored"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(b"12345"))
    data = out.getvalue()
    assert ours_members(data) == tarfile_members(data) == [("a/much/longer/ñame.TXT", b"12345")]
    # a pax "size" record wins over the header's size field (which is then ignored)
    header = bytearray(data[512:1024])
    pax = b"12 size=300\n"
    xhdr = _header("PaxHeaders/x", len(pax), b"x")
    member = _header("big.bin", 0, b"0")
    body = xhdr + pax.ljust(512, b"\0") + member + b"q" * 300 + bytes(212) + bytes(1024)
    assert ours_members(body) == tarfile_members(body) == [("big.bin", b"q" * 300)]
    assert header  # the real archive above had a pax header too


def test_global_pax_headers_are_skipped() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "global " * 100}) as tf:
        info = tarfile.TarInfo("k.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
    data = out.getvalue()
    assert data[156:157] == b"g"
    assert ours_members(data) == [("k.txt", b"ok")]


def _header(name: str, size: int, kind: bytes, *, magic: bytes = b"ustar\x0000",
            size_field: bytes | None = None) -> bytes:
    """A hand-made header with a valid checksum (for formats tarfile does not write)."""
    h = bytearray(512)
    h[0:len(name.encode())] = name.encode()
    h[100:108] = b"0000644\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:257 + len(magic)] = magic
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def test_v7_headers_and_v7_directories() -> None:
    def member(name: str, data: bytes) -> bytes:
        return _header(name, len(data), b"\0", magic=b"") + data.ljust(-(-len(data) // 512)
                                                                       * 512, b"\0")
    data = (member("olddir/", b"") + member("olddir/a.txt", b"v7 data")
            + member("olddir/a.cls", b"") + bytes(1024))
    assert ours_members(data) == tarfile_members(data) == [
        ("olddir/a.txt", b"v7 data"), ("olddir/a.cls", b"")]


def test_non_regular_members_are_skipped() -> None:
    entries: list[Entry] = [
        ("d", DIR), ("d/a.txt", b"A"), ("d/link", SYM), ("d/hard", LNK), ("d/fifo", FIFO),
        ("d/chr", CHR), ("d/blk", BLK), ("d/a.cls", b"B"),
    ]
    for fmt in FORMATS.values():
        data = tar_bytes(entries, fmt)
        assert ours_members(data) == tarfile_members(data) == [("d/a.txt", b"A"),
                                                               ("d/a.cls", b"B")]


def test_unknown_member_types_have_their_data_skipped() -> None:
    data = (_header("vendor.x", 600, b"V") + b"v" * 600 + bytes(424)
            + _header("a.txt", 3, b"0") + b"abc".ljust(512, b"\0") + bytes(1024))
    assert ours_members(data) == tarfile_members(data) == [("a.txt", b"abc")]


def test_base256_size_field() -> None:
    field = b"\x80" + (1234).to_bytes(11, "big")
    assert tarformat.parse_number(field) == 1234
    assert tarformat.parse_number(b"\xff" * 12) == -1
    data = _header("b256.bin", 0, b"0", size_field=field) + b"z" * 1234 + bytes(302) + bytes(1024)
    assert ours_members(data) == tarfile_members(data) == [("b256.bin", b"z" * 1234)]


# -------------------------------------------------------------------------- compression

@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress],
                         ids=["gzip", "bzip2", "xz"])
def test_compressed_shards(compress: Callable[[bytes], bytes], tmp_path: Path) -> None:
    entries = sample_entries(50)
    data = tar_bytes(entries)
    packed = compress(data)
    assert ours_members(packed) == tarfile_members(packed) == entries
    assert ours_members(packed, chunk_size=1000) == entries
    url = write(tmp_path, "shard.tgz", packed)
    assert ours_samples([url]) == wds_samples([url])


def test_concatenated_gzip_members() -> None:
    entries = sample_entries(40)
    data = tar_bytes(entries)
    cuts = [0, 777, 5000, 20_000, len(data)]  # gzip members split the tar anywhere
    packed = b"".join(gzip.compress(data[a:b]) for a, b in itertools.pairwise(cuts))
    assert ours_members(packed) == entries
    assert list(ShortReadsReader(packed, 97)) == entries
    assert ours_members(packed + bytes(100)) == entries  # zero padding after the last member


def ShortReadsReader(data: bytes, step: int) -> Iterator[tuple[str, bytes]]:
    for batch in tarformat.iter_member_batches(ShortReads(data, step), url="x", chunk_size=700):
        yield from batch


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "garbage-after"])
def test_damaged_gzip_raises_shard_format_error(damage: str) -> None:
    data = tar_bytes(sample_entries(30))
    packed = gzip.compress(data)
    if damage == "truncate":
        packed = packed[: len(packed) // 2]
    elif damage == "corrupt":
        packed = packed[:40] + bytes(b ^ 0x55 for b in packed[40:80]) + packed[80:]
    else:
        packed = gzip.compress(data[:5000]) + b"not gzip at all" + gzip.compress(data[5000:])
    with pytest.raises(ShardFormatError) as info:
        ours_members(packed)
    assert info.value.url == "mem://shard.tar" and info.value.offset is not None


# ----------------------------------------------------------------- samples vs webdataset

@pytest.mark.parametrize("fmt", FORMATS)
def test_samples_match_webdataset(fmt: str, tmp_path: Path) -> None:
    urls = [write(tmp_path, f"shard-{i}.tar",
                  tar_bytes(sample_entries(30, seed=i, prefix=f"d{i}/s" if i else "s"),
                            FORMATS[fmt]))
            for i in range(3)]
    ours = ours_samples(urls)
    assert len(ours) == 90
    assert ours == wds_samples(urls)


@pytest.mark.parametrize("compressed", [False, True])
def test_local_file_read_past_its_buffer_or_with_bytes_in_it(tmp_path: Path,
                                                            compressed: bool) -> None:
    """A local file opened buffered is read through its raw file when its buffer is empty,
    and through the buffer when it holds bytes already (a peek, a caller's own read): every
    member comes out either way, and the stream is left where the archive ended."""
    big = os.urandom(tarformat.DIRECT_MIN * 2 + 5)
    entries: list[Entry] = [("a.bin", big), ("a.cls", b"1"), ("b.bin", big[::-1]),
                            ("b.cls", b"2")]
    data = tar_bytes(entries)
    data = gzip.compress(data) if compressed else data
    path = write(tmp_path, "shard.tgz" if compressed else "shard.tar", b"junk" + data)
    for peek in (False, True):
        with open(path, "rb") as stream:
            assert stream.read(4) == b"junk"
            if peek:
                stream.peek(1)  # the buffer now holds the start of the archive
            members = [m for batch in tarformat.iter_member_batches(stream, url=path)
                       for m in batch]
            assert members == entries
            at = stream.tell()
            assert at <= len(data) + 4
            assert stream.read() == data[at - 4:]


def test_large_members_and_small_chunks(tmp_path: Path) -> None:
    big = os.urandom(tarformat.DIRECT_MIN * 3 + 17)
    entries: list[Entry] = [("a.jpg", big), ("a.cls", b"1"), ("b.jpg", big[::-1]),
                            ("b.cls", b"2"), ("c.bin", big[:tarformat.DIRECT_MIN])]
    data = tar_bytes(entries)
    for chunk in (512, 4096, 100_000, tarformat.CHUNK_SIZE):
        assert ours_members(data, chunk_size=chunk) == entries
    assert list(ShortReadsReader(data, 1000)) == entries
    url = write(tmp_path, "big.tar", data)
    assert ours_samples([url]) == wds_samples([url])


class RecordingFile(io.BufferedReader):
    """A local file that keeps every ``bytes`` its ``read`` returned, and the sizes asked."""

    def __init__(self, path: str) -> None:
        super().__init__(io.FileIO(path, "rb"))
        self.returned: list[bytes] = []
        self.asked: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.asked.append(-1 if size is None else size)
        self.returned.append(data)
        return data


def test_large_members_are_the_bytes_the_stream_returned(tmp_path: Path) -> None:
    """One copy, not two: after the first, a large member's ``bytes`` is the very object
    ``read(size)`` returned, and the reader never reads ahead into a large member's data."""
    sizes = [tarformat.DIRECT_MIN, 3 * tarformat.DIRECT_MIN + 17, tarformat.DIRECT_MIN + 512]
    entries: list[Entry] = []
    for i in range(24):
        entries.append((f"{i:03d}.bin", os.urandom(sizes[i % 3])))
        if i % 4 == 0:  # small members between some of the large ones
            entries.append((f"{i:03d}.cls", str(i).encode()))
    url = write(tmp_path, "large.tar", tar_bytes(entries))
    with RecordingFile(url) as stream:
        got = [m for batch in tarformat.iter_member_batches(stream, url=url) for m in batch]
        returned = {id(data) for data in stream.returned}
        assert got == entries
        assert max(stream.asked[1:]) == max(sizes)  # no chunk beyond a member after the head
    with tarfile.open(url) as tf:  # the first read (a chunk) is parsed as a buffer
        after_head = {m.name for m in tf if m.offset_data > tarformat.CHUNK_SIZE}
    large = [data for name, data in got if name.endswith(".bin") and name in after_head]
    assert len(large) > 8 and all(id(data) in returned for data in large)


@pytest.mark.parametrize("cut_in", ["data", "padding", "header"])
def test_large_members_before_a_cut_are_all_yielded(tmp_path: Path, cut_in: str) -> None:
    """Large members are handed on in batches: a cut in the seventh of twelve still yields
    the six before it, then the error, as one member at a time did."""
    entries: list[Entry] = [(f"{i:03d}.bin", os.urandom(100_000 + i)) for i in range(12)]
    data = tar_bytes(entries)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        seventh = tf.getmembers()[6]
    cut = {"data": seventh.offset_data + 50_000, "padding": seventh.offset_data + 100_006 + 3,
           "header": seventh.offset + 100}[cut_in]
    got: list[Entry] = []
    with pytest.raises(ShardFormatError):
        for batch in tarformat.iter_member_batches(io.BytesIO(data[:cut]), url="cut.tar"):
            got += batch
    assert got == entries[:6]


def test_grouping_rules_match_webdataset(tmp_path: Path) -> None:
    names = [
        "a.txt", "a.CLS", "a.seg.png", "dir.v1/b.txt", "dir.v1/b.json", "dir/.hidden",
        "x.y/.z", "noext", "dir/noext", ".dotfile", "c.TXT", "c.gz.TXT", "d/e.f/g.h",
        "d/e.f/g.i", "line\nbreak.x/k.t", "nl/dir\n.a", "", "e.", "e..x",
    ]
    entries = [(n, n.encode()) for n in names]
    url = write(tmp_path, "rules.tar", tar_bytes(entries, tarfile.PAX_FORMAT))
    ours = ours_samples([url])
    assert ours == wds_samples([url])
    for name in names:
        assert tario._split(name) == tario.base_plus_ext(name)
    assert ours[0] == {"__key__": "a", "__url__": url, "txt": b"a.txt", "cls": b"a.CLS",
                       "seg.png": b"a.seg.png"}


def test_meta_members_are_skipped(tmp_path: Path) -> None:
    entries: list[Entry] = [
        ("__meta__", b"m"), ("__dir__/x.txt", b"m2"), ("___", b"m3"), ("__index__.json", b"i"),
        ("a.txt", b"a"), ("sub/__x__", b"s"), ("_y_.txt", b"y"),
    ]
    url = write(tmp_path, "meta.tar", tar_bytes(entries))
    ours = ours_samples([url])
    assert ours == wds_samples([url])
    keys = [s["__key__"] for s in ours]
    assert "__meta__" not in keys and "__dir__/x" not in keys and "a" in keys
    fnames = [d["fname"] for d in tario.tar_file_iterator(open_rb(url))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wfnames = [d["fname"] for d in webdataset.tariterators.tar_file_iterator(open_rb(url))]
    assert fnames == wfnames


def test_select_and_rename_hooks_match_webdataset(tmp_path: Path) -> None:
    url = write(tmp_path, "hooks.tar", tar_bytes(sample_entries(10)))

    def select(name: str) -> bool:
        return not name.endswith(".cls")

    def rename(name: str) -> str:
        return name.replace(".json", ".meta.json").upper()

    for kw in ({"select_files": select}, {"rename_files": rename},
               {"select_files": select, "rename_files": rename}):
        ours = ours_samples([url], **kw)
        assert ours == wds_samples([url], **kw)
        assert ours
    dropped = ours_samples([url], rename_files=lambda n: None if n.endswith(".txt") else n)
    assert all("txt" not in s for s in dropped) and len(dropped) == 10


def test_duplicate_suffix_goes_to_the_handler(tmp_path: Path) -> None:
    entries: list[Entry] = [("k.txt", b"1"), ("k.TXT", b"2"), ("k.cls", b"3"), ("m.txt", b"4")]
    url = write(tmp_path, "dup.tar", tar_bytes(entries))
    with pytest.raises(ShardFormatError) as info:
        ours_samples([url])
    assert isinstance(info.value, ValueError)
    assert info.value.url == url and info.value.member == "k.TXT"
    kept = ours_samples([url], handler=ignore_and_continue)
    assert kept == wds_samples([url], handler=webdataset.ignore_and_continue)
    assert kept[0] == {"__key__": "k", "__url__": url, "txt": b"1", "cls": b"3"}
    assert ours_samples([url], handler=ignore_and_stop) == [
        {"__key__": "k", "__url__": url, "txt": b"1"}]


def test_local_path_from_the_stream(tmp_path: Path) -> None:
    url = write(tmp_path, "lp.tar", tar_bytes(sample_entries(3)))

    def open_with_path(u: str) -> Any:
        stream = open(u, "rb")  # noqa: SIM115
        stream.local_path = "/the/local/" + os.path.basename(u)  # type: ignore[attr-defined]
        return stream

    samples = list(samples_from_shards([{"url": url}], open_stream=open_with_path))
    assert [s["__local_path__"] for s in samples] == ["/the/local/lp.tar"] * 3
    opened = list(tario.open_shards([{"url": url}], open_stream=open_with_path))
    assert opened[0]["local_path"] == "/the/local/lp.tar"
    files = list(tario.tar_file_expander(opened))
    assert files[-1] == {} and files[0]["__local_path__"] == "/the/local/lp.tar"
    assert [s["__local_path__"] for s in tario.group_by_keys(files)] == ["/the/local/lp.tar"] * 3


def test_local_path_through_gopen(tmp_path: Path) -> None:
    gopen = wds_cloud.gopen
    url = write(tmp_path, "g.tar", tar_bytes(sample_entries(2)))
    samples = list(samples_from_shards([{"url": url}], open_stream=gopen))
    assert [os.path.realpath(s["__local_path__"]) for s in samples] == [os.path.realpath(url)] * 2


def test_unbundled_functions_match_webdataset(tmp_path: Path) -> None:
    urls = [write(tmp_path, f"u{i}.tar", tar_bytes(sample_entries(5, seed=i))) for i in range(2)]
    srcs = [{"url": u} for u in urls]
    ours_files = list(tario.tar_file_expander(tario.open_shards(srcs, open_stream=open_rb)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wt = webdataset.tariterators
        ref_files = list(wt.tar_file_expander(wt.url_opener([dict(s) for s in srcs])))
    assert ours_files == ref_files
    assert list(tario.group_by_keys(ours_files)) == list(wt.group_by_keys(ref_files))
    assert list(tario.group_by_keys(ours_files, suffixes={"cls"})) == list(
        wt.group_by_keys(ref_files, suffixes={"cls"}))
    assert tario.valid_sample({"a": 1}) and not tario.valid_sample({})
    assert not tario.valid_sample({"__bad__": True}) and not tario.valid_sample(None)


def test_tar_files_written_by_gnu_tar(tmp_path: Path) -> None:
    assert shutil.which("tar"), "GNU tar is needed for this test (Debian: apt-get install tar)"
    src = tmp_path / "src"
    (src / "sub.d").mkdir(parents=True)
    for i in range(6):
        for ext, size in (("jpg", 3000 + i), ("cls", 1), ("json", 0)):
            (src / f"sample{i}.{ext}").write_bytes(os.urandom(size))
        (src / "sub.d" / f"deep{i}.txt").write_bytes(b"deep %d" % i)
    (src / "sub.d" / ("long" * 30 + ".txt")).write_bytes(b"long")
    (src / "ünï.txt").write_bytes(b"unicode")
    os.symlink("sample0.jpg", src / "sample0.link")
    for fmt in ("gnu", "oldgnu", "posix", "ustar", "v7"):
        url = str(tmp_path / f"{fmt}.tar")
        subprocess.run(["tar", "--sort=name", f"--format={fmt}", "-cf", url, "-C", str(src), "."],
                       check=False, capture_output=True)  # ustar/v7 refuse the long name
        ours = ours_samples([url])
        assert len(ours) >= 13, fmt
        assert ours == wds_samples([url]), fmt
        packed = url + ".gz"
        with open(url, "rb") as f, gzip.open(packed, "wb") as g:
            g.write(f.read())
        assert [dict(s, __url__=url) for s in ours_samples([packed])] == ours


# ------------------------------------------------------------------------------ bad input

def _layout(data: bytes) -> tuple[list[tuple[str, bytes]], list[int], int]:
    """Members, the offsets where each member (header + data + padding) ends, end of members."""
    ends = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        infos = [m for m in tf]
    for m in infos:
        ends.append(m.offset_data + -(-m.size // 512) * 512)
    return tarfile_members(data), ends, ends[-1]


def test_truncation_at_every_cut_point() -> None:
    entries: list[Entry] = [("a.txt", b"x" * 700), ("a.cls", b""), ("b.txt", b"y" * 512),
                            ("c" * 120 + ".bin", b"z" * 10), ("d.txt", b"w")]
    data = tar_bytes(entries)
    members, ends, members_end = _layout(data)
    clean_cuts = set(ends)  # (cut 0, no byte at all, is an empty shard: an error)
    for cut in range(len(data) + 1):
        got: list[tuple[str, bytes]] = []
        error = None
        try:
            for batch in tarformat.iter_member_batches(io.BytesIO(data[:cut]), url="mem://t"):
                got.extend(batch)
        except ShardFormatError as exc:
            error = exc
        complete = sum(1 for e in ends if e <= cut)
        assert got == members[:complete], cut  # only whole members, in order
        if cut in clean_cuts or cut >= members_end:
            assert error is None, (cut, error)
        else:
            assert error is not None, cut
            assert error.url == "mem://t" and error.offset is not None and error.offset <= cut
            assert "offset=" in str(error)


def test_clean_cuts_at_member_boundaries_match_tarfile_stream_mode() -> None:
    # tarfile in stream mode ends quietly when the stream stops on a member boundary (no
    # end-of-archive blocks); so do we. Inside a member tarfile raises ReadError, we raise
    # ShardFormatError (and unlike tarfile, we also raise for a cut inside a header).
    data = tar_bytes(sample_entries(4))
    members, ends, _ = _layout(data)
    for i, end in enumerate(ends):
        assert tarfile_members(data[:end]) == members[:i + 1] == ours_members(data[:end])
    cut = ends[1] + 700
    with pytest.raises(tarfile.ReadError):
        tarfile_members(data[:cut])
    with pytest.raises(ShardFormatError, match="truncated member"):
        ours_members(data[:cut])


def test_garbage_is_rejected() -> None:
    rng = __import__("random").Random(5)
    for size in (1, 100, 511, 512, 513, 5000, 100_000):
        junk = rng.randbytes(size)
        with pytest.raises(ShardFormatError) as info:
            ours_members(junk)
        assert info.value.offset == 0
    data = tar_bytes(sample_entries(10))
    members, ends, _ = _layout(data)
    damaged = data[:ends[4]] + rng.randbytes(512) + data[ends[4] + 512:]
    got = []
    with pytest.raises(ShardFormatError, match="checksum") as info:
        for batch in tarformat.iter_member_batches(io.BytesIO(damaged), url="u"):
            got.extend(batch)
    assert got == members[:5] and info.value.offset == ends[4]
    flipped = bytearray(data)
    flipped[ends[2] + 10] ^= 1  # one bit in the name of a header
    with pytest.raises(ShardFormatError, match="checksum"):
        ours_members(bytes(flipped))


def test_member_larger_than_the_stream() -> None:
    data = _header("huge.bin", 10**9, b"0") + b"only a little data"
    with pytest.raises(ShardFormatError, match="truncated member") as info:
        ours_members(data)
    assert info.value.member == "huge.bin" and info.value.offset == 0
    assert info.value.url == "mem://shard.tar"


def test_extended_header_without_member() -> None:
    data = _header("././@LongLink", 20, b"L") + b"n" * 20 + bytes(492) + bytes(1024)
    with pytest.raises(ShardFormatError, match="extended"):
        ours_members(data)


def test_sparse_members_are_refused() -> None:
    data = _header("sparse.bin", 0, b"S") + bytes(1024)
    with pytest.raises(ShardFormatError, match="sparse"):
        ours_members(data)


def _bad_and_good(tmp_path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    good1 = write(tmp_path, "g1.tar", tar_bytes(sample_entries(3, prefix="g")))
    entries: list[Entry] = [("b00000.txt", b"t" * 100), ("b00000.cls", b"0"),
                            ("b00001.txt", b"u" * 10), ("b00001.cls", b"c" * 300),
                            ("b00001.json", b"{}"), ("b00002.txt", b"v")]
    full = tar_bytes(entries)
    _, ends, _ = _layout(full)
    bad = write(tmp_path, "bad.tar", full[:ends[2] + 512 + 100])  # inside b00001.cls's data
    good2 = write(tmp_path, "g2.tar", tar_bytes(sample_entries(2, prefix="h")))
    return [good1, bad, good2], ours_samples([good1]) + ours_samples([good2])


def test_handlers_on_a_truncated_shard(tmp_path: Path) -> None:
    urls, good = _bad_and_good(tmp_path)
    with pytest.raises(ShardFormatError) as info:
        ours_samples(urls)
    assert info.value.url == urls[1] and info.value.member == "b00001.cls"
    skipped = ours_samples(urls, handler=ignore_and_continue)
    # the bad shard's whole samples are kept; the one in progress (b00001, whose .cls was cut)
    # is dropped, where webdataset passes it on without its lost member
    bad_part = [s for s in skipped if s["__url__"] == urls[1]]
    assert [s["__key__"] for s in bad_part] == ["b00000"]
    assert [s for s in skipped if s["__url__"] != urls[1]] == good
    theirs = wds_samples(urls, handler=webdataset.ignore_and_continue)
    partial = [s for s in theirs if s["__key__"] == "b00001"]
    assert len(partial) == 1 and set(partial[0]) == {"__key__", "__url__", "txt"}
    assert [s["__key__"] for s in skipped] == [s["__key__"] for s in theirs if s not in partial]
    with pytest.warns(UserWarning, match="truncated member"):
        assert ours_samples(urls, handler=warn_and_continue) == skipped
    stopped = ours_samples(urls, handler=ignore_and_stop)
    assert [s["__key__"] for s in stopped] == ["g00000", "g00001", "g00002", "b00000"]


def test_open_errors_go_to_the_handler(tmp_path: Path) -> None:
    good = write(tmp_path, "ok.tar", tar_bytes(sample_entries(2)))
    missing = str(tmp_path / "missing.tar")
    with pytest.raises(ShardNotFoundError) as info:
        ours_samples([missing, good])
    assert info.value.url == missing and isinstance(info.value.__cause__, FileNotFoundError)
    assert len(ours_samples([missing, good], handler=ignore_and_continue)) == 2
    assert ours_samples([missing, good], handler=ignore_and_stop) == []
    with pytest.raises(ShardNotFoundError):
        list(tario.open_shards([{"url": missing}], open_stream=open_rb))


def test_stream_read_errors() -> None:
    data = tar_bytes(sample_entries(200))

    def _read(blob: bytes) -> list[dict[str, Any]]:
        return list(samples_from_shards([{"url": "pipe:x"}], open_stream=lambda u: io.BytesIO(
            blob)))

    ours_error = PipeError("pipe:false failed", url="pipe:false", command="false", returncode=1)
    for exc, kind in ((ours_error, PipeError), (ConnectionResetError("peer reset"), OpenError)):
        seen: list[BaseException] = []

        def record(e: BaseException, seen: list[BaseException] = seen) -> bool:
            seen.append(e)
            return True

        samples = list(samples_from_shards(
            [{"url": "pipe:x"}], record, open_stream=lambda u, e=exc: FailingStream(data[:16384],
                                                                                  e)))
        assert len(seen) == 1 and isinstance(seen[0], kind)
        assert seen[0] is exc if kind is PipeError else seen[0].__cause__ is exc
        assert samples and all(s["__url__"] == "pipe:x" for s in samples)
        whole = [s for s in _read(data) if s["__key__"] in {t["__key__"] for t in samples}]
        assert samples == whole  # only complete samples, none cut by the failure
        with pytest.raises(kind):
            list(samples_from_shards([{"url": "pipe:x"}], reraise_exception,
                                       open_stream=lambda u, e=exc: FailingStream(data[:16384],
                                                                                  e)))


def test_hook_errors_name_the_member(tmp_path: Path) -> None:
    url = write(tmp_path, "h.tar", tar_bytes(sample_entries(3)))

    def select(name: str) -> bool:
        if name.endswith(".cls"):
            raise KeyError(name)
        return True

    with pytest.raises(ShardFormatError) as info:
        ours_samples([url], select_files=select)
    assert info.value.member == "s00000.cls" and isinstance(info.value.__cause__, KeyError)
    kept = ours_samples([url], select_files=select, handler=ignore_and_continue)
    assert kept == wds_samples([url], select_files=lambda n: not n.endswith(".cls"))


class Tracked(io.BytesIO):
    opened: list[Tracked] = []  # noqa: RUF012

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        Tracked.opened.append(self)


def test_streams_are_closed(tmp_path: Path) -> None:
    data = tar_bytes(sample_entries(50))
    Tracked.opened = []
    it = samples_from_shards([{"url": "a"}, {"url": "b"}],
                                   open_stream=lambda u: Tracked(data))
    assert len(list(it)) == 100 and all(s.closed for s in Tracked.opened)
    Tracked.opened = []
    it = samples_from_shards([{"url": "a"}], open_stream=lambda u: Tracked(data))
    next(it)
    it.close()  # consumer breaks out early
    assert Tracked.opened[0].closed
    Tracked.opened = []
    with pytest.raises(ShardFormatError):
        list(samples_from_shards([{"url": "a"}], open_stream=lambda u: Tracked(data[:3000])))
    assert Tracked.opened[0].closed
    Tracked.opened = []
    files = tario.tar_file_expander(tario.open_shards([{"url": "a"}],
                                                     open_stream=lambda u: Tracked(data)))
    assert len(list(files)) == 151 and Tracked.opened[0].closed


def test_messages_hide_credentials() -> None:
    url = "s3://bucket/shard.tar?X-Amz-Signature=secret"
    with pytest.raises(ShardFormatError) as info:
        list(samples_from_shards([{"url": url}],
                                       open_stream=lambda u: io.BytesIO(b"junk" * 200)))
    assert "secret" not in str(info.value)


def test_text_mode_stream_is_explained() -> None:
    with pytest.raises(ShardFormatError, match="binary mode"):
        list(samples_from_shards([{"url": "t"}],
                                       open_stream=lambda u: io.StringIO("x" * 600)))


# ------------------------------------------------------------- fast path and checksums

def test_webdataset_tarwriter_shards(tmp_path: Path) -> None:
    # webdataset's TarWriter puts a pax header (float mtime) before every member
    url = str(tmp_path / "written.tar")
    with webdataset.TarWriter(url) as sink:
        for i in range(300):
            sink.write({"__key__": f"k{i:04d}", "txt": "x" * (i % 700), "cls": i,
                        "json": {"i": i}})
    with open(url, "rb") as f:
        assert f.read(512)[156:157] == b"x"
    ours = ours_samples([url])
    assert len(ours) == 300 and ours == wds_samples([url])


def test_a_bad_pax_header_checksum_inside_a_batch() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(40):
            info = tarfile.TarInfo(f"ü{i:03d}.txt")  # non-ASCII: a pax header for each
            info.size = 3
            tf.addfile(info, io.BytesIO(b"abc"))
    data = bytearray(out.getvalue())
    pax_at = 2048 * 25  # member 25's pax header (pax header, pax data, member, its data)
    assert data[pax_at + 156] == ord("x")
    data[pax_at + 120] ^= 0x01  # a mode bit: only the checksum notices
    got = []
    with pytest.raises(ShardFormatError, match="checksum") as info:
        for batch in tarformat.iter_member_batches(io.BytesIO(bytes(data)), url="u"):
            got.extend(batch)
    assert info.value.offset == pax_at
    assert got == [(f"ü{i:03d}.txt", b"abc") for i in range(25)]


def _rechecksum(header: bytearray, form: str, *, signed: bool = False) -> None:
    header[148:156] = b" " * 8
    total = sum(b - 256 if signed and b >= 128 else b for b in header)
    header[148:156] = (form % total).encode().ljust(8, b"\0")


def test_unusual_and_signed_checksums_are_accepted() -> None:
    entries = [(f"é{i:02d}.bin", bytes([i]) * 10) for i in range(20)]
    data = bytearray(tar_bytes(entries, tarfile.GNU_FORMAT))  # raw UTF-8 names: high bytes
    for i in range(20):
        header = data[i * 1024:i * 1024 + 512]
        form = ("%06o\0 ", "%6o\0 ", "%07o\0", "%06o \0", "%o\0")[i % 5]
        _rechecksum(header, form, signed=i % 3 == 0)
        data[i * 1024:i * 1024 + 512] = header
    assert tarfile_members(bytes(data)) == entries
    assert ours_members(bytes(data)) == entries
    assert ours_members(bytes(data), chunk_size=512) == entries


def test_streams_returning_bytearray() -> None:
    entries = sample_entries(10)

    class ByteArrays(io.BytesIO):
        def read(self, n: int | None = -1) -> bytearray:  # type: ignore[override]
            return bytearray(super().read(n))

    got = [m for batch in tarformat.iter_member_batches(ByteArrays(tar_bytes(entries)))
           for m in batch]
    assert got == entries and all(type(d) is bytes for _, d in got)


def test_tar_file_iterator_handler_ends_the_stream() -> None:
    data = tar_bytes(sample_entries(5))
    _, ends, _ = _layout(data)
    cut = io.BytesIO(data[:ends[6] + 600])
    with pytest.raises(ShardFormatError):
        list(tario.tar_file_iterator(io.BytesIO(cut.getvalue())))
    got = list(tario.tar_file_iterator(cut, handler=ignore_and_continue))
    assert [d["fname"] for d in got] == [n for n, _ in sample_entries(5)][:7]
