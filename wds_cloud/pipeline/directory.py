"""``DirectoryShardList``: webdataset 1.0.2's shard queue for online training, where shards keep
arriving in a directory (or, beyond webdataset, under a bucket prefix) while a model trains.

Layer 2: local directories are handled here with :mod:`os`; a URL with a scheme is listed
through its opener's ``glob`` (:mod:`wds_cloud.io.registry`), looked up when the listing is
made, so nothing of a store is imported before it is used.
"""

from __future__ import annotations

import glob as globmod
import logging
import os
import random
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

import braceexpand

from ..errors import ConfigError
from ..urls import split_scheme
from .shards import derive_seed

__all__ = ["DirectoryShardList"]

log = logging.getLogger(__name__)

_MODES = ("resample", "keep", "unlink")
_SELECTS = ("random", "oldest")
#: ``NAME._PID_`` (claimed by process PID) and ``NAME._done_`` (kept after reading)
_CLAIMED = re.compile(r"^(.*)\._(\d+)_$")
_TAGGED = re.compile(r"\._(\d+|done)_$")


class DirectoryShardList:
    """Yield ``dict(url=...)`` for the shards found under ``path`` as they arrive.

    **A local directory** (webdataset's behaviour): a shard matching ``pattern`` (a glob; braces
    are expanded, so the default takes ``.tar``, ``.tgz`` and ``.tar.tgz`` files, which
    webdataset's own ``glob`` call did not) is chosen by ``select`` (``"random"``: from a seeded
    generator; ``"oldest"``: by modification time) and claimed by renaming it ``NAME._PID_``
    with the claiming process's id. The rename is atomic, so of several processes (or
    DataLoader workers) sharing the directory exactly one gets each shard, and no shard is read
    by two at once. Once it has been read (when the iterator moves past it: the next one is
    asked for) it is recycled by ``mode``: ``"unlink"`` deletes it, ``"keep"`` renames it
    ``NAME._done_`` (out of the pool), ``"resample"`` (the default) renames it back into the
    pool. As in webdataset, an iterator closed or dropped while it holds a shard (``islice``,
    ``next(iter(ds))``, a ``break``) leaves that shard claimed: it may not have been read, so
    it is not recycled, and it stays with this process, which may still be reading it. The
    claims of processes no longer running on this machine go back to the pool (looked for
    after each shard, whenever the pool is empty, and by
    :meth:`cleanup_files_without_processes`; webdataset recycled those by ``mode``, which
    could delete or retire a shard nobody finished reading). With an empty pool,
    ``poll=None`` ends the iteration;
    otherwise the directory is looked at again every ``poll`` seconds. The iteration ends
    ``timeout`` seconds after it started (webdataset's measure). ``path`` may also be a
    ``file:`` URL.

    **A bucket prefix** (``s3://bucket/incoming/``, ``gs://``, ``az://``: any scheme whose
    opener can list), beyond webdataset: the listing of ``path + pattern`` is polled and each
    object is yielded once per iteration, newly listed objects in name order (``"oldest"``)
    or in a seeded random order (``"random"``). Object stores have no atomic rename, so
    there is no claiming and no recycling: every process iterating sees every object, and
    ``mode`` may only be ``"keep"`` (the default there: objects stay as they are).
    ``poll=None`` ends when a listing shows nothing new. ``storage_options`` go to the
    store's filesystem (flat, or per scheme as elsewhere: ``{"s3": {...}}``).

    **Reading** (``DataPipeline(DirectoryShardList(...), tarfile_to_samples(...))`` or
    ``WebDataset(DirectoryShardList(...))``): the queue assumes each shard is read before the
    next is asked for, as webdataset reads. Its items say ``"readahead": False``, so the
    read-ahead of wds_cloud's tar reading (``WDS_READAHEAD``) does not ask for the next
    shards early: it would recycle a shard before reading it, and wait for more shards to
    arrive before reading any.

    ``seed``: the seed of the random choice; each iteration draws from
    ``derive_seed(seed, 0, 0, iteration)``. ``None`` (the default) takes fresh entropy: give
    processes sharing a directory different seeds, or none (the same seed makes them reach
    for the same shard; the loser of a claim only tries another).
    """

    def __init__(
        self, path: str, pattern: str = "*.{tar,tgz,tar.tgz}", poll: float | None = 1,
        timeout: float = 1e12, mode: str | None = None, select: str = "random", fate: Any = None,
        *, seed: int | None = None, storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        scheme, rest = split_scheme(path)
        if scheme == "file":
            from urllib.request import url2pathname  # (urllib.request costs ~20 ms to import)

            path = url2pathname(rest[2:] if rest.startswith("//") else rest)
        self.remote = scheme not in ("", "file")
        default_mode = "keep" if self.remote else "resample"
        mode = default_mode if mode is None else mode
        if mode not in _MODES:
            raise ConfigError(f"DirectoryShardList({path!r}): mode must be one of {_MODES}, "
                              f"got {mode!r}")
        if self.remote and mode != "keep":
            raise ConfigError(
                f"DirectoryShardList({path!r}): mode={mode!r} needs renaming shards, which "
                "object stores cannot do atomically; on a bucket each object is yielded once "
                "(mode='keep')")
        if select not in _SELECTS:
            raise ConfigError(f"DirectoryShardList({path!r}): select must be one of {_SELECTS},"
                              f" got {select!r}")
        if fate is not None:
            raise ConfigError("DirectoryShardList: fate= is unused in webdataset 1.0.2 too; "
                              "leave it out")
        if poll is not None and poll < 0:
            raise ConfigError(f"DirectoryShardList({path!r}): poll must be >= 0 or None, "
                              f"got {poll!r}")
        if not self.remote and not os.path.isdir(path):
            raise ConfigError(f"DirectoryShardList: {path!r} is not a directory")
        self.path = path if path.endswith("/") else path + "/"
        self.pattern = pattern
        self.poll = poll
        self.timeout = timeout
        self.mode = mode
        self.select = select
        self.seed = seed
        self.storage_options = dict(storage_options or {})
        self._iterations = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        key = self._iterations
        self._iterations += 1
        base = int.from_bytes(os.urandom(8), "big") if self.seed is None else self.seed
        rng = random.Random(derive_seed(base, 0, 0, key))
        if self.remote:
            return self._objects(rng)
        return self._claims(rng)

    # ---------------------------------------------------------------- local directory

    def _pool(self) -> list[str]:
        root = globmod.escape(self.path)
        found = {name for pat in braceexpand.braceexpand(self.pattern)
                 for name in globmod.glob(root + pat)}
        return sorted(name for name in found if not _TAGGED.search(name))

    def _claims(self, rng: random.Random) -> Iterator[dict[str, Any]]:
        start = time.monotonic()
        while time.monotonic() - start < self.timeout:
            claimed = self._claim(self._pool(), rng)
            if claimed is None:
                if self.release_dead_claims():
                    continue
                if self.poll is None:
                    return
                time.sleep(self.poll)
                continue
            # closed here (GeneratorExit), the claim stays: see the class docstring
            yield {"url": claimed, "readahead": False}
            self.recycle(claimed)
            self.release_dead_claims()

    def _claim(self, candidates: list[str], rng: random.Random) -> str | None:
        """Claim one of ``candidates``; another process may take any of them first."""
        while candidates:
            if self.select == "oldest":
                candidate = min(candidates, key=_mtime)
            else:
                candidate = candidates[rng.randrange(len(candidates))]
            claimed = f"{candidate}._{os.getpid()}_"
            try:
                os.rename(candidate, claimed)
            except FileNotFoundError:  # taken by another process: try the others at once
                candidates.remove(candidate)
                continue
            log.debug("claimed %s", claimed)
            return claimed
        return None

    def recycle(self, activename: str) -> None:
        """Recycle the claimed shard ``activename`` (``NAME._PID_``) by ``mode``, as when the
        iterator moves past it (webdataset's method)."""
        _recycle(activename, self.mode)

    def cleanup_files_without_processes(self) -> int:
        """webdataset's name of :meth:`release_dead_claims` (which puts the shards back into
        the pool, where webdataset recycled them by ``mode``)."""
        return self.release_dead_claims()

    def release_dead_claims(self) -> int:
        """Put the shards claimed by processes no longer running here back into the pool;
        returns how many."""
        released = 0
        for name in globmod.glob(globmod.escape(self.path) + "*._*_"):
            m = _CLAIMED.match(name)
            if m is None or _running(int(m.group(2))):
                continue
            log.info("releasing %s: process %s is gone", name, m.group(2))
            try:
                _recycle(name, "resample")
                released += 1
            except FileNotFoundError:  # another process released it first
                pass
        return released

    # ---------------------------------------------------------------- bucket prefix

    def _objects(self, rng: random.Random) -> Iterator[dict[str, Any]]:
        seen: set[str] = set()
        start = time.monotonic()
        while time.monotonic() - start < self.timeout:
            new = [url for url in self._listing() if url not in seen]
            if not new:
                if self.poll is None:
                    return
                time.sleep(self.poll)
                continue
            if self.select == "random":
                rng.shuffle(new)
            for url in new:
                seen.add(url)
                yield {"url": url, "readahead": False}

    def _listing(self) -> list[str]:
        from ..io.registry import get_opener
        from ..router import scheme_options  # the per-scheme storage_options rule

        opener = get_opener(self.path)
        lister = getattr(opener, "glob", None)
        if lister is None:
            raise ConfigError(f"DirectoryShardList: cannot list {self.path!r}: the opener of "
                              f"its scheme ({opener!r}) has no glob()")
        options = scheme_options(self.storage_options, split_scheme(self.path)[0])
        return sorted({url for pat in braceexpand.braceexpand(self.pattern)
                       for url in lister(self.path + pat, storage_options=options)})

    def __repr__(self) -> str:
        return (f"DirectoryShardList({self.path!r}, pattern={self.pattern!r}, poll={self.poll}, "
                f"mode={self.mode!r}, select={self.select!r})")


def _recycle(claimed: str, mode: str) -> None:
    original = _CLAIMED.match(claimed)
    name = original.group(1) if original else claimed
    if mode == "unlink":
        os.unlink(claimed)
    elif mode == "keep":
        os.rename(claimed, f"{name}._done_")
    else:
        os.rename(claimed, name)


def _mtime(name: str) -> float:
    try:
        return os.stat(name).st_mtime
    except FileNotFoundError:  # claimed meanwhile: the claim will fail and skip it
        return float("-inf")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True
