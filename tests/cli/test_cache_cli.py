"""`wds-cloud cache ls | du | verify | prune | clear` on a cache filled from nginx."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from shardgen import write_tar
from stores.nginx import HttpStore, NginxServer
from stores.proxy import FaultProxy

import wds_cloud as wds
from wds_cloud.cache import wait_downloads
from wds_cloud.cache.layout import footprint
from wds_cloud.cli import main
from wds_cloud.settings import human_size

SHARDS = 5
PER_SHARD = 8
WAIT = 60.0  # seconds: generous, for a loaded machine


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def fills_done() -> None:
    """Wait until this process's downloads have published (readers may finish first)."""
    wait_for(lambda: wait_downloads(0.1), "the cache's downloads")


@dataclass
class Filled:
    """A cache directory filled by reading every shard of an nginx store once."""

    server: NginxServer
    store: HttpStore
    urls: list[str]
    cache: Path
    samples: dict[str, bytes]

    def data(self) -> list[Path]:
        return sorted((self.cache / "data").iterdir())

    def name_of(self, k: int) -> str:
        """The entry name of shard ``k``: basename with 16 hex of the URL's SHA-256."""
        return f"shard-{k}.{hashlib.sha256(self.urls[k].encode()).hexdigest()[:16]}.tar"

    def gets(self) -> list[str]:
        """Basenames of the store's shards that nginx served (GET) since the log was cleared."""
        prefix = f"/{self.store.directory}/"
        return sorted(e.uri.rsplit("/", 1)[1] for e in self.server.access_log()
                      if e.method == "GET" and e.uri.startswith(prefix))

    def read_all(self) -> dict[str, bytes]:
        """Every sample, read through the cache."""
        dataset = wds.WebDataset(self.urls, cache_dir=str(self.cache), shardshuffle=False)
        got = {s["__key__"]: s["bin"] for s in dataset}
        fills_done()
        return got

    def age(self, order: list[int]) -> None:
        """Make the entries' last use follow ``order`` (oldest first), well in the past."""
        now = time.time()
        for rank, k in enumerate(order):
            t = now - 1000 + 10 * rank
            os.utime(self.cache / "data" / self.name_of(k), (t, t))

    def on_disk(self) -> int:
        """Bytes the data files are charged against a cache size (footprint)."""
        return sum(footprint(p.stat().st_size) for p in self.data())


@pytest.fixture
def filled(nginx_server: NginxServer, tmp_path: Path) -> Filled:
    store = nginx_server.new_store()
    samples: dict[str, bytes] = {}
    for k in range(SHARDS):
        members = [(f"s{k}-{i}", {"bin": os.urandom(3000 + 1000 * k + i)})
                   for i in range(PER_SHARD)]
        samples.update({key: m["bin"] for key, m in members})
        store.put(f"shard-{k}.tar", Path(write_tar(tmp_path / f"{k}.tar", members)).read_bytes())
    urls = [store.url(f"shard-{k}.tar") for k in range(SHARDS)]
    f = Filled(nginx_server, store, urls, tmp_path / "cache", samples)
    assert f.read_all() == samples
    assert [p.name for p in f.data()] == [f.name_of(k) for k in range(SHARDS)]
    nginx_server.clear_access_log()
    return f


def cache_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["cache", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_lists_every_entry_least_recently_used_first(
    filled: Filled, capsys: pytest.CaptureFixture[str],
) -> None:
    filled.age([3, 1, 4, 0, 2])
    with wds.gopen(filled.urls[1], cache_dir=str(filled.cache)) as stream:  # a hit: used now
        stream.read()
    assert filled.gets() == []
    code, out, _ = cache_cli(capsys, "ls", "--dir", str(filled.cache))
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[-2].rsplit("/", 1)[1] for line in lines] == [
        f"shard-{k}.tar" for k in (3, 4, 0, 2, 1)]
    for line in lines:
        number, unit, day, clock, url, name = line.split()
        k = int(name.split("-")[1].split(".")[0])
        assert url == filled.urls[k] and name == filled.name_of(k)
        assert f"{number} {unit}" == human_size((filled.cache / "data" / name).stat().st_size)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", day) and re.fullmatch(r"\d\d:\d\d:\d\d", clock)


