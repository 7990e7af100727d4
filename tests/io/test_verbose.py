"""GOPEN_VERBOSE: webdataset's lines on stderr for every URL opened, and one when it ends.

The reference is the installed webdataset 1.0.2, run on the same files in a subprocess: the
``GOPEN``, ``GOPEN REWRITE`` and ``pipe exit`` lines are its own, byte for byte (process ids
aside); ``closed [...]`` lines are ours (its streams other than pipes end unsaid).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from shardgen import write_tar
from stores import Store
from zygote import Zygote

import wds_cloud as wds
from wds_cloud.router import gopen
from wds_cloud.settings import Settings

ON = Settings.from_env({"GOPEN_VERBOSE": "1"})
PIDS = re.compile(r"\[(-?\d+|None) \d+:\d+\]")


def _run(zygote: Zygote, code: str, *args: str, **env: str
         ) -> subprocess.CompletedProcess[str]:
    return zygote.run([sys.executable, "-u", "-c", textwrap.dedent(code), *args],
                      capture_output=True, text=True, timeout=240,
                      env={**os.environ, "GOPEN_VERBOSE": "1", **env})


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("GOPEN", "pipe exit",
                                                                    "closed", "--"))]


REFERENCE = """
    import importlib, os, sys, time
    lib = importlib.import_module(sys.argv[1])
    d = sys.argv[2]
    info = importlib.import_module(sys.argv[3]).info
    def step():
        print("--", file=sys.stderr)
    with lib.gopen(f"{d}/a.txt") as f:
        f.read()
    step()
    with lib.gopen("/rewritten-by-rule/a.txt") as f:
        f.read()
    step()
    f = lib.gopen(f"pipe:cat {d}/a.txt")
    while f.read(4):
        pass
    time.sleep(0.3)  # webdataset says 'pipe exit' at a read that finds the command gone
    f.read(4)
    f.close()
    step()
    info["node"] = "n1"
    with lib.gopen(f"{d}/a.txt") as f:
        f.read()
    print("pid", os.getpid())
