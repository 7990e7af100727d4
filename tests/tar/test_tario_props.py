"""Property tests: random archives read member-for-member like Python's tarfile; random cuts
never yield half a member; sizes beyond 8 GiB parse."""

from __future__ import annotations

import gzip
import io
import random
import tarfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from wds_cloud.errors import ShardFormatError
from wds_cloud.tar import bulk
from wds_cloud.tar import reader as tarformat

FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

segment = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
    min_size=1, max_size=60,
)
names = st.lists(segment, min_size=1, max_size=4).map("/".join)
sizes = st.one_of(st.sampled_from([0, 1, 511, 512, 513, 1024, 1536]), st.integers(0, 3000))
kinds = st.sampled_from(["file"] * 6 + ["dir", "symlink", "hardlink"])
members = st.lists(st.tuples(names, sizes, kinds), max_size=12)


def build(spec: list[tuple[str, int, str]], fmt: int, seed: int) -> bytes | None:
    """The archive for ``spec``, or None when ``fmt`` cannot hold one of the names."""
    rng = random.Random(seed)
    out = io.BytesIO()
    try:
        with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
            for name, size, kind in spec:
                info = tarfile.TarInfo(name)
                if kind == "file":
                    info.size = size
                    tf.addfile(info, io.BytesIO(rng.randbytes(size)))
                    continue
                info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                             "hardlink": tarfile.LNKTYPE}[kind]
                info.linkname = "target"
                tf.addfile(info)
    except ValueError:  # e.g. a name too long for ustar
        return None
    return out.getvalue()


def reference(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg()]  # type: ignore[union-attr]


def read_all(data: bytes, chunk_size: int, probe: int = bulk._PROBE,
             direct_min: int = tarformat.DIRECT_MIN,
             ) -> tuple[list[tuple[str, bytes]], Exception | None]:
    """Members read before the end or the error. ``probe`` = 1 vectorizes (almost) at once;
    ``direct_min`` is the size from which members are read one by one with exact reads."""
    got: list[tuple[str, bytes]] = []
    saved, bulk._PROBE = bulk._PROBE, probe
    saved_min, tarformat.DIRECT_MIN = tarformat.DIRECT_MIN, direct_min
    try:
        for batch in tarformat.iter_member_batches(io.BytesIO(data), url="mem://p.tar",
                                                   chunk_size=chunk_size):
            got.extend(batch)
    except ShardFormatError as exc:
        return got, exc
    finally:
        bulk._PROBE, tarformat.DIRECT_MIN = saved, saved_min
    return got, None


@SETTINGS
@given(spec=members, fmt=st.sampled_from(FORMATS), seed=st.integers(0, 2**16),
       compress=st.booleans(), chunk=st.sampled_from([512, 1536, 4096, tarformat.CHUNK_SIZE]),
       probe=st.sampled_from([1, 2, 32]), direct_min=st.sampled_from([1, 600, 1 << 16]))
def test_random_archives_read_like_tarfile(spec: list[tuple[str, int, str]], fmt: int, seed: int,
                                           compress: bool, chunk: int, probe: int,
                                           direct_min: int) -> None:
    data = build(spec, fmt, seed)
    assume(data is not None)
    assert data is not None
    if compress:
        data = gzip.compress(data, compresslevel=1)
    expected = reference(data)
    got, error = read_all(data, chunk, probe, direct_min)
    assert error is None
    assert got == expected
    assert len(got) == sum(1 for _, _, kind in spec if kind == "file")


