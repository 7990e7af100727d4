"""Helpers for the shard-cache tests: shards with known samples, a look into a cache
directory, a disk-use sampler, waiting on conditions, and nginx's settled request count."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from stores.nginx import AccessLogEntry, NginxServer
from stores.procs import http_request

from wds_cloud.cache import wait_downloads

__all__ = ["DiskSampler", "cache_files", "make_shard", "sample_digest", "settled_log",
           "shard_gets", "wait_for"]

CACHE_PARTS = ("data", "meta", "partial")


def make_shard(prefix: str, count: int, size: int) -> tuple[bytes, list[str]]:
    """A tar shard of ``count`` samples (``bin`` of ``size`` pseudo-random bytes and ``txt``
    holding the key); returns its bytes and the keys in order."""
    buf = io.BytesIO()
    keys = [f"{prefix}-{i:04d}" for i in range(count)]
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key in keys:
            for ext, data in (("bin", _payload(key, size)), ("txt", key.encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), keys


def _payload(key: str, size: int) -> bytes:
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def sample_digest(sample: dict[str, Any]) -> tuple[str, bool]:
    """``(key, whether its bin member is the one make_shard wrote)``."""
    key = sample["__key__"]
    return key, sample["bin"] == _payload(key, len(sample["bin"]))


def cache_files(root: Path, sub: str = "data") -> list[str]:
    """The file names in ``root/sub`` (sorted; none if it does not exist)."""
    try:
        return sorted(os.listdir(root / sub))
    except FileNotFoundError:
        return []


def settled(root: Path) -> list[str]:
    """The entries of the cache at ``root`` once no download is left in ``partial/`` and this
    process's fill threads have ended: a reader may see a shard's last byte before its fill
    thread publishes it, logs it and lets go of its lock."""
    def done() -> bool:
        return wait_downloads(0.1) and cache_files(root, "partial") == []

    wait_for(done, f"the downloads in {root} to end")
    return cache_files(root)


def wait_for(condition: Callable[[], Any], what: str, *, timeout: float = 30.0) -> Any:
    """Poll ``condition`` until it is true (generous timeout for a loaded machine)."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def settled_log(server: NginxServer) -> list[AccessLogEntry]:
    """nginx's access log once every request that ended before this call is in it: a marker
    request is sent and waited for (nginx logs a request when it ends, in order)."""
    marker = f"/__settle__/{uuid.uuid4().hex}"
    http_request("GET", server.url_for(marker))
    return list(wait_for(lambda: (log := server.access_log()) and any(
        e.uri == marker for e in log) and log, f"nginx to log {marker}"))


def shard_gets(log: Iterable[AccessLogEntry], path: str) -> int:
    """How many GETs of ``path`` (``/dir/key``, any query string) the log shows."""
    return sum(1 for e in log if e.method == "GET" and e.uri.split("?", 1)[0] == path)


class DiskSampler:
    """A thread measuring, every ``interval`` seconds, the bytes of every file in a cache's
    ``data``, ``meta`` and ``partial`` directories; ``peak`` is the largest total seen, and
    ``peak_files`` what made it up.

    Each measurement holds the cache's admission lock (``locks/cache.lock``, under which
    entries are evicted and downloads reserved): listing ``data/`` then ``partial/`` could
    otherwise count an entry evicted in between together with the download that took its
    room. Files only leave ``partial/`` for ``data/`` outside that lock, so a measurement may
    miss a file being published but never counts one twice."""

    def __init__(self, root: Path, *, interval: float = 0.002) -> None:
        self.root, self.interval = root, interval
        self.peak = 0
        self.peak_files: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-sampler", daemon=True)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def total(self) -> int:
        return sum(self.measure().values())

    def measure(self) -> dict[str, int]:
        """``{sub/name: bytes}`` of the cache's files, measured under its admission lock."""
        try:
            fd = os.open(self.root / "locks" / "cache.lock", os.O_RDONLY | os.O_CREAT, 0o666)
        except FileNotFoundError:  # no cache directory yet
            return self._files()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._files()
        finally:
            os.close(fd)

    def _files(self) -> dict[str, int]:
        files = {}
        for sub in CACHE_PARTS:
            try:
                with os.scandir(self.root / sub) as it:
                    for entry in it:
                        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                            files[f"{sub}/{entry.name}"] = entry.stat().st_size
            except FileNotFoundError:  # not made yet
                pass
        return files

    def _run(self) -> None:
        while not self._stop.is_set():
            files = self.measure()
            total = sum(files.values())
            if total > self.peak:
                self.peak, self.peak_files = total, files
            self.samples += 1
            self._stop.wait(self.interval)
