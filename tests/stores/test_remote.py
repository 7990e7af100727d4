"""ResumableStream and AtomicUpload against a RangeSource of our own that fails on purpose, plus
the router's per-scheme options, atomic local writes and the errors of missing pieces.

(The same machinery against real servers and a fault-injecting proxy: test_contract.py and
test_faults.py.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field

import pytest

import wds_cloud as wds
from wds_cloud.errors import (
    AccessDeniedError,
    ConfigError,
    MissingDependencyError,
    ShardNotFoundError,
    TransferError,
    UnsupportedSchemeError,
)
from wds_cloud.router import Router, scheme_options
from wds_cloud.settings import Settings
from wds_cloud.stores.retry import RetryableError, RetryPolicy, io_stats, reset_io_stats
from wds_cloud.stores.streams import AtomicUpload, ObjectMeta, ResumableStream

FAST = RetryPolicy(retries=3, backoff=0.001, backoff_max=0.002, timeout=5)


class _Body:
    def __init__(self, data: bytes, cut_after: int | None) -> None:
        self.data, self.pos, self.cut_after = data, 0, cut_after

    def readinto(self, buffer: memoryview) -> int:
        if self.cut_after is not None and self.pos >= self.cut_after:
            raise ConnectionResetError("connection reset by peer")
        end = len(self.data) if self.cut_after is None else min(len(self.data), self.cut_after)
        n = min(len(buffer), end - self.pos, 1000)
        buffer[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n

    def read(self, size: int) -> bytes:
        buffer = bytearray(size)
        return bytes(buffer[:self.readinto(memoryview(buffer))])

    def close(self) -> None:
        pass


@dataclass
class FlakySource:
    """Serves ``data``; each response is cut after ``cut`` bytes; ``fail_fetches`` answers
    are refused first; ``versions`` gives the version reported by successive fetches."""

    data: bytes
    cut: int | None = None
    fail_fetches: int = 0
    short: bool = False
    versions: list[str] = field(default_factory=lambda: ["v1"])
    offsets: list[int] = field(default_factory=list)

    def fetch(self, offset: int, version: str | None, *,
              resumed: bool = False) -> tuple[_Body, ObjectMeta]:
        if self.fail_fetches:
            self.fail_fetches -= 1
            raise RetryableError("HTTP 503", status=503)
        self.offsets.append(offset)
        v = self.versions[min(len(self.offsets) - 1, len(self.versions) - 1)]
        rest = self.data[offset:]
        # short: the body ends early without an error, as a truncated response does
        body = _Body(rest[: self.cut], None) if self.short else _Body(rest, self.cut)
        return body, ObjectMeta(size=len(self.data), version=v)


DATA = bytes(range(256)) * 400  # 102400 bytes


def test_cuts_resume_at_the_byte_where_they_stopped() -> None:
    reset_io_stats()
    source = FlakySource(DATA, cut=7000)
    stream = ResumableStream(source, url="s3://b/k", policy=FAST)
    assert stream.read() == DATA
    assert source.offsets == list(range(0, len(DATA), 7000))
    stats = io_stats()
    assert stats["resumes"] == len(source.offsets) - 1 and stats["retries"] == stats["resumes"]


def test_read_all_at_once() -> None:
    stream = ResumableStream(FlakySource(DATA * 50, cut=3_000_000), url="s3://b/k", policy=FAST)
    assert stream.read(10) == DATA[:10] and stream.read() == (DATA * 50)[10:]


def test_truncated_responses_are_resumed_too() -> None:
    source = FlakySource(DATA, cut=30000, short=True)
    assert ResumableStream(source, url="http://h/k", policy=FAST).read() == DATA
    assert source.offsets == [0, 30000, 60000, 90000]


def test_refused_requests_are_retried_then_reported_with_url_and_offset() -> None:
    assert ResumableStream(FlakySource(DATA, fail_fetches=3), url="s3://b/k",
                           policy=FAST).read() == DATA
    with pytest.raises(TransferError) as info:
        ResumableStream(FlakySource(DATA, fail_fetches=4), url="s3://b/k?X-Amz-Signature=s3cr3t",
                        policy=FAST)
    err = info.value
    assert err.offset == 0 and err.attempts == 4 and "s3://b/k" in str(err)
    assert "s3cr3t" not in str(err) and isinstance(err, OSError)


def test_budget_counts_failures_in_a_row_only() -> None:
    # 15 cuts, each after progress: far more than 3 retries in all, never 3 in a row
    source = FlakySource(DATA, cut=7000)
    assert ResumableStream(source, url="s3://b/k", policy=FAST).read() == DATA


def test_a_changed_object_is_never_mixed_in() -> None:
    source = FlakySource(DATA, cut=50000, versions=["v1", "v2"])
    stream = ResumableStream(source, url="gs://b/k", policy=FAST)
    with pytest.raises(TransferError, match="changed") as info:
        stream.read()
    assert info.value.offset == 50000


class _HangingBody:
    """A body whose read waits until it is closed, then ends short (as a shut-down socket
    does); closing it takes a while, as closing a connection may."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def read(self, size: int) -> bytes:
        self.closed.wait(10)
        return b""

    def readinto(self, buffer: memoryview) -> int:
        return len(self.read(len(buffer)))

    def close(self) -> None:
        self.closed.set()
        time.sleep(0.2)


