"""webdataset's helpers for the names of shard files that a process claims by renaming them
(``name._PID_``, as :class:`~wds_cloud.pipeline.directory.DirectoryShardList` does), and its
plain ``shardlist`` generator, with webdataset 1.0.2's names and behaviour. No I/O but a
signal 0.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterable, Iterator

import braceexpand

__all__ = ["check_pid_is_running", "get_pid_from_filename", "shardlist", "without_last_extension"]


def shardlist(urls: str | Iterable[str], *, shuffle: bool = False) -> Iterator[dict[str, str]]:
    """``dict(url=...)`` for each URL of ``urls`` (a brace pattern or an iterable), once, in a
    random order with ``shuffle``, from the global ``random`` (webdataset's
    ``tariterators.shardlist``, the same draws)."""
    items = list(braceexpand.braceexpand(urls) if isinstance(urls, str) else urls)
    if shuffle:
        random.shuffle(items)
    for url in items:
        yield {"url": url}


def check_pid_is_running(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0; a process of another user counts as gone,
    as in webdataset)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def without_last_extension(fname: str) -> str:
    """``fname`` without its last extension: ``"a.b.tar"`` -> ``"a.b"``."""
    return re.sub(r"\.[^.]*$", "", fname)


def get_pid_from_filename(fname: str) -> int | None:
    """The pid of a claimed name ``"shard.tar._1234_"``, else ``None``."""
    match = re.match(r"^(.*)\._(\d+)_$", fname)
    return int(match.group(2)) if match else None
