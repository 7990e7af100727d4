"""A shard cut inside a later sample's member: every sample complete before the damage comes out
first, then the error is raised (``reraise_exception``) or handed to the handler, whatever the
handler, whether the shard is a local file (read through a memory map), any other stream, or
gzip-compressed."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_cloud as wds
from wds_cloud.errors import ShardFormatError
from wds_cloud.tar.shardloop import samples_from_shards

COUNT = 8
CUT_SAMPLE = 5  # the cut falls in a member of this sample


def _shard(member: int) -> tuple[bytes, int]:
    """Samples of a large ``.jpg`` + ``.json`` + ``.cls``; the bytes, and an offset inside
    the data of member ``member`` (0: .jpg, 1: .json) of sample :data:`CUT_SAMPLE`."""
    out = io.BytesIO()
    cut = -1
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(COUNT):
            for j, (ext, size) in enumerate((("jpg", 70_000 + i), ("json", 900), ("cls", 2))):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = size
                if i == CUT_SAMPLE and j == member:
                    cut = out.tell() + 512 + size // 2
                tar.addfile(info, io.BytesIO(bytes([i]) * size))
    return out.getvalue(), cut


def _opened(kind: str, tmp_path: Path, blob: bytes) -> tuple[str, Callable[..., Any]]:
    if kind == "file":
        path = tmp_path / "cut.tar"
        path.write_bytes(blob)
        return str(path), lambda url, **kw: open(url, "rb")
    if kind == "gzip":
        return "mem.tar.gz", lambda url, **kw: io.BytesIO(gzip.compress(blob))
    return "mem.tar", lambda url, **kw: io.BytesIO(blob)


def _until_error(samples: Iterator[dict[str, Any]], got: list[str]) -> BaseException | None:
    try:
        for sample in samples:
            got.append(sample["__key__"])
    except ShardFormatError as exc:
        return exc
    return None


@pytest.mark.parametrize("member", [0, 1], ids=["first-member", "second-member"])
@pytest.mark.parametrize("kind", ["file", "stream", "gzip"])
def test_the_complete_samples_come_out_before_the_error(tmp_path: Path, kind: str,
                                                        member: int) -> None:
    blob, cut = _shard(member)
    url, open_stream = _opened(kind, tmp_path, blob[:cut])
    complete = [f"s{i:03d}" for i in range(CUT_SAMPLE)]
    got: list[str] = []
    error = _until_error(samples_from_shards([{"url": url}], handler=wds.reraise_exception,
                                             open_stream=open_stream), got)
    assert isinstance(error, ShardFormatError) and "truncated" in str(error)
    assert got == complete
    # any handler is called only once they are out
    seen: list[int] = []

    def note(exc: BaseException) -> bool:
        seen.append(len(got))
        return True

    got = []
    assert _until_error(samples_from_shards([{"url": url}], handler=note,
                                            open_stream=open_stream), got) is None
    assert got == complete and seen == [CUT_SAMPLE]


@pytest.mark.parametrize("handler", ["reraise_exception", "warn_and_continue",
                                     "ignore_and_continue", "ignore_and_stop"])
def test_webdataset_over_a_cut_local_shard(tmp_path: Path, handler: str) -> None:
    blob, cut = _shard(0)
    (tmp_path / "a.tar").write_bytes(blob[:cut])
    good, _ = _shard(0)
    (tmp_path / "b.tar").write_bytes(good)
    urls = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    dataset = wds.WebDataset(urls, shardshuffle=False, handler=getattr(wds, handler))
    got: list[str] = []
    if handler == "reraise_exception":
        assert _until_error(iter(dataset), got) is not None
        assert got == [f"s{i:03d}" for i in range(CUT_SAMPLE)]
        return
    if handler == "warn_and_continue":
        with pytest.warns(UserWarning, match="truncated member"):
            got = [s["__key__"] for s in dataset]
    else:
        got = [s["__key__"] for s in dataset]
    rest = [] if handler == "ignore_and_stop" else [f"s{i:03d}" for i in range(COUNT)]
    assert got == [f"s{i:03d}" for i in range(CUT_SAMPLE)] + rest