"""


def test_gopen_says_what_webdataset_says(tmp_path: Path, zygote: Zygote) -> None:
    (tmp_path / "a.txt").write_bytes(b"twelve bytes")
    env = {"GOPEN_REWRITE": f"/rewritten-by-rule/={tmp_path}/"}
    theirs = _run(zygote, REFERENCE, "webdataset", str(tmp_path), "webdataset.gopen", **env)
    ours = _run(zygote, REFERENCE, "wds_cloud", str(tmp_path), "wds_cloud.router", **env)
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    pid = int(ours.stdout.split()[-1])
    assert ours.stdout.split() == ["pid", str(pid)]  # every line on stderr, none on stdout
    # webdataset prints its rewrite line on stdout: put it where it came, among the others
    reference = _lines(theirs.stderr)
    rewrite = [line for line in _lines(theirs.stdout) if line.startswith("GOPEN REWRITE")]
    assert len(rewrite) == 1
    reference.insert(reference.index("GOPEN /rewritten-by-rule/a.txt {}") + 1, rewrite[0])
    said = _lines(ours.stderr)
    assert [PIDS.sub(r"[\1 PID]", line) for line in said if not line.startswith("closed")] \
        == [PIDS.sub(r"[\1 PID]", line) for line in reference]
    assert re.fullmatch(rf"pipe exit \[0 {pid}:\d+\] \(\('cat {tmp_path}/a.txt',\), "
                        r"\{'shell': True, 'bufsize': 8192\}\) \{\}",
                        next(line for line in said if line.startswith("pipe exit")))
    closed = [line for line in said if line.startswith("closed")]
    assert closed == [f"closed [12 bytes {pid}] {tmp_path}/a.txt {{}}",
                      f"closed [12 bytes {pid}] /rewritten-by-rule/a.txt {{}}",
                      f"closed [12 bytes {pid}] {tmp_path}/a.txt {{'node': 'n1'}}"]


def test_off_by_default_and_unwrapped(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_bytes(b"abc")
    with gopen(str(tmp_path / "a.txt")) as f:
        assert type(f) is io.BufferedReader
        f.read()
    with gopen(str(tmp_path / "a.txt"), settings=Settings.from_env({"GOPEN_VERBOSE": "0"})) as f:
        assert type(f) is io.BufferedReader
    assert capfd.readouterr().err == ""


def test_the_stream_is_the_stream_it_wraps(tmp_path: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lines.txt"
    with gopen(str(path), "wb", settings=ON) as out:
        out.write(b"one\n")
        out.writelines([b"two\n", b"three\n"])
    with gopen(str(path), settings=ON) as f:
        assert isinstance(f, io.BufferedReader)  # as without GOPEN_VERBOSE
        assert f.local_path == str(path)  # type: ignore[attr-defined]
        assert next(f) == b"one\n"
        buffer = bytearray(4)
        assert f.readinto(buffer) == 4 and buffer == b"two\n"
        assert list(f) == [b"three\n"]
        assert f.read() == b""
    assert f.closed
    aborted = gopen(str(tmp_path / "never.txt"), "wb", settings=ON)
    aborted.write(b"half")
    aborted.abort()  # type: ignore[attr-defined]
    assert not (tmp_path / "never.txt").exists()
    pid = os.getpid()
    assert _lines(capfd.readouterr().err) == [
        f"GOPEN {path} {{}}", f"closed [14 bytes {pid}] {path} {{}}",
        f"GOPEN {path} {{}}", f"closed [14 bytes {pid}] {path} {{}}",
        f"GOPEN {tmp_path}/never.txt {{}}", f"closed [4 bytes {pid}] {tmp_path}/never.txt {{}}",
    ]


def test_a_pipe_stopped_early_and_a_failing_one(capfd: pytest.CaptureFixture[str]) -> None:
    pid = os.getpid()
    with gopen("pipe:yes", settings=ON) as f:
        f.read(10)
    with gopen("pipe:echo out; exit 3", settings=ON) as f, pytest.raises(wds.errors.PipeError):
        f.read()
    said = _lines(capfd.readouterr().err)
    assert said[0] == "GOPEN pipe:yes {}"
    assert re.fullmatch(rf"pipe exit \[-9 {pid}:\d+\] \(\('yes',\), \{{'shell': True, "
                        r"'bufsize': 8192\}\) \{\}", said[1])
    assert said[2] == "GOPEN pipe:echo out; exit 3 {}"
    assert re.fullmatch(rf"pipe exit \[3 {pid}:\d+\] \(\('echo out; exit 3',\), .*", said[3])
    assert len(said) == 4


def test_urls_are_redacted(store_factory: Callable[[str], Store],
                           capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    http = store_factory("http")
    http.put("v/a.bin", b"data")
    signed = http.url("v/a.bin").replace("://", "://user:hunter2@", 1) \
        + "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=s3cr3t"
    with gopen(signed, settings=ON, storage_options=http.storage_options) as f:
        assert f.read() == b"data"
    (tmp_path / "a.txt").write_bytes(b"abc")
    with gopen(f"pipe:cat {tmp_path}/a.txt # {signed}", settings=ON) as f:
        assert f.read() == b"abc"
    err = capfd.readouterr().err
    assert "hunter2" not in err and "s3cr3t" not in err and "AKIAEXAMPLE" not in err
    shown = http.url("v/a.bin").replace("://", "://***@", 1) \
        + "?X-Amz-Credential=***&X-Amz-Signature=***"
    said = _lines(err)
    assert said[:2] == [f"GOPEN {shown} {{}}", f"closed [4 bytes {os.getpid()}] {shown} {{}}"]
    assert said[2] == f"GOPEN pipe:cat {tmp_path}/a.txt # {shown} {{}}"
    assert f"# {shown}'" in said[3]


def _shard(tmp_path: Path) -> bytes:
    return Path(write_tar(tmp_path / "s.tar", [(f"k{i}", {"txt": b"x" * 100}) for i in
                                               range(3)])).read_bytes()


def test_every_store_through_gopen_and_webdataset(store: Store, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    data = _shard(tmp_path)
    store.put("v/s-0.tar", data)
    url = store.url("v/s-0.tar")
    monkeypatch.setenv("GOPEN_VERBOSE", "1")
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    with wds.gopen(url, storage_options=store.storage_options) as f:
        assert f.read() == data
    samples = wds.WebDataset(url, shardshuffle=False, storage_options=store.storage_options)
    assert len(list(samples)) == 3
    pid = os.getpid()
    assert _lines(capfd.readouterr().err) == [
        f"GOPEN {url} {{}}", f"closed [{len(data)} bytes {pid}] {url} {{}}"] * 2


def test_the_cache_says_each_open_hit_or_miss(store_factory: Callable[[str], Store],
                                              tmp_path: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    s3 = store_factory("s3")
    data = _shard(tmp_path)
    s3.put("v/s-0.tar", data)
    url = s3.url("v/s-0.tar")
    settings = Settings.from_env({"GOPEN_VERBOSE": "1", "WDS_CACHE": str(tmp_path / "cache")})
    for _ in range(2):  # a miss (filled while read), then a hit
        with gopen(url, settings=settings, storage_options=s3.storage_options) as f:
            assert f.read() == data
    assert _lines(capfd.readouterr().err) == [
        f"GOPEN {url} {{}}", f"closed [{len(data)} bytes {os.getpid()}] {url} {{}}"] * 2


LOADER = """
    import collections, os, sys
    import importlib
    wds = importlib.import_module(sys.argv[1])
    urls = [f"pipe:cat {sys.argv[2]}/s-{i}.tar" for i in range(4)]
    dataset = wds.WebDataset(urls, shardshuffle=False, nodesplitter=None).to_tuple("txt")
    loader = wds.WebLoader(dataset, num_workers=2, batch_size=None)
    print("samples", sum(1 for _ in loader), "pid", os.getpid())
