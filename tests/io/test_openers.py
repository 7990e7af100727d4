"""The router and the built-in openers: local, file:, pipe:, '-' and the registry."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO

import pytest

import wds_cloud as wds
from wds_cloud.errors import ConfigError, OpenError, PipeError, ShardNotFoundError
from wds_cloud.io import registry as openers
from wds_cloud.router import gopen, gopen_schemes, resolve_url
from wds_cloud.settings import Settings


@pytest.fixture
def blob(tmp_path: Path) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 1000)
    return path


def test_local_and_file_urls(blob: Path) -> None:
    with gopen(str(blob)) as f:
        assert f.read() == blob.read_bytes()
        assert f.local_path == str(blob)  # type: ignore[attr-defined]
    with gopen(blob.as_uri()) as f:
        assert f.read() == blob.read_bytes()


def test_a_local_write_left_unclosed_is_kept_and_one_that_raised_is_not(
        tmp_path: Path) -> None:
    """``np.save(wds.gopen(path, "wb"), a)`` never closes the file: its bytes appear when it
    is collected, as a plain file's do (they were dropped). A ``with`` block that raises
    leaves the path as it was, and no temporary file behind."""
    import gc

    import numpy as np

    target = tmp_path / "a.npy"
    np.save(gopen(str(target), "wb"), np.arange(5))
    gc.collect()
    assert np.load(target).tolist() == [0, 1, 2, 3, 4]
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), gopen(str(target), "wb") as f:
        f.write(b"half of the new")
        raise RuntimeError("the job failed")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]


def test_local_write(tmp_path: Path) -> None:
    with gopen(str(tmp_path / "out.bin"), "wb") as f:
        f.write(b"abc")
    assert (tmp_path / "out.bin").read_bytes() == b"abc"


def test_missing_file_is_shard_not_found(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(ShardNotFoundError) as info:
        gopen(missing)
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.url == missing and missing in str(info.value)


def test_bad_mode_is_rejected(blob: Path) -> None:
    with pytest.raises(ConfigError, match="mode"):
        gopen(str(blob), "r")


def test_pipe_reads_command_output(blob: Path) -> None:
    with gopen(f"pipe:cat {blob}") as f:
        assert f.read() == blob.read_bytes()


def test_pipe_failing_midway_raises_with_stderr_tail(blob: Path) -> None:
    url = f"pipe:head -c 5000 {blob}; echo 'disk on fire' >&2; exit 7"
    with gopen(url) as f:
        first = f.read(4000)
        with pytest.raises(PipeError) as info:
            while f.read(1000):
                pass
    assert first == blob.read_bytes()[:4000]
    err = info.value
    assert err.returncode == 7 and "disk on fire" in err.stderr and "disk on fire" in str(err)
    assert err.url == url and isinstance(err, OSError)


def test_pipe_closed_early_kills_the_command_quietly(blob: Path) -> None:
    f = gopen("pipe:yes")
    assert f.read(10) == b"y\ny\ny\ny\ny\n"
    f.close()  # no error, no hang


def test_pipe_write_checks_status(tmp_path: Path) -> None:
    target = tmp_path / "piped.bin"
    with gopen(f"pipe:cat > {target}", "wb") as f:
        f.write(b"hello")
    assert target.read_bytes() == b"hello"
    f = gopen("pipe:cat > /dev/null; exit 4", "wb")
    f.write(b"x")
    with pytest.raises(PipeError, match="status 4"):
        f.close()


def test_stdin_dash(blob: Path) -> None:
    code = (
        "import sys, wds_cloud\n"
        "data = wds_cloud.gopen('-').read()\n"
        "out = wds_cloud.gopen('-', 'wb'); out.write(str(len(data)).encode()); out.close()\n"
        "sys.stdout.write('|still-open')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob.read_bytes(),
                         capture_output=True, check=True)
    assert out.stdout == f"{blob.stat().st_size}|still-open".encode()


def test_unknown_scheme_lists_registered_ones() -> None:
    with pytest.raises(wds.UnsupportedSchemeError) as info:
        gopen("nosuch://bucket/a.tar")
    assert "nosuch" in str(info.value) and "pipe" in str(info.value)
    assert isinstance(info.value, ValueError)


class _MemoryOpener:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.seen: list[str] = []

    def open(self, url: str, mode: str, **options: Any) -> BinaryIO:
        self.seen.append(url)
        return io.BytesIO(self.data)


def test_register_refuses_taken_scheme_unless_replace() -> None:
    mem = _MemoryOpener(b"payload")
    try:
        openers.register_opener("memtest", mem)
        assert "memtest" in openers.registered_schemes()
        with gopen("memtest://x/y") as f:
            assert f.read() == b"payload"
        with pytest.raises(ConfigError, match="replace=True"):
            openers.register_opener("memtest", _MemoryOpener(b""))
        with pytest.raises(ConfigError, match="replace=True"):
            openers.register_opener("pipe", _MemoryOpener(b""))
        openers.register_opener("memtest", _MemoryOpener(b"other"), replace=True)
        assert gopen("memtest://x/y").read() == b"other"
    finally:
        openers.unregister_opener("memtest")
    with pytest.raises(wds.UnsupportedSchemeError):
        gopen("memtest://x/y")


def test_gopen_schemes_accepts_webdataset_style_handlers() -> None:
    calls: list[tuple[str, str, int]] = []

    def handler(url: str, mode: str, bufsize: int, **kw: Any) -> BinaryIO:
        calls.append((url, mode, bufsize))
        return io.BytesIO(b"from-handler")

    gopen_schemes["wdsold"] = handler
    try:
        assert "wdsold" in gopen_schemes
        assert gopen("wdsold://a/b", bufsize=1234).read() == b"from-handler"
        assert calls == [("wdsold://a/b", "rb", 1234)]
    finally:
        del gopen_schemes["wdsold"]
    assert "wdsold" not in gopen_schemes


def test_rewrite_from_environment_reads_gs_from_local_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bkt").mkdir()
    (tmp_path / "bkt" / "a.tar").write_bytes(b"local copy")
    monkeypatch.setenv("WDS_REWRITE", f"gs://={tmp_path}/")
    assert resolve_url("gs://bkt/a.tar") == f"{tmp_path}/bkt/a.tar"
    with gopen("gs://bkt/a.tar") as f:
        assert f.read() == b"local copy"


def test_gopen_rewrite_name_is_read_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.tar").write_bytes(b"x")
    monkeypatch.setenv("GOPEN_REWRITE", f"remote:///={tmp_path}/")
    assert gopen("remote:///a.tar").read() == b"x"


def test_not_found_after_rewrite_names_both_urls(tmp_path: Path) -> None:
    settings = Settings(rewrite=f"gs://={tmp_path}/")
    with pytest.raises(ShardNotFoundError) as info:
        gopen("gs://bkt/missing.tar", settings=settings)
    assert info.value.url == "gs://bkt/missing.tar"
    assert info.value.resolved_url == f"{tmp_path}/bkt/missing.tar"
    message = str(info.value)  # the README promises both in the message, not only attributes
    assert "gs://bkt/missing.tar" in message and f"{tmp_path}/bkt/missing.tar" in message


def test_malformed_rewrite_variable_is_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_REWRITE", "no-equals")
    with pytest.raises(ConfigError, match="WDS_REWRITE"):
        gopen("/x.tar")


def test_ais_without_endpoint_is_config_error() -> None:
    with pytest.raises(ConfigError, match="AIS_ENDPOINT"):
        resolve_url("gs://b/k.tar", settings=Settings(use_ais_for=("gs",)))
    url = resolve_url("gs://b/k.tar", settings=Settings(use_ais_for=("gs",),
                                                        ais_endpoint="http://127.0.0.1:1"))
    assert url == "http://127.0.0.1:1/v1/objects/b/k.tar?provider=gcp"


def test_open_error_is_oserror() -> None:
    assert issubclass(OpenError, OSError) and issubclass(ShardNotFoundError, FileNotFoundError)


def test_writing_into_a_missing_directory_says_so(tmp_path: Path) -> None:
    target = str(tmp_path / "no" / "such" / "dir" / "a.tar")
    with pytest.raises(OpenError, match="directory does not exist") as info:
        gopen(target, "wb")
    assert not isinstance(info.value, ShardNotFoundError) and info.value.url == target


def test_local_glob_of_a_missing_directory_matches_nothing(tmp_path: Path) -> None:
    """Python's glob answers ``["missing/"]`` for ``missing/**``: the opener's glob drops it,
    so a spec naming a directory that is not there says nothing was found."""
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "a.tar").write_bytes(b"")
    glob = openers.get_opener(str(tmp_path / "here" / "a.tar")).glob  # type: ignore[attr-defined]
    assert glob(f"{tmp_path}/missing/**") == []
    assert glob(f"file://{tmp_path}/missing/**") == []
    assert glob(f"{tmp_path}/here/**") == [f"{tmp_path}/here/", f"{tmp_path}/here/a.tar"]