def _member_ends(data: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [m.offset_data + -(-m.size // 512) * 512 if m.isreg() else m.offset_data
                for m in tf]


@SETTINGS
@given(spec=members, fmt=st.sampled_from(FORMATS), seed=st.integers(0, 2**16),
       where=st.floats(0, 1), compress=st.booleans(), probe=st.sampled_from([1, 32]),
       direct_min=st.sampled_from([1, 600, 1 << 16]))
def test_random_truncation_never_yields_half_a_member(
    spec: list[tuple[str, int, str]], fmt: int, seed: int, where: float, compress: bool,
    probe: int, direct_min: int,
) -> None:
    data = build(spec, fmt, seed)
    assume(data is not None and spec)
    assert data is not None
    full = reference(data)
    ends = _member_ends(data)
    packed = gzip.compress(data, compresslevel=1) if compress else data
    cut = int(where * len(packed))
    got, error = read_all(packed[:cut], 4096, probe, direct_min)
    assert got == full[:len(got)]  # a prefix of whole members
    whole = sum(1 for (_, _, kind), end in zip(spec, ends, strict=True)
                if kind == "file" and end <= cut)  # data and padding before the cut
    if error is not None:
        assert error.url == "mem://p.tar" and error.offset is not None
        if not compress:  # every member whole before the damage came first
            assert len(got) >= whole
    elif compress:
        assert cut == 0 or got == full
    else:
        assert cut == 0 or cut in ends or cut >= ends[-1]
        assert got == full[:whole]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_sizes_beyond_8_gib_parse(fmt: int) -> None:
    size = 9 * 2**30 + 123
    info = tarfile.TarInfo("huge/member.bin")
    info.size = size
    headers = info.tobuf(fmt, "utf-8", "surrogateescape")
    if fmt == tarfile.GNU_FORMAT:
        field = headers[124:136]
        assert field[0] == 0x80  # base-256, written by tarfile
        assert tarformat.parse_number(field) == size
        assert tarfile.TarInfo.frombuf(headers[:512], "utf-8", "strict").size == size
    stream = headers + b"\x01" * 5000
    got, error = read_all(stream, tarformat.CHUNK_SIZE)
    assert got == []
    assert error is not None and error.member == "huge/member.bin"
    assert error.offset == len(headers) - 512  # the header that holds (or follows) the size
    assert str(size) in str(error)


def test_hand_made_base256_header() -> None:
    size = 2**36 + 5  # 64 GiB: beyond what 11 octal digits can hold
    header = bytearray(512)
    header[0:8] = b"big.bin\0"
    header[100:108] = b"0000644\0"
    header[124:136] = b"\x80" + size.to_bytes(11, "big")
    header[156:157] = b"0"
    header[257:265] = b"ustar  \0"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    assert tarfile.TarInfo.frombuf(bytes(header), "utf-8", "strict").size == size
    got, error = read_all(bytes(header) + bytes(512), tarformat.CHUNK_SIZE)
    assert got == [] and error is not None
    assert error.member == "big.bin" and str(size) in str(error)


def _raw_member(name: bytes, data: bytes) -> bytes:
    """A ustar member whose name field is ``name`` as it is (any bytes, up to 100)."""
    info = tarfile.TarInfo("x")
    info.size = len(data)
    header = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    header[0:100] = name.ljust(100, b"\0")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + data + bytes(-len(data) % 512)


@pytest.mark.parametrize("probe", [1, 32])
@pytest.mark.parametrize("chunk", [4096, 20_000, tarformat.CHUNK_SIZE])
def test_small_member_walk_through_what_looks_like_headers(probe: int, chunk: int) -> None:
    """Shards of small members whose data are tar archives themselves (blocks that look like
    plain headers), with names of exactly 100 bytes, bytes that are not UTF-8, and a pax
    header now and then: read like tarfile, whichever way the buffer is walked."""
    rng = random.Random(5)
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(3):
            info = tarfile.TarInfo(f"inner{i}.txt")
            info.size = 700
            tf.addfile(info, io.BytesIO(rng.randbytes(700)))
    nested = inner.getvalue()
    parts = []
    for i in range(300):
        if i % 7 == 3:
            parts.append(_raw_member(b"n%04d." % i + b"x" * 94, b"hundred"))
        elif i % 11 == 5:
            parts.append(_raw_member(b"bad\xe4\xff%04d.cls" % i, b"%d" % i))
        elif i % 13 == 6:
            out = io.BytesIO()
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
                info = tarfile.TarInfo(f"p{i:04d}.\u00e9t\u00e9")
                info.size = 10
                tf.addfile(info, io.BytesIO(b"0123456789"))
            parts.append(out.getvalue()[:_member_ends(out.getvalue())[-1]])  # no end blocks
        else:
            parts.append(_raw_member(b"s%04d.tar" % i, nested if i % 2 else rng.randbytes(300)))
    data = b"".join(parts) + bytes(1024)
    expected = reference(data)
    assert len(expected) == 300
    got, error = read_all(data, chunk, probe)
    assert error is None
    assert got == expected


@SETTINGS
@given(name=names, fmt=st.sampled_from(FORMATS), flip=st.integers(-1, 511),
       field=st.sampled_from(["%06o\0 ", "%07o\0", "%06o \0", "%07o "]),
       signed=st.booleans())
def test_header_checksums_agree_with_tarfile(name: str, fmt: int, flip: int, field: str,
                                             signed: bool) -> None:
    """checksum_ok against tarfile's own sums, for headers of ASCII and non-ASCII names, in
    every form of the checksum field tar writers use, the signed variant, and one byte
    changed anywhere."""
    try:
        header = bytearray(tarfile.TarInfo(name).tobuf(fmt, "utf-8", "surrogateescape")[-512:])
    except ValueError:
        assume(False)
    unsigned_chk, signed_chk = tarfile.calc_chksums(bytes(header))
    header[148:156] = (field % (signed_chk if signed else unsigned_chk)).encode()
    if flip >= 0 and not 148 <= flip < 156:
        header[flip] ^= 0x5A
    block = bytes(header)
    unsigned_now, signed_now = tarfile.calc_chksums(block)
    stored = int(block[148:156].replace(b"\0", b" ").strip() or b"0", 8)
    assert tarformat.checksum_ok(block) == (stored in (unsigned_now, signed_now))