"""


def test_webloader_workers_say_their_shards(tmp_path: Path, zygote: Zygote) -> None:
    data = _shard(tmp_path)
    for i in range(4):
        (tmp_path / f"s-{i}.tar").write_bytes(data)
    theirs = _run(zygote, LOADER, "webdataset", str(tmp_path), WDS_READAHEAD="2")
    ours = _run(zygote, LOADER, "wds_cloud", str(tmp_path), WDS_READAHEAD="2")
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.split()[:2] == theirs.stdout.split()[:2] == ["samples", "12"]
    parent = int(ours.stdout.split()[-1])
    said = _lines(ours.stderr)
    opened = sorted(line for line in said if line.startswith("GOPEN"))
    assert opened == [f"GOPEN pipe:cat {tmp_path}/s-{i}.tar {{}}" for i in range(4)]
    # webdataset's workers print each line piece by piece, so two of them may interleave
    # ("GOPENGOPEN pipe:cat …"); ours write each line whole. Compare what theirs opened.
    assert theirs.stderr.count("GOPEN") == 4, theirs.stderr
    assert all(f"{tmp_path}/s-{i}.tar" in theirs.stderr for i in range(4)), theirs.stderr
    ends = [re.fullmatch(r"pipe exit \[0 (\d+):\d+\] \(\('cat (.*)',\), \{'shell': True, "
                         r"'bufsize': 8192\}\) \{\}", line) for line in said
            if line.startswith("pipe exit")]
    assert all(ends) and len(ends) == 4, said
    assert sorted(m.group(2) for m in ends if m) == [f"{tmp_path}/s-{i}.tar" for i in range(4)]
    workers = {int(m.group(1)) for m in ends if m}
    assert len(workers) == 2 and parent not in workers  # each worker says its own shards


def test_webdataset_s_file_cache_downloads_through_a_said_stream(
        store_factory: Callable[[str], Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """FileCache tells a download from a hit by the stream's type: the wrapper keeps it."""
    http = store_factory("http")
    data = _shard(tmp_path)
    http.put("v/s-0.tar", data)
    url = http.url("v/s-0.tar")
    monkeypatch.setenv("GOPEN_VERBOSE", "1")
    cache = wds.cache.FileCache(str(tmp_path / "cache"))
    path = cache.get_file(url)
    assert Path(path).read_bytes() == data and path.startswith(str(tmp_path / "cache"))
    assert cache.get_file(url) == path  # a hit
    assert _lines(capfd.readouterr().err) == [
        f"GOPEN {url} {{}}", f"closed [{len(data)} bytes {os.getpid()}] {url} {{}}",
        f"GOPEN {url} {{}}", f"closed [0 bytes {os.getpid()}] {url} {{}}"]
