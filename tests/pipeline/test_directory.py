"""``DirectoryShardList``: webdataset's shard queue on a local directory (claims by renaming,
several processes, dead claims), and beyond webdataset on a bucket prefix of the S3 server."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import webdataset
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError


def _shards(directory: Path, n: int, ext: str = "tar") -> list[str]:
    return [write_tar(directory / f"s{i:03d}.{ext}", [(f"k{i}", {"txt": f"shard {i}".encode()})])
            for i in range(n)]


def _urls(shards: Any) -> list[str]:
    return [d["url"] for d in shards]


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_keep_reads_each_shard_once_then_ends(tmp_path: Path) -> None:
    _shards(tmp_path, 5)
    pid = os.getpid()
    urls = _urls(wds.DirectoryShardList(str(tmp_path), mode="keep", poll=None, seed=1))
    assert sorted(urls) == [f"{tmp_path}/s{i:03d}.tar._{pid}_" for i in range(5)]
    assert _listing(tmp_path) == [f"s{i:03d}.tar._done_" for i in range(5)]


def test_the_same_as_webdatasets_queue(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for d in (ours, theirs):
        d.mkdir()
        _shards(d, 4)
    got = _urls(wds.DirectoryShardList(str(ours), "*.tar", poll=None, mode="keep"))
    want = _urls(webdataset.shardlists.DirectoryShardList(f"{theirs}/", "*.tar", poll=None,
                                                          mode="keep"))
    assert sorted(u.replace(str(ours), "") for u in got) == \
        sorted(u.replace(str(theirs), "") for u in want)
    assert _listing(ours) == _listing(theirs)


@pytest.mark.parametrize("readahead", [0, 16])
def test_unlink_deletes_and_samples_come_through_a_pipeline(tmp_path: Path,
                                                            readahead: int) -> None:
    """Read-ahead (on by default) must not claim the next shard early: it would unlink a
    shard before reading it."""
    _shards(tmp_path, 3)
    pipeline = wds.DataPipeline(wds.DirectoryShardList(str(tmp_path), mode="unlink", poll=None),
                                wds.tarfile_to_samples(settings=wds.Settings(readahead=readahead)))
    assert sorted(s["txt"] for s in pipeline) == [b"shard 0", b"shard 1", b"shard 2"]
    assert _listing(tmp_path) == []


def test_webdataset_reads_a_directory_url_as_a_queue_across_workers(tmp_path: Path) -> None:
    """``WebDataset("dir/", mode=...)`` as in webdataset: DataLoader workers share the queue by
    claiming, so each shard is read once, with no splitter dropping claimed shards, and no
    empty check failing a worker that found the queue empty."""
    import torch

    _shards(tmp_path, 6)
    dataset = wds.WebDataset(f"{tmp_path}/", mode="keep", shardshuffle=False)
    assert isinstance(dataset.pipeline[0], wds.DirectoryShardList)
    dataset.pipeline[0].poll = None
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert sorted(s["txt"] for s in loader) == [f"shard {i}".encode() for i in range(6)]
    assert _listing(tmp_path) == [f"s{i:03d}.tar._done_" for i in range(6)]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_directory_without_a_mode_is_the_shards_in_it(
        tmp_path: Path, where: str, store_factory: Callable[[str], Any]) -> None:
    """``WebDataset("dir/")`` with no ``mode`` reads the shards in the directory (or bucket
    prefix) once, as ``wds-cloud ls dir/`` lists them: DataLoader workers split them, nothing
    is renamed, and the iteration ends (as a queue it never did: webdataset 1.0.2's default
    pattern matched nothing and waited forever)."""
    import torch

    shards = tmp_path / "shards"
    shards.mkdir()
    _shards(shards, 4)
    _shards(shards, 2, ext="tgz.txt")  # not shards: left out
    if where == "local":
        url, options = f"{shards}/", {}
    else:
        store = store_factory("s3")
        for path in sorted(shards.iterdir()):
            store.put(f"train/{path.name}", path.read_bytes())
        url, options = store.url("train/"), store.storage_options
    dataset = wds.WebDataset(url, shardshuffle=False, storage_options=options)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert sorted(s["txt"] for s in loader) == [f"shard {i}".encode() for i in range(4)]
    assert _listing(shards) == sorted([*(f"s{i:03d}.tar" for i in range(4)),
                                       *(f"s{i:03d}.tgz.txt" for i in range(2))])
    with pytest.raises(wds.ShardNotFoundError, match=r"no shards \(\*\.tar, \*\.tgz"):
        wds.WebDataset(f"{tmp_path}/empty-dir/" if where == "local" else url + "none/",
                       storage_options=options)


def test_resample_puts_shards_back_until_the_timeout(tmp_path: Path) -> None:
    _shards(tmp_path, 2)
    start = time.monotonic()
    urls = _urls(wds.DirectoryShardList(str(tmp_path), timeout=0.5, seed=3))
    assert time.monotonic() - start < 5
    assert len(urls) > 4 and set(urls) == {
        f"{tmp_path}/s000.tar._{os.getpid()}_", f"{tmp_path}/s001.tar._{os.getpid()}_"}
    assert _listing(tmp_path) == ["s000.tar", "s001.tar"]


def test_the_default_pattern_expands_its_braces(tmp_path: Path) -> None:
    """webdataset's default ``*.{tar,tgz,tar.tgz}`` went to ``glob`` as it is and matched
    nothing; here it takes the three kinds, and nothing else."""
    _shards(tmp_path, 1, "tar")
    _shards(tmp_path, 1, "tgz")
    (tmp_path / "notes.txt").write_text("not a shard")
    urls = _urls(wds.DirectoryShardList(str(tmp_path) + "/", mode="keep", poll=None))
    assert sorted(Path(u).name for u in urls) == [f"s000.tar._{os.getpid()}_",
                                                  f"s000.tgz._{os.getpid()}_"]


def test_select_oldest_and_a_seeded_random_order(tmp_path: Path) -> None:
    for i, path in enumerate(_shards(tmp_path, 6)):
        os.utime(path, (1000 + (5 - i) * 10, 1000 + (5 - i) * 10))  # s005 is the oldest
    oldest = _urls(wds.DirectoryShardList(str(tmp_path), select="oldest", mode="keep",
                                          poll=None))
    assert [Path(u).name[:4] for u in oldest] == ["s005", "s004", "s003", "s002", "s001", "s000"]
    orders = []
    for _ in range(2):
        for p in tmp_path.iterdir():
            p.rename(str(p).replace("._done_", ""))
        orders.append([Path(u).name[:4] for u in _urls(wds.DirectoryShardList(
            str(tmp_path), mode="keep", poll=None, seed=11))])
    assert orders[0] == orders[1] and sorted(orders[0]) == [f"s{i:03d}" for i in range(6)]
    assert orders[0] != sorted(orders[0])  # drawn, not listed


def test_a_shard_left_half_read_stays_claimed_as_in_webdataset(tmp_path: Path) -> None:
    """An iterator closed while it holds a shard neither recycles it (it may not have been
    read) nor gives it back (this process may still be reading it): the claim stays until
    the iterator moves past it, or until this process is gone (then it goes back)."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for d in (ours, theirs):
        d.mkdir()
        _shards(d, 3)
    pid = os.getpid()
    it = iter(wds.DirectoryShardList(str(ours), mode="unlink", poll=None, select="oldest"))
    first = next(it)["url"]
    assert Path(first).exists() and not Path(first[:-len(f"._{pid}_")]).exists()
    it.close()  # e.g. the training loop stopped
    theirs_it = iter(webdataset.shardlists.DirectoryShardList(
        f"{theirs}/", "*.tar", poll=None, mode="unlink", select="oldest"))
    next(theirs_it)
    theirs_it.close()
    assert _listing(ours) == _listing(theirs)
    assert len([n for n in _listing(ours) if n.endswith(f"._{pid}_")]) == 1
    # dropped at once, as in ``next(iter(ds))``: the same
    again = wds.DirectoryShardList(str(ours), mode="unlink", poll=None)
    assert Path(next(iter(again))["url"]).exists()
    assert len([n for n in _listing(ours) if n.endswith(f"._{pid}_")]) == 2


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_claims_of_dead_processes_are_released(tmp_path: Path) -> None:
    _shards(tmp_path, 2)
    (tmp_path / "s000.tar").rename(tmp_path / f"s000.tar._{_dead_pid()}_")
    alive = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "s001.tar").rename(tmp_path / f"s001.tar._{alive.pid}_")
        urls = _urls(wds.DirectoryShardList(str(tmp_path), mode="keep", poll=None))
    finally:
        alive.kill()
        alive.wait()
    assert [Path(u).name for u in urls] == [f"s000.tar._{os.getpid()}_"]
    assert _listing(tmp_path) == ["s000.tar._done_", f"s001.tar._{alive.pid}_"]