def test_du_takes_wds_cache_and_reports_entries_total_and_limit(
    filled: Filled, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    total = sum(p.stat().st_size for p in filled.data())
    monkeypatch.setenv("WDS_CACHE", str(filled.cache))
    code, out, _ = cache_cli(capsys, "du")
    assert code == 0
    assert f"entries: {SHARDS}, {human_size(total)} ({total} bytes; " in out
    assert "downloads in progress: 0" in out
    assert "limit: none" in out
    monkeypatch.setenv("WDS_CACHE_SIZE", "10MiB")
    code, out, _ = cache_cli(capsys, "du")
    assert code == 0 and "limit: 10.0 MiB (WDS_CACHE_SIZE)" in out


def test_du_shows_the_bound_a_job_gave_in_code(
    filled: Filled, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's ``cache_size=`` is noted in the directory, so ``du`` and ``prune`` run without
    WDS_CACHE_SIZE know it; WDS_CACHE_SIZE, when set, wins."""
    dataset = wds.WebDataset(filled.urls[:1], cache_dir=str(filled.cache), cache_size="300MB",
                             shardshuffle=False)
    assert sum(1 for _ in dataset) > 0
    code, out, _ = cache_cli(capsys, "du", "--dir", str(filled.cache))
    assert code == 0 and (f"limit: {human_size(300 * 10**6)} (noted by the last job that used "
                          "the cache with a bound)") in out, out
    monkeypatch.setenv("WDS_CACHE_SIZE", "10MiB")
    code, out, _ = cache_cli(capsys, "du", "--dir", str(filled.cache))
    assert code == 0 and "limit: 10.0 MiB (WDS_CACHE_SIZE)" in out


def test_wds_cloud_cache_du_as_a_command(filled: Filled, tmp_path: Path) -> None:
    """The installed ``wds-cloud`` script; ``~`` in WDS_CACHE is expanded."""
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(filled.cache, home / "shards")
    env = {**os.environ, "HOME": str(home), "WDS_CACHE": "~/shards", "WDS_CACHE_SIZE": "1e9"}
    script = Path(sys.executable).with_name("wds-cloud")
    out = subprocess.run([str(script), "cache", "du"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert f"cache: {home / 'shards'}\nentries: {SHARDS}, " in out.stdout
    assert f"limit: {human_size(10**9)} (WDS_CACHE_SIZE)" in out.stdout
    assert out.stderr == ""


def test_verify_catches_corrupted_entries_and_they_are_fetched_again(
    filled: Filled, capsys: pytest.CaptureFixture[str],
) -> None:
    flipped, cut = filled.name_of(1), filled.name_of(3)
    path = filled.cache / "data" / flipped
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # same size: only the CRC-32 can tell
    path.write_bytes(bytes(blob))
    with open(filled.cache / "data" / cut, "r+b") as f:
        f.truncate(1000)
    code, out, _ = cache_cli(capsys, "verify", "--dir", str(filled.cache))
    assert code == 1
    assert re.search(rf"problem: {re.escape(flipped)} \({re.escape(filled.urls[1])}\): "
                     r"CRC-32 .*; removed", out)
    assert re.search(rf"problem: {re.escape(cut)} \(.*\): 1000 bytes on disk, .*; removed", out)
    assert f"checked {SHARDS} entries: 2 problems" in out
    for name in (flipped, cut):
        assert not (filled.cache / "data" / name).exists()
        assert not (filled.cache / "meta" / f"{name}.json").exists()
    assert len(filled.data()) == SHARDS - 2
    code, out, _ = cache_cli(capsys, "verify", "--dir", str(filled.cache))
    assert (code, out) == (0, f"checked {SHARDS - 2} entries: 0 problems\n")
    assert filled.read_all() == filled.samples
    assert filled.gets() == ["shard-1.tar", "shard-3.tar"]


def test_prune_leaves_at_most_size_keeping_the_most_recently_used(
    filled: Filled, capsys: pytest.CaptureFixture[str],
) -> None:
    filled.age([2, 0, 4, 1, 3])
    for roomy in ("1e9", "50GB"):
        code, out, _ = cache_cli(capsys, "prune", "--dir", str(filled.cache), "--to", roomy)
        assert code == 0 and out.startswith(f"evicted 0 entries; now {SHARDS} entries")
    keep = footprint((filled.cache / "data" / filled.name_of(1)).stat().st_size) + \
        footprint((filled.cache / "data" / filled.name_of(3)).stat().st_size)
    limit_kib = -(-keep // 1024)  # whole KiB, as a user would write it
    code, out, _ = cache_cli(capsys, "prune", "--dir", str(filled.cache),
                             "--to", f"{limit_kib}KiB")
    assert code == 0
    evicted = [line.split()[-1] for line in out.splitlines() if line.startswith("evicted ")
               and "entries;" not in line]
    assert evicted == [filled.name_of(k) for k in (2, 0, 4)]  # least recently used first
    assert f"evicted 3 entries; now 2 entries, {human_size(keep)} " \
           f"(target {human_size(limit_kib * 1024)})" in out
    assert filled.on_disk() <= limit_kib * 1024
    assert [p.name for p in filled.data()] == sorted(filled.name_of(k) for k in (1, 3))
    assert sorted(p.name for p in (filled.cache / "meta").iterdir()) == sorted(
        f"{filled.name_of(k)}.json" for k in (1, 3))
    assert filled.read_all() == filled.samples  # what was evicted is fetched again
    assert filled.gets() == ["shard-0.tar", "shard-2.tar", "shard-4.tar"]


def test_prune_and_clear_keep_an_entry_being_read(
    filled: Filled, capsys: pytest.CaptureFixture[str],
) -> None:
    held = filled.name_of(2)
    with wds.gopen(filled.urls[2], cache_dir=str(filled.cache)) as stream:
        code, out, _ = cache_cli(capsys, "prune", "--dir", str(filled.cache), "--to", "0")
        assert code == 0 and f"evicted {SHARDS - 1} entries; now 1 entry" in out
        assert "still above the target" in out
        code, out, _ = cache_cli(capsys, "clear", "--dir", str(filled.cache))
        assert code == 0 and out.startswith("removed 0 entries; kept 1 in use;")
        assert [p.name for p in filled.data()] == [held]
        assert len(stream.read()) == (filled.cache / "data" / held).stat().st_size
    code, out, _ = cache_cli(capsys, "clear", "--dir", str(filled.cache))
    assert code == 0 and out.startswith("removed 1 entry; kept 0 in use;")
    assert filled.data() == [] and list((filled.cache / "meta").iterdir()) == []
    assert list((filled.cache / "partial").iterdir()) == []
    assert filled.read_all() == filled.samples
    assert filled.gets() == sorted(f"shard-{k}.tar" for k in range(SHARDS))


_DOWNLOADER = """
import sys
import wds_cloud as wds
stream = wds.gopen(sys.argv[1], cache_dir=sys.argv[2])
print("open", flush=True)
stream.read()
"""


def test_a_download_in_progress_then_left_by_a_killed_process(
    filled: Filled, capsys: pytest.CaptureFixture[str],
    fault_proxy: Callable[..., FaultProxy],
) -> None:
    """du counts a live download; once its process is SIGKILLed, clear removes what it left."""
    proxy = fault_proxy(filled.store, stall=300.0)  # every response pauses once mid-body
    filled.store.put("big.tar", os.urandom(2 * 2**20))
    url = filled.store.proxied(proxy).url("big.tar")
    partial = filled.cache / "partial"
    child = subprocess.Popen([sys.executable, "-c", _DOWNLOADER, url, str(filled.cache)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(WAIT, child.kill)  # a child that never opens cannot hang the test
    guard.start()
    try:
        assert child.stdout is not None and child.stdout.readline() == "open\n", \
            child.communicate(timeout=WAIT)
        code, out, _ = cache_cli(capsys, "du", "--dir", str(filled.cache))
        assert code == 0 and f"downloads in progress: 1, {human_size(2 * 2**20)}" in out
        assert f"entries: {SHARDS}, " in out
        code, out, _ = cache_cli(capsys, "clear", "--dir", str(filled.cache))
        assert code == 0
        assert out.startswith(f"removed {SHARDS} entries; kept 0 in use;")
        assert out.rstrip().endswith("1 download still in progress")  # alive: left alone
        assert any(p.name.startswith("big.") for p in partial.iterdir())
    finally:
        guard.cancel()
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=WAIT)
    code, out, _ = cache_cli(capsys, "clear", "--dir", str(filled.cache))
    assert code == 0 and out.rstrip().endswith("0 downloads still in progress")
    stale = re.search(r"removed (\d+) downloads? left by dead processes", out)
    assert stale and int(stale.group(1)) == 1, out
    assert list(partial.iterdir()) == [] and filled.data() == []
    code, out, _ = cache_cli(capsys, "du", "--dir", str(filled.cache))
    assert "entries: 0, 0 B" in out and "downloads in progress: 0, 0 B" in out
    proxy.configure(stall=0.0)
    with wds.gopen(url, cache_dir=str(filled.cache)) as stream:
        assert stream.read() == filled.store.get("big.tar")
    fills_done()
    assert [p.name.split(".")[0] for p in filled.data()] == ["big"]


@pytest.mark.parametrize("command", [["ls"], ["du"], ["verify"], ["prune", "--to", "1MiB"],
                                     ["clear"]])
def test_no_usable_directory_exits_2_naming_it(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = cache_cli(capsys, *command)
    assert code == 2 and out == ""
    assert "--dir" in err and "WDS_CACHE" in err
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("WDS_CACHE", str(missing))
    code, out, err = cache_cli(capsys, *command)
    assert code == 2 and str(missing) in err and "Traceback" not in err
    code, out, err = cache_cli(capsys, *command, "--dir", str(tmp_path))
    assert code == 2 and f"{tmp_path} is not a wds_cloud shard cache" in err
    assert list(tmp_path.iterdir()) == []  # nothing was created there


def test_a_size_that_does_not_parse_is_a_usage_error(
    filled: Filled, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["cache", "prune", "--dir", str(filled.cache), "--to", "lots"])
    assert exc.value.code == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    assert len(filled.data()) == SHARDS


def test_every_cache_command_speaks_json(filled: Filled,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--json``: one document each, with the numbers the text shows."""
    import json

    where = ("--dir", str(filled.cache), "--json")
    total = sum(p.stat().st_size for p in filled.data())
    code, out, _ = cache_cli(capsys, "ls", *where)
    listed = json.loads(out)
    assert code == 0 and sorted(e["url"] for e in listed["entries"]) == sorted(filled.urls)
    assert sum(e["size"] for e in listed["entries"]) == total
    code, out, _ = cache_cli(capsys, "du", *where)
    use = json.loads(out)
    assert code == 0 and (use["entries"], use["bytes"], use["limit"]) == (SHARDS, total, None)
    (filled.cache / "data" / filled.name_of(0)).write_bytes(b"not the shard")
    code, out, _ = cache_cli(capsys, "verify", *where)
    checked = json.loads(out)
    assert code == 1 and checked["checked"] == SHARDS
    assert [(p["url"], p["removed"]) for p in checked["problems"]] == [(filled.urls[0], True)]
    code, out, _ = cache_cli(capsys, "prune", "--to", "0", *where)
    pruned = json.loads(out)
    assert code == 0 and len(pruned["evicted"]) == SHARDS - 1 and pruned["entries"] == 0
    code, out, _ = cache_cli(capsys, "clear", *where)
    assert code == 0 and json.loads(out)["removed"] == 0
