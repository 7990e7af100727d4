"""Shards cut short between good ones: what a continuing handler keeps (compared with webdataset
1.0.2 on the same files), and ``except tarfile.ReadError`` around a broken shard."""

from __future__ import annotations

import gzip
import io
import random
import shutil
import tarfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import webdataset

import wds_cloud as wds
from wds_cloud.errors import ShardFormatError

HANDLERS = ["warn_and_continue", "ignore_and_continue"]
CUTS = ["data-cut", "size-past-end"]
CUT_SAMPLE = 5  # the break falls in the first member of the 6th sample of cut.tar


def _tar(path: Path, prefix: str, count: int) -> tuple[bytes, list[int]]:
    """Samples ``{prefix}NNN`` (.txt, .cls, .json) in ``path``; the bytes and each member's
    header offset."""
    rng = random.Random(prefix)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(count):
            for ext, size in (("txt", 700), ("cls", 3), ("json", 1500)):
                info = tarfile.TarInfo(f"{prefix}{i:03d}.{ext}")
                info.size = size
                tar.addfile(info, io.BytesIO(rng.randbytes(size)))
    data = out.getvalue()
    path.write_bytes(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return data, [m.offset for m in tar.getmembers()]


def _header_with_size(header: bytes, size: int) -> bytes:
    block = bytearray(header)
    block[124:136] = b"%011o\0" % size
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _shards(tmp_path: Path, cut: str) -> list[str]:
    """good.tar (4 samples), cut.tar (8 samples, broken in the 6th), good2.tar (3 samples)."""
    _tar(tmp_path / "good.tar", "a", 4)
    data, headers = _tar(tmp_path / "full.tar", "b", 8)
    at = headers[3 * CUT_SAMPLE]  # the 6th sample's first member (.txt, 700 bytes)
    if cut == "data-cut":  # the stream ends in the middle of that member's data
        broken = data[:at + 512 + 300]
    else:  # its size field says 10 MB: it runs past the end of the stream
        broken = data[:at] + _header_with_size(data[at:at + 512], 10 << 20) + data[at + 512:]
    (tmp_path / "cut.tar").write_bytes(broken)
    _tar(tmp_path / "good2.tar", "c", 3)
    return [str(tmp_path / name) for name in ("good.tar", "cut.tar", "good2.tar")]


def _keys(samples: Any) -> list[str]:
    return [s["__key__"] for s in samples]


def _read(make: Callable[[], Any]) -> tuple[list[str], list[str]]:
    """The keys read and the warnings met (the warn handler warns once per broken shard)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        keys = _keys(make())
    return keys, [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


EXPECTED = ([f"a{i:03d}" for i in range(4)] + [f"b{i:03d}" for i in range(CUT_SAMPLE)]
            + [f"c{i:03d}" for i in range(3)])


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("cut", CUTS)
def test_a_complete_sample_before_the_break_is_kept(tmp_path: Path, cut: str,
                                                    handler: str) -> None:
    urls = _shards(tmp_path, cut)
    ours_h, theirs_h = getattr(wds, handler), getattr(webdataset, handler)
    pipeline, warned = _read(lambda: wds.DataPipeline(
        wds.SimpleShardList(urls), wds.tarfile_to_samples(handler=ours_h)))
    dataset, _ = _read(lambda: wds.WebDataset(urls, shardshuffle=False, handler=ours_h))
    theirs, _ = _read(lambda: webdataset.DataPipeline(
        webdataset.SimpleShardList(urls), webdataset.tarfile_to_samples(handler=theirs_h)))
    theirs_ds, _ = _read(lambda: webdataset.WebDataset(urls, shardshuffle=False,
                                                       handler=theirs_h))
    assert pipeline == dataset == EXPECTED
    assert len(pipeline) == len(theirs) == len(theirs_ds) == 12
    assert theirs == theirs_ds == EXPECTED  # webdataset keeps the same samples here
    if handler == "warn_and_continue":
        assert len(warned) == 1 and "cut.tar" in warned[0] and "b005.txt" in warned[0]


def test_the_sample_the_break_falls_inside_is_dropped(tmp_path: Path) -> None:
    data, headers = _tar(tmp_path / "full.tar", "b", 8)
    at = headers[3 * CUT_SAMPLE + 1]  # b005.cls: b005.txt arrived, b005.cls did not
    (tmp_path / "cut.tar").write_bytes(data[:at + 512 + 1])
    keys = _keys(wds.WebDataset(str(tmp_path / "cut.tar"), shardshuffle=False,
                                handler=wds.ignore_and_continue))
    assert keys == [f"b{i:03d}" for i in range(CUT_SAMPLE)]


def test_a_break_that_names_no_member_drops_the_open_sample(tmp_path: Path) -> None:
    """A bad checksum in the 6th sample's first header: nothing says b004 had all its
    members (the broken header might have been one more of them), so it is dropped."""
    data, headers = _tar(tmp_path / "full.tar", "b", 8)
    at = headers[3 * CUT_SAMPLE]
    damaged = data[:at + 10] + b"\xff" + data[at + 11:]
    (tmp_path / "bad.tar").write_bytes(damaged)
    seen: list[BaseException] = []

    def record(exn: BaseException) -> bool:
        seen.append(exn)
        return True

    keys = _keys(wds.WebDataset(str(tmp_path / "bad.tar"), shardshuffle=False, handler=record))
    assert keys == [f"b{i:03d}" for i in range(CUT_SAMPLE - 1)]
    assert len(seen) == 1 and isinstance(seen[0], ShardFormatError)
    assert seen[0].member is None and "checksum" in str(seen[0])


def test_a_renamed_broken_member_is_judged_by_its_new_key(tmp_path: Path) -> None:
    """rename_files puts b005.txt into b004: the break then falls inside b004."""
    urls = _shards(tmp_path, "data-cut")

    def rename(name: str) -> str:
        return name.replace("b005.", "b004.x") if name.startswith("b005.") else name

    keys = _keys(wds.WebDataset(urls[1], shardshuffle=False, handler=wds.ignore_and_continue,
                                rename_files=rename))
    assert keys == [f"b{i:03d}" for i in range(CUT_SAMPLE - 1)]


# -- except tarfile.ReadError ----------------------------------------------------------------

@pytest.mark.parametrize("cut", CUTS)
def test_a_broken_shard_is_a_tarfile_read_error(tmp_path: Path, cut: str) -> None:
    urls = _shards(tmp_path, cut)
    with pytest.raises(tarfile.ReadError) as info:
        list(wds.WebDataset(urls, shardshuffle=False))
    assert isinstance(info.value, ShardFormatError) and info.value.url == urls[1]
    with pytest.raises(tarfile.ReadError):  # what webdataset raises there
        list(webdataset.WebDataset(urls, shardshuffle=False))


def test_a_truncated_tgz_through_pipe_is_a_tarfile_read_error(tmp_path: Path) -> None:
    _tar(tmp_path / "full.tar", "b", 8)
    packed = gzip.compress((tmp_path / "full.tar").read_bytes())
    (tmp_path / "cut.tgz").write_bytes(packed[:len(packed) // 2])
    assert shutil.which("cat") is not None
    url = f"pipe:cat {tmp_path / 'cut.tgz'}"
    caught: list[tarfile.ReadError] = []
    try:
        for _ in wds.DataPipeline(wds.SimpleShardList([url]), wds.tarfile_to_samples()):
            pass
    except tarfile.ReadError as exc:  # the way webdataset users write it
        caught.append(exc)
    assert len(caught) == 1 and isinstance(caught[0], ShardFormatError)
    assert caught[0].url == url and "gzip" in str(caught[0])


def _with_entry_before(entry: tarfile.TarInfo, data: bytes, fmt: int = tarfile.PAX_FORMAT
                       ) -> tuple[bytes, int]:
    """b000..b004 (.txt, then .json after ``entry``) and the offset of ``entry``'s header."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for i in range(5):
            for ext in ("txt", "json"):
                if i == 4 and ext == "json":
                    at = out.tell()
                    tar.addfile(entry, io.BytesIO(data))
                info = tarfile.TarInfo(f"b{i:03d}.{ext}")
                info.size = 100
                tar.addfile(info, io.BytesIO(bytes(100)))
    return out.getvalue(), at


def test_a_break_in_an_extended_header_drops_the_sample_it_precedes(tmp_path: Path) -> None:
    """GNU tar labels the pax header of b004.json './PaxHeaders/b004.json': that label is not
    a member of another sample, and the break loses b004.json."""
    info = tarfile.TarInfo("b004.json")
    info.size = 100
    info.pax_headers = {"comment": "x" * 300}
    data, _ = _with_entry_before(info, bytes(100))
    at = data.index(b"././@PaxHeader")
    header = bytearray(data[at:at + 512])
    header[:100] = b"./PaxHeaders/b004.json".ljust(100, b"\0")
    block = _header_with_size(bytes(header), int(header[124:135], 8))
    (tmp_path / "pax.tar").write_bytes(data[:at] + block + data[at + 512:at + 512 + 100])
    seen: list[BaseException] = []
    keys = _keys(wds.WebDataset(str(tmp_path / "pax.tar"), shardshuffle=False,
                                handler=lambda e: seen.append(e) or True))
    assert keys == [f"b{i:03d}" for i in range(4)]
    assert len(seen) == 1 and isinstance(seen[0], ShardFormatError) and seen[0].member is None
    assert "./PaxHeaders/b004.json" in str(seen[0])


def test_a_break_in_a_skipped_entry_drops_the_open_sample(tmp_path: Path) -> None:
    """An entry of an unknown type is skipped, so b004.json after it would still join b004:
    a break in its data says nothing about b004 being complete."""
    info = tarfile.TarInfo("c000.dat")
    info.type = b"Z"
    info.size = 2000
    data, at = _with_entry_before(info, bytes(2000), tarfile.USTAR_FORMAT)
    (tmp_path / "odd.tar").write_bytes(data[:at + 512 + 1000])
    seen: list[BaseException] = []
    keys = _keys(wds.WebDataset(str(tmp_path / "odd.tar"), shardshuffle=False,
                                handler=lambda e: seen.append(e) or True))
    assert keys == [f"b{i:03d}" for i in range(4)]
    assert len(seen) == 1 and isinstance(seen[0], ShardFormatError) and seen[0].member is None
    assert "'c000.dat' of type 'Z'" in str(seen[0])