def _reader(path: str, seconds: float, log: Any) -> None:
    """Read shards from the shared queue for ``seconds``; each read marks the shard busy
    with an O_EXCL file, so a second concurrent reader of the same shard is detected."""
    for item in wds.DirectoryShardList(path, timeout=seconds, poll=0.01):
        name = Path(item["url"]).name.rsplit("._", 1)[0]
        busy = os.path.join(path, "busy", name)
        try:
            fd = os.open(busy, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            log.put(("twice", name))
            continue
        time.sleep(0.005)
        os.close(fd)
        os.unlink(busy)
        log.put(("read", name))
    log.put(("done", os.getpid()))


def test_several_processes_never_read_a_shard_twice_at_once(tmp_path: Path) -> None:
    _shards(tmp_path, 6)
    (tmp_path / "busy").mkdir()
    ctx = multiprocessing.get_context("fork")
    log: Any = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(str(tmp_path), 1.5, log)) for _ in range(4)]
    for p in procs:
        p.start()
    events: list[tuple[str, Any]] = []
    while sum(1 for kind, _ in events if kind == "done") < len(procs):
        events.append(log.get(timeout=30))
    for p in procs:
        p.join(10)
    reads = [name for kind, name in events if kind == "read"]
    assert [e for e in events if e[0] == "twice"] == []
    assert len(reads) > 30 and set(reads) == {f"s{i:03d}.tar" for i in range(6)}
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == [f"s{i:03d}.tar" for i in range(6)]