def test_closing_from_another_thread_ends_a_read_without_resuming() -> None:
    fetches: list[int] = []

    class Source:
        def fetch(self, offset: int, version: str | None, *,
                  resumed: bool = False) -> tuple[_HangingBody, ObjectMeta]:
            fetches.append(offset)
            return _HangingBody(), ObjectMeta(size=len(DATA), version="v1")

    stream = ResumableStream(Source(), url="s3://b/k", policy=FAST)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            stream.read(100)
        except ValueError as exc:
            raised.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.1)
    stream.close()
    reader.join(10)
    assert not reader.is_alive() and fetches == [0] and len(raised) == 1


def test_retries_are_logged_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wds_cloud.stores")
    ResumableStream(FlakySource(DATA, cut=60000), url="https://h/k?sig=abc",
                    policy=FAST).read()
    text = caplog.text
    assert "retry 1/3 of https://h/k?sig=*** at byte 60000" in text and "abc" not in text


def test_atomic_upload_commits_only_on_clean_close() -> None:
    got: list[bytes] = []
    up = AtomicUpload(lambda f: got.append(f.read()), url="s3://b/k", spool_bytes=10)
    up.write(b"hello ")
    up.write(b"world, past the in-memory limit")
    up.close()
    assert got == [b"hello world, past the in-memory limit"]
    aborted = AtomicUpload(lambda f: got.append(f.read()), url="s3://b/k")
    aborted.write(b"partial")
    aborted.abort()
    dropped = AtomicUpload(lambda f: got.append(f.read()), url="s3://b/k")
    dropped.write(b"abandoned")
    del dropped
    with pytest.raises(RuntimeError), AtomicUpload(lambda f: got.append(f.read()),
                                                   url="s3://b/k") as failed:
        failed.write(b"half")
        raise RuntimeError("the job died")
    assert len(got) == 1


def test_local_writes_appear_whole_or_not_at_all(tmp_path: os.PathLike[str]) -> None:
    target = os.path.join(tmp_path, "shard.tar")
    with pytest.raises(RuntimeError), wds.TarWriter(target) as sink:
        sink.write({"__key__": "a", "txt": "x"})
        raise RuntimeError("the job died")
    assert os.listdir(tmp_path) == []
    with wds.TarWriter(target) as sink:
        sink.write({"__key__": "a", "txt": "x"})
        assert os.listdir(tmp_path) != ["shard.tar"]  # not visible until complete
    assert os.listdir(tmp_path) == ["shard.tar"]
    with tarfile.open(target) as tar:
        assert tar.getnames() == ["a.txt"]
    assert oct(os.stat(target).st_mode & 0o777) != oct(0o600)  # the umask applies, as for open()


def test_shardwriter_drops_only_the_unfinished_shard(tmp_path: os.PathLike[str]) -> None:
    pattern = os.path.join(tmp_path, "s-%02d.tar")
    with pytest.raises(RuntimeError), wds.ShardWriter(pattern, maxcount=2) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": "x"})
        raise RuntimeError("stop")
    assert sorted(os.listdir(tmp_path)) == ["s-00.tar", "s-01.tar"]


def test_storage_options_per_scheme_or_flat() -> None:
    per = {"s3": {"key": "a"}, "gcs": {"token": "anon"}}
    assert scheme_options(per, "s3") == {"key": "a"}
    assert scheme_options(per, "gs") == {"token": "anon"}  # gs and gcs are one store
    assert scheme_options(per, "") == {}
    assert scheme_options({"endpoint_url": "http://x"}, "s3") == {"endpoint_url": "http://x"}
    with pytest.raises(ConfigError, match="'nope'"):
        scheme_options({"s3": {}, "nope": {}}, "s3")


def test_ais_urls_go_to_the_gateway() -> None:
    router = Router(Settings(ais_endpoint="http://127.0.0.1:9/"))
    assert router.resolve("ais://bucket/a/b.tar") == (
        "http://127.0.0.1:9/v1/objects/bucket/a/b.tar?provider=ais")
    with pytest.raises(ConfigError, match="AIS_ENDPOINT"):
        Router(Settings()).resolve("ais://bucket/a.tar")


def test_unknown_scheme_lists_the_registered_ones() -> None:
    with pytest.raises(UnsupportedSchemeError) as info:
        wds.gopen("nosuch://b/k")
    for scheme in ("s3", "gs", "az", "http", "https", "pipe"):
        assert scheme in info.value.registered


@pytest.mark.parametrize(("url", "module", "extra"), [
    ("s3://b/k.tar", "s3fs", "s3"), ("gs://b/k.tar", "gcsfs", "gcs"),
    ("az://c/k.tar", "adlfs", "azure"), ("http://127.0.0.1:9/k.tar", "aiohttp", "http"),
])
def test_a_missing_library_names_the_pip_extra(url: str, module: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "import wds_cloud as wds\n"
            f"try:\n    wds.gopen({url!r})\n"
            "except wds.MissingDependencyError as e:\n    print(e.extra, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith(f"{extra} |") and f"wds-cloud[{extra}]" in out
    assert issubclass(MissingDependencyError, ImportError)


def test_error_classes_keep_their_builtins() -> None:
    assert issubclass(ShardNotFoundError, FileNotFoundError)
    assert issubclass(AccessDeniedError, PermissionError)
    assert issubclass(TransferError, OSError)
