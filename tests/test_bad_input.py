"""Bad input through the public API: every case gives the documented error, naming the URL.

Each case is read the way a training script reads it (``wds.WebDataset``), once with the
default handler (an exception) and once with ``warn_and_continue`` (the good shards still arrive).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import wds_cloud as wds


def write_shard(path: Path, keys: range) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in keys:
            for ext, data in (("txt", f"text {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def truncated(path: Path) -> str:
    data = write_shard(path, range(100, 110))
    path.write_bytes(data[: 512 * 7 + 100])  # cut inside the data of the 4th member
    return str(path)


def garbage(path: Path) -> str:
    path.write_bytes(bytes(range(256)) * 40)
    return str(path)


def member_larger_than_stream(path: Path) -> str:
    info = tarfile.TarInfo("s0100.txt")
    info.size = 1_000_000
    path.write_bytes(info.tobuf(tarfile.USTAR_FORMAT) + b"x" * 1000)
    return str(path)


def empty(path: Path) -> str:
    path.write_bytes(b"")  # a failed upload: webdataset's handler gets ReadError('empty file')
    return str(path)


def empty_pipe(path: Path) -> str:
    path.write_bytes(b"")
    return f"pipe:cat {path}"


def missing(path: Path) -> str:
    return str(path.with_name("does-not-exist.tar"))


def failing_pipe(path: Path) -> str:
    data = write_shard(path, range(100, 110))
    return f"pipe:head -c {len(data) // 2} {path}; echo 'network is down' >&2; exit 3"


CASES: dict[str, tuple[Callable[[Path], str], type[BaseException], str]] = {
    "truncated": (truncated, wds.ShardFormatError, "offset="),
    "garbage": (garbage, wds.ShardFormatError, "offset=0"),
    "member larger than stream": (member_larger_than_stream, wds.ShardFormatError, "s0100.txt"),
    "missing file": (missing, wds.ShardNotFoundError, "does-not-exist.tar"),
    "empty file": (empty, wds.ShardFormatError, "empty shard: 0 bytes"),
    "empty pipe": (empty_pipe, wds.ShardFormatError, "empty shard: 0 bytes"),
    "pipe failing midway": (failing_pipe, wds.PipeError, "network is down"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_shard_raises_documented_error(case: str, tmp_path: Path) -> None:
    make, error, detail = CASES[case]
    url = make(tmp_path / "bad.tar")
    with pytest.raises(error) as info:
        list(wds.WebDataset(url, shardshuffle=False))
    message = str(info.value)
    assert detail in message
    shown = getattr(info.value, "url", None) or message
    assert url in shown or url in message


@pytest.mark.parametrize("case", sorted(CASES))
def test_handler_skips_bad_shard_and_keeps_good_ones(case: str, tmp_path: Path) -> None:
    make, error, _ = CASES[case]
    good_a, good_b = tmp_path / "a.tar", tmp_path / "b.tar"
    write_shard(good_a, range(0, 5))
    write_shard(good_b, range(5, 10))
    bad = make(tmp_path / "bad.tar")
    dataset = wds.WebDataset([str(good_a), bad, str(good_b)], shardshuffle=False,
                             handler=wds.warn_and_continue)
    with pytest.warns(UserWarning) as warned:
        keys = [s["__key__"] for s in dataset]
    good_keys = [f"s{i:04d}" for i in range(10)]
    # samples of the bad shard that were complete before the damage may arrive, never others
    assert [k for k in keys if k in good_keys] == good_keys
    assert all(k in good_keys or k.startswith("s01") for k in keys)
    assert any(error.__name__ in str(w.message) for w in warned)


def test_an_archive_with_no_members_is_no_error(tmp_path: Path) -> None:
    """Only a shard of 0 bytes is damage: a tar archive with no members (its end blocks only)
    yields nothing, quietly, as in webdataset."""
    tarfile.open(tmp_path / "none.tar", "w").close()
    good = tmp_path / "a.tar"
    write_shard(good, range(3))
    urls = [str(tmp_path / "none.tar"), str(good)]
    assert len(list(wds.WebDataset(urls, shardshuffle=False))) == 3


def test_empty_shard_list_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        list(wds.WebDataset([], shardshuffle=False))
    with pytest.raises(ValueError, match="empty"):
        list(wds.DataPipeline(wds.SimpleShardList([]), wds.tarfile_to_samples()))


def test_half_member_is_never_yielded(tmp_path: Path) -> None:
    """A shard cut inside a member yields only the samples that were whole before the cut."""
    url = truncated(tmp_path / "cut.tar")
    samples = list(wds.WebDataset(url, shardshuffle=False, handler=wds.ignore_and_continue))
    for sample in samples:
        i = int(sample["__key__"][1:])
        assert sample["txt"] == f"text {i}".encode() and sample["cls"] == str(i).encode()
    assert [s["__key__"] for s in samples] == ["s0100"]