def test_it_pickles_and_checks_its_arguments(tmp_path: Path) -> None:
    _shards(tmp_path, 2)
    copy = pickle.loads(pickle.dumps(wds.DirectoryShardList(str(tmp_path), mode="keep",
                                                            poll=None)))
    assert len(_urls(copy)) == 2
    with pytest.raises(ConfigError, match="not a directory"):
        wds.DirectoryShardList(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="mode must be one of"):
        wds.DirectoryShardList(str(tmp_path), mode="delete")
    with pytest.raises(ConfigError, match="select must be one of"):
        wds.DirectoryShardList(str(tmp_path), select="newest")


# ---------------------------------------------------------------- a bucket prefix


def test_objects_arriving_in_a_bucket_are_yielded_once(
    store_factory: Callable[[str], Any],
) -> None:
    store = store_factory("s3")
    store.put("incoming/a.tar", b"a")
    store.put("incoming/b.tar", b"b")
    store.put("elsewhere/c.tar", b"c")
    queue = wds.DirectoryShardList(store.url("incoming/"), "*.tar", poll=0.05, timeout=3,
                                   storage_options=store.storage_options, seed=5)
    it = iter(queue)
    first = sorted(_urls([next(it), next(it)]))
    assert first == [store.url("incoming/a.tar"), store.url("incoming/b.tar")]
    store.put("incoming/d.tar", b"d")
    store.put("incoming/e.txt", b"not a shard")
    rest = _urls(it)  # ends when the timeout has passed
    assert rest == [store.url("incoming/d.tar")]
    with wds.gopen(rest[0], storage_options=store.storage_options) as stream:
        assert stream.read() == b"d"
    with pytest.raises(ConfigError, match="object stores cannot"):
        wds.DirectoryShardList(store.url("incoming/"), mode="resample")
    ended = wds.DirectoryShardList(store.url("incoming/"), "*.tar", poll=None,
                                   storage_options=store.storage_options)
    assert len(_urls(ended)) == 3
