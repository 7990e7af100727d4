"""The files of a shard cache directory: names, records and locks (see :mod:`wds_cloud.cache`).

::

    <root>/CACHEDIR.TAG            marks the directory as a cache for backup tools
    <root>/bound.json              the bound (``max_bytes``) the last process with one used,
                                   for ``wds-cloud cache du``/``prune`` run without a size
    <root>/data/<name>             published shards, complete and validated
    <root>/meta/<name>.json        their validation records (url, size, version, crc32)
    <root>/partial/<name>          shards being downloaded
    <root>/partial/<name>.json     the record of each download in progress (its reservation)
    <root>/locks/<name>.lock       held (flock) while an entry is filled, replaced or evicted
    <root>/locks/cache.lock        held while room is made and reserved
    <root>/warned/<kind>[-<name>]  the run that last gave that warning (see CacheLog.warn)

An entry is keyed by its URL as resolved by :func:`entry_url`: remote URLs as they are, local
paths and ``file:`` URLs by the absolute, resolved path of the file (so ``shards/a.tar`` read
from two working directories is two entries, and ``file:shards/a.tar`` is the same one).
``<name>`` is that URL's basename made safe (``[A-Za-z0-9._-]``) with 16 hex digits of the
SHA-256 of the whole URL put before its extension: ``shard-000003.5d41402abc4b2a76.tar``. It
contains no ``/`` and is never ``.`` or ``..``, so no URL can name a file outside the directory.

Locks are ``flock`` locks: the kernel drops them when their process dies, so a killed process
never leaves a lock held. A lock file may be removed only by the holder of its lock; whoever
locks one checks afterwards that the path still names the file it locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import importlib
import json
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from ..errors import CacheError
from ..urls import file_url_path

__all__ = ["DISK_BLOCK", "CacheLayout", "Record", "check_record", "crc32", "entry_url",
           "footprint", "local_file", "url_key"]

FORMAT = 1
DISK_BLOCK = 4096
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
        "# This directory is a wds_cloud shard cache; see `wds-cloud cache --help`.\n")


@functools.cache
def crc32() -> Callable[[Any, int], int]:
    """The records' checksum, ``crc32(data, value) -> value``: zlib's CRC-32, computed by
    zlib-ng when it is installed (the same values, ten times as fast: every byte a fill
    writes goes through it, in the reading thread), else by zlib."""
    try:
        zlib_ng = importlib.import_module("zlib_ng.zlib_ng")  # optional, so untyped here
    except ImportError:
        return zlib.crc32
    return cast(Callable[[Any, int], int], zlib_ng.crc32)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")  # as wds_cloud.urls.split_scheme


def local_file(url: str) -> str | None:
    """The file a local path or ``file:`` URL names (read as the local opener reads it),
    absolute and resolved (symlinks, ``..``); ``None`` for other URLs."""
    m = _SCHEME.match(url)
    if m is None:
        path = url
    elif m.group(1).lower() == "file":
        rest = url[m.end():]
        path = file_url_path(rest)
    else:
        return None
    return os.path.realpath(path)


def entry_url(url: str) -> str:
    """What an entry of ``url`` is keyed and named by: the resolved path of a local file (the
    path as written depends on the working directory), any other URL as it is."""
    return local_file(url) or url


def url_key(url: str) -> str:
    """The SHA-256 (hex) of the whole URL: scheme, bucket, path and query."""
    return hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()


def check_record(record: Record | None, size: int, key: str) -> str:
    """What is wrong with an entry of ``size`` bytes whose record is ``record``, given its
    ``key`` (the whole SHA-256, or the 16 hex digits in its name); ``""`` if nothing."""
    if record is None:
        return "no readable record"
    if not record.key.startswith(key):
        return "its record belongs to another URL"
    if record.size != size:
        return f"{size} bytes on disk, {record.size} recorded"
    return ""


def footprint(size: int) -> int:
    """Bytes an entry of ``size`` bytes is charged: its data in whole blocks plus one block for
    its record."""
    return -(-size // DISK_BLOCK) * DISK_BLOCK + DISK_BLOCK


def _readable(text: str) -> tuple[str, str]:
    safe = _UNSAFE.sub("_", text).lstrip(".") or "shard"
    stem, dot, ext = safe.partition(".")
    return (stem or "shard")[:80], (dot + ext)[-24:] if ext else ""


@dataclass(frozen=True)
class Record:
    """What an entry (or a download in progress) is: the URL (redacted), its key, size in
    bytes, the store's version (ETag, generation) and, once complete, the CRC-32 of the bytes."""

    url: str
    key: str
    size: int
    version: str | None
    crc32: int | None = None
    pid: int | None = None

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "url": self.url, "key": self.key, "size": self.size,
                           "version": self.version, "crc32": self.crc32, "pid": self.pid})

    @classmethod
    def from_json(cls, text: str) -> Record | None:
        """The record in ``text``, or ``None`` if it is not one this version wrote."""
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                return None
            return cls(url=str(raw["url"]), key=str(raw["key"]), size=int(raw["size"]),
                       version=raw["version"], crc32=raw.get("crc32"), pid=raw.get("pid"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class CacheLayout:
    """Paths and file operations of one cache directory ``root`` (absolute)."""

    root: str

    def name_for(self, url: str, url_to_name: Callable[[str], str] | None = None) -> str:
        """The entry name of ``url``: readable basename plus a hash of the whole URL."""
        if url_to_name is not None:
            readable = str(url_to_name(url))
        else:
            path = urlsplit(url).path if "://" in url else url
            readable = path.rstrip("/").rsplit("/", 1)[-1]
        stem, ext = _readable(readable)
        return f"{stem}.{url_key(url)[:16]}{ext}"

    @staticmethod
    def key_of(name: str) -> str:
        """The 16 hex digits of the URL's hash in the entry name ``name``."""
        return name.split(".")[1] if name.count(".") else ""

    def data(self, name: str) -> str:
        return os.path.join(self.root, "data", name)

    def meta(self, name: str) -> str:
        return os.path.join(self.root, "meta", name + ".json")

    def part(self, name: str) -> str:
        return os.path.join(self.root, "partial", name)

    def part_record(self, name: str) -> str:
        return os.path.join(self.root, "partial", name + ".json")

    def lock_path(self, name: str) -> str:
        return os.path.join(self.root, "locks", name + ".lock")

    def ensure(self) -> None:
        """Create the directory and its subdirectories; again if they were removed since (a
        user deleting the cache between two runs in one notebook), else only ``stat`` calls."""
        if self.root in _READY and all(os.path.isdir(os.path.join(self.root, sub))
                                       for sub in _SUBDIRS):
            return
        _NOTED.pop(self.root, None)  # a new directory has no bound.json yet
        try:
            for sub in _SUBDIRS:
                os.makedirs(os.path.join(self.root, sub), exist_ok=True)
            tag = os.path.join(self.root, "CACHEDIR.TAG")
            if not os.path.exists(tag):
                write_atomic(tag, _TAG)
        except OSError as exc:
            raise CacheError(f"cannot use {self.root!r} as the shard cache directory: {exc}; "
                             "set WDS_CACHE or cache_dir= to a writable directory") from exc
        _READY.add(self.root)

    def record_bound(self, max_bytes: int | None) -> None:
        """Note ``max_bytes`` in the directory (if set and not noted already) for the admin
        commands, which run without the job's ``cache_size``; best effort."""
        if max_bytes is None or _NOTED.get(self.root) == max_bytes:
            return
        _NOTED[self.root] = max_bytes  # once per process and bound, not on every open
        if self.recorded_bound() != max_bytes:
            with contextlib.suppress(OSError):  # read-only: the cache works, du shows no bound
                write_atomic(os.path.join(self.root, "bound.json"),
                             json.dumps({"max_bytes": max_bytes}))

    def recorded_bound(self) -> int | None:
        """The bound the last process that had one noted (:meth:`record_bound`), or None."""
        try:
            with open(os.path.join(self.root, "bound.json"), encoding="utf-8") as f:
                value = json.load(f).get("max_bytes")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def names(self, sub: str = "data") -> Iterator[os.DirEntry[str]]:
        """The files of ``data`` (or another subdirectory), skipping temporary files."""
        try:
            with os.scandir(os.path.join(self.root, sub)) as it:
                yield from (e for e in it if not e.name.endswith(".tmp"))
        except FileNotFoundError:
            return

    def read_record(self, path: str) -> Record | None:
        try:
            with open(path, encoding="utf-8") as f:
                return Record.from_json(f.read())
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def try_lock(self, name: str) -> int | None:
        """The entry lock of ``name`` if nobody holds it (a descriptor to :meth:`unlock`);
        :class:`CacheError` naming the lock file if it cannot be made (not the shard's fault)."""
        path = self.lock_path(name)
        try:
            return try_flock(path)
        except OSError as exc:
            raise CacheError(f"cannot lock {path!r} in the shard cache: {exc}") from exc

    def lock_free(self, name: str) -> bool:
        """Whether nobody holds the entry lock of ``name`` (probed, not kept)."""
        fd = self.try_lock(name)
        if fd is None:
            return False
        self.unlock(fd, name)
        return True

    def unlock(self, fd: int, name: str, *, remove: bool = False) -> None:
        if remove:
            unlink(self.lock_path(name))
        _held.discard(fd)
        os.close(fd)

    @contextmanager
    def admission(self) -> Iterator[None]:
        """Hold the directory-wide lock under which room is made and reserved."""
        fd = os.open(os.path.join(self.root, "locks", "cache.lock"), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def drop_partial(self, name: str) -> None:
        """Remove a download's file, then its record (so a part never lacks its record)."""
        unlink(self.part(name))
        unlink(self.part_record(name))


_SUBDIRS = ("data", "meta", "partial", "locks")
_READY: set[str] = set()
#: root -> the bound this process last noted in its bound.json
_NOTED: dict[str, int] = {}


def try_flock(path: str, op: int = fcntl.LOCK_EX) -> int | None:
    """Lock ``path`` without waiting; ``None`` if someone else holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            _hold(fd)
            return fd
        os.close(fd)  # the file was removed and maybe re-created meanwhile: lock the new one


_held: set[int] = set()  # entry locks this process holds
_fork_hook: list[bool] = []


def _hold(fd: int) -> None:
    """Note a held entry lock. A forked child (a DataLoader worker) shares the lock with its
    parent through the inherited descriptor, and would keep the entry locked until it exits:
    the child closes its copies right after the fork, which leaves the parent's lock alone."""
    if not _fork_hook:
        _fork_hook.append(True)
        os.register_at_fork(after_in_child=_drop_inherited_locks)
    _held.add(fd)


def _drop_inherited_locks() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = f"{path}.{os.getpid()}-{threading.get_ident():x}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


_NO_ROOM = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG))


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate64`` (Linux), or None where there is none."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.fallocate64
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    call.restype = ctypes.c_int

    def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
        return 0 if call(fd, mode, offset, length) == 0 else ctypes.get_errno()

    return fallocate


def preallocate(fd: int, size: int) -> None:
    """Allocate the blocks of a file about to be written with ``size`` bytes, leaving its size
    as it is (``FALLOC_FL_KEEP_SIZE``: followers read up to the size): one allocation rather
    than one per page written (a third of the CPU of writing, on ext4), and a full disk is
    found before the download rather than in its middle. Raises ``OSError`` when there is no
    room; does nothing where the system or filesystem cannot (the writes then allocate)."""
    fallocate = _fallocate()
    if fallocate is None or size <= 0:
        return
    err = fallocate(fd, 1, 0, size)  # 1: FALLOC_FL_KEEP_SIZE
    if err in _NO_ROOM:
        raise OSError(err, f"cannot allocate {size} bytes: {os.strerror(err)}")


def stream_facts(stream: Any) -> tuple[int | None, str | None]:
    """The size and version of an opened shard: a remote stream's own, or a local file's
    size and modification time."""
    size, version = getattr(stream, "size", None), getattr(stream, "version", None)
    if size is not None:
        return int(size), version
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None, None
    if not stat.S_ISREG(st.st_mode):  # a pipe, a socket: no size to reserve
        return None, None
    return st.st_size, f"mtime:{st.st_mtime_ns}"
