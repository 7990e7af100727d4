"""TarEntries (every entry with its type and offset, as tarfile sees them) and the shard audit
(counts and anomalies), on archives written by Python's tarfile."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable

import pytest

from wds_cloud.errors import ShardFormatError
from wds_cloud.tar.audit import ShardAudit, audit_shard, cross_shard_anomalies
from wds_cloud.tar.entries import TarEntries, compression_of_name

LONG = "d/" + "x" * 120 + ".jpg"


def archive(infos: Iterable[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.PAX_FORMAT,
            mode: str = "w") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode, format=fmt) as t:
        for info, data in infos:
            info.size = len(data) if info.isreg() else 0
            t.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type, i.linkname = kind, link
    return i


def files(names: Iterable[str], size: int = 3) -> bytes:
    return archive((info(n), b"x" * size) for n in names)


def audit(data: bytes, url: str = "s.tar") -> ShardAudit:
    return audit_shard(io.BytesIO(data), url=url)


def kinds(a: ShardAudit) -> dict[str, int]:
    return dict(a.counts)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_entries_match_tarfile(fmt: int, mode: str) -> None:
    data = archive([(info("a.jpg"), b"j" * 700), (info("dir/", tarfile.DIRTYPE), b""),
                    (info(LONG), b"long"), (info("ln.jpg", tarfile.SYMTYPE, LONG), b""),
                    (info("hard.jpg", tarfile.LNKTYPE, "a.jpg"), b""),
                    (info("fifo", tarfile.FIFOTYPE), b""), (info("b.txt"), b"")], fmt, mode)
    entries = TarEntries(io.BytesIO(data), url=f"x.{mode}")
    assert entries.compression == {"w": "", "w:gz": "gzip", "w:bz2": "bzip2", "w:xz": "xz"}[mode]
    got = [(e.name, e.type, e.size, e.offset, e.linkname) for e in entries]
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        want = [(m.name + ("/" if m.isdir() else ""), m.type.decode(), m.size, m.offset,
                 m.linkname) for m in t.getmembers()]
    assert [g[:2] for g in got] == [(n.rstrip("/") + ("/" if k == "5" else ""), k)
                                    for n, k, *_ in want]
    assert [g[2:] for g in got] == [w[2:] for w in want]


def test_truncation_anywhere_is_an_error_after_the_whole_entries() -> None:
    data = files(["a.jpg", "a.txt", "b.jpg"], size=600)
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        offsets = [m.offset for m in t.getmembers()]
    end = offsets[-1] + 512 + 1024
    for cut in (100, 512, 700, offsets[1] + 10, offsets[2] + 512 + 599, end - 1):
        entries = TarEntries(io.BytesIO(data[:cut]), url="cut.tar")
        seen = []
        with pytest.raises(ShardFormatError) as exc:
            seen.extend(entries)
        assert exc.value.url == "cut.tar" and exc.value.offset is not None
        assert [e.offset for e in seen] == [o for o in offsets if o + 512 + 1024 <= cut]
    assert len(list(TarEntries(io.BytesIO(data[:end])))) == 3  # the end blocks may be cut


def test_a_corrupt_gzip_shard_is_a_corrupt_anomaly() -> None:
    data = archive([(info(f"k{i}.txt"), b"t" * 2000) for i in range(50)], mode="w:gz")
    a = audit(data[:len(data) // 2], "half.tar.gz")
    assert kinds(a) == {"corrupt": 1} and 0 < a.samples < 50
    assert "gzip" in a.anomalies[0].message


def test_grouping_anomalies() -> None:
    a = audit(files(["a.jpg", "a.jpg", "__key__", "b.jpg", "__meta__/x.txt", "noext",
                     "c.jpg", "b.txt"]))
    assert kinds(a) == {"duplicate-key": 1, "no-extension": 1, "non-adjacent": 1}
    assert (a.samples, a.members, a.extensions) == (4, 5, {"jpg": 3, "txt": 1})
    assert (a.first_key, a.last_key, a.keys()) == ("a", "b", ["a", "b", "c"])
    assert kinds(audit(files([]))) == {"empty": 1}


@pytest.mark.parametrize(("names", "flagged"), [
    (["img.001.jpg", "img.002.jpg", "img.003.jpg"], 3),  # all collapse into sample 'img'
    ([f"{k}.{e}" for k in "abcd" for e in ("jpg", "seg.png")], 0),  # intended
    ([f"{k}.{e}" for k in "abcd" for e in ("left.jpg", "right.jpg")], 0),  # stereo pairs
    ([f"{k}.jpg" for k in "abcd"] + ["e.v2.jpg"], 1),
    (["only.seg.png"], 0),
])
def test_extra_dots(names: list[str], flagged: int) -> None:
    a = audit(files(names))
    assert a.counts["extra-dots"] == flagged
    assert {x.member for x in a.anomalies} == ({n for n in names if n.count(".") > 1}
                                               if flagged else set())


def test_cross_shard() -> None:
    first, second, third = (audit(files(names), url) for names, url in (
        (["a.jpg", "b.jpg", "c.jpg"], "0.tar"), (["c.txt", "d.jpg"], "1.tar"),
        (["d.txt", "e.jpg"], "2.tar.gz")))
    found, counts = cross_shard_anomalies([first, second, third],
                                          urls=["0.tar", "1.tar", "2.tar.gz"])
    assert [(x.kind, x.url) for x in found] == [("split-sample", "1.tar"),
                                                ("split-sample", "2.tar.gz"),
                                                ("mixed-compression", None)]
    # a shard not read between two: not consecutive, so a key in two shards
    found, counts = cross_shard_anomalies([first, None, second])
    assert [(x.kind, x.url) for x in found] == [("key-in-two-shards", "1.tar")]
    assert counts == {"key-in-two-shards": 1}
    assert cross_shard_anomalies([first]) == ([], {})
    copies = [audit(files([f"k{i}.jpg" for i in range(5)]), f"{n}.tar") for n in range(3)]
    found, counts = cross_shard_anomalies(copies)  # one anomaly per pair of shards
    assert [(x.url, x.message) for x in found] == [
        ("1.tar", "5 keys are also in 0.tar: 'k0', 'k1', 'k2', ..."),
        ("2.tar", "5 keys are also in 1.tar: 'k0', 'k1', 'k2', ...")]
    assert counts == {"key-in-two-shards": 2}


def test_compression_of_name() -> None:
    assert [compression_of_name(u) for u in ("a.tar", "a.tar.gz", "a.tgz", "s3://b/a.tar.xz",
                                             "https://h/a.tar.bz2?sig=1")] == [
        "", "gzip", "gzip", "xz", "bzip2"]


def test_a_bad_header_is_a_corrupt_anomaly_with_its_offset() -> None:
    data = bytearray(files(["a.jpg", "a.txt", "b.jpg"]))
    data[1024 + 10] ^= 0xFF  # the second header's name
    a = audit(bytes(data))
    assert kinds(a) == {"corrupt": 1} and a.members == 1
    (x,) = a.anomalies
    assert x.offset == 1024 and "checksum" in x.message and x.url == "s.tar"


def test_a_shard_cut_in_the_padding_of_its_last_member_says_that_member_is_whole() -> None:
    """Cut after the last member's data, inside its padding: the member is whole, the archive
    is cut (it said "8 bytes of data expected at offset ..." as if the data were missing)."""
    data = archive([(info("a.txt"), b"hello"), (info("a.cls"), b"12345678")])
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        cls = t.getmember("a.cls")
    at = cls.offset_data
    (cut,) = audit(data[:at + 12], url="cut.tar").anomalies
    assert (cut.kind, cut.member, cut.offset) == ("corrupt", "a.cls", cls.offset)
    assert cut.message == (f"the archive is cut at offset {at + 12}, in the padding after "
                           f"'a.cls', which is whole (8 bytes of data at offset {at}): 500 "
                           "bytes of padding and the end-of-archive blocks are missing (a "
                           "shard cut short, e.g. by an interrupted copy or upload)")
    (short,) = audit(data[:at + 4], url="cut.tar").anomalies  # inside the data: not whole
    assert short.message == (f"truncated member: 8 bytes of data expected at offset {at}, "
                             "the stream ends before") and short.offset == cls.offset
