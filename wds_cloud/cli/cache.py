"""``wds-cloud cache ls | du | verify | prune --to SIZE | clear``: look after a shard cache.

Each subcommand takes ``--dir DIR``; without it the directory is the ``WDS_CACHE`` setting.
Sizes are printed in binary units (``human_size``) and read as ``parse_size`` reads them
(``500MiB``, ``1e9``, ``50GB``). Everything is safe to run while other processes use the cache:
entries being read or downloaded are kept (:mod:`wds_cloud.cache.admin`).

Exit status: 0 done; 1 ``verify`` found problems, or a library error; 2 no usable directory
(none given, missing, or not a shard cache) or a bad argument.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ..cache import admin as cacheadmin
from ..cache.layout import CacheLayout
from ..cache.shardcache import ShardCache
from ..settings import Settings, expand_path, human_size
from .common import add_json_option, command_parser, emit_json, plural, size_arg

__all__ = ["add_parser", "cmd_cache"]

_NO_DIR = 2
_DESCRIPTION = ("Look after the on-disk shard cache. Each command takes --dir DIR (default: "
                "WDS_CACHE) and is safe to run while other processes read through the cache: "
                "entries being read or downloaded are kept.")
_TAG = "CACHEDIR.TAG"
_EXIT = ("exit status: 0 done; 1 verify found bad entries (removed); 2 no usable cache "
         "directory, or a bad argument")


def add_parser(sub: Any) -> None:
    """Register ``cache`` and its subcommands on the ``wds-cloud`` subparsers ``sub``."""
    parser = command_parser(sub, "cache", help="list, measure, verify, prune or clear the "
                            "shard cache", description=_DESCRIPTION)
    actions = parser.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    helps = {
        "ls": "one line per entry (size, last used, URL, name), least recently used first",
        "du": "entries, total size, downloads in progress and the limit (WDS_CACHE_SIZE)",
        "verify": "re-read every entry against its record; remove the bad ones (exit 1 if any)",
        "prune": "evict least-recently-used entries not in use until the cache holds ≤ SIZE",
        "clear": "remove every entry not in use and the downloads of dead processes",
    }
    for name, text in helps.items():
        p = command_parser(actions, name, help=text, description=text, epilog=_EXIT)
        p.add_argument("--dir", help="the cache directory (default: WDS_CACHE)")
        add_json_option(p)
        if name == "prune":
            p.add_argument("--to", required=True, type=size_arg, metavar="SIZE",
                           help="bytes to keep at most: 500MiB, 1e9, 50GB, ...")
    parser.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    """Run ``wds-cloud cache <command>``; the exit status."""
    settings = Settings.from_env()
    root = expand_path(args.dir) if args.dir else settings.cache_dir
    if not root:
        return _fail("no cache directory: give --dir DIR or set WDS_CACHE")
    if not os.path.isdir(root):
        return _fail(f"no cache directory at {root} (--dir / WDS_CACHE): nothing was cached "
                     "there yet, or the path is wrong")
    if not (os.path.exists(os.path.join(root, _TAG)) or os.path.isdir(os.path.join(root, "data"))):
        return _fail(f"{root} is not a wds_cloud shard cache (it has no {_TAG} and no data/); "
                     "check --dir / WDS_CACHE")
    bound, args.bound_from = settings.cache_size, "WDS_CACHE_SIZE"
    if bound is None:
        bound = CacheLayout(root).recorded_bound()
        args.bound_from = "noted by the last job that used the cache with a bound"
    cache = ShardCache(root, max_bytes=bound)
    command = _COMMANDS[args.cache_command]
    if args.cache_command in ("verify", "prune", "clear"):
        cache.layout.ensure()  # a cache missing a subdirectory gets it back before changes
    return command(cache, args)


def _fail(message: str) -> int:
    print(f"wds-cloud cache: {message}", file=sys.stderr)
    return _NO_DIR


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _ls(cache: ShardCache, args: argparse.Namespace) -> int:
    found = cacheadmin.entries(cache)
    if args.json:
        emit_json({"cache": cache.root, "entries": [
            {"url": e.url, "name": e.name, "size": e.size, "last_used": e.last_used}
            for e in found]})
        return 0
    for e in found:
        print(f"{human_size(e.size):>10}  {_when(e.last_used)}  {e.url}  {e.name}")
    return 0


def _du(cache: ShardCache, args: argparse.Namespace) -> int:
    use = cacheadmin.usage(cache)
    charged = use.charged
    if args.json:
        emit_json({"cache": cache.root, "entries": use.entries, "bytes": use.bytes,
                   "charged": charged, "downloads": use.downloads,
                   "download_bytes": use.download_bytes, "limit": use.limit,
                   "limit_from": args.bound_from if use.limit is not None else None})
        return 0
    print(f"cache: {cache.root}")
    print(f"entries: {use.entries:,}, {human_size(use.bytes)} ({use.bytes} bytes; "
          f"{human_size(charged)} counted against the limit)")
    print(f"downloads in progress: {use.downloads:,}, {human_size(use.download_bytes)}")
    if use.limit is None:
        print("limit: none (set WDS_CACHE_SIZE to bound the cache)")
    else:
        share = f", {100 * charged / use.limit:.1f}% used" if use.limit else ""
        print(f"limit: {human_size(use.limit)} ({args.bound_from}){share}")
    return 0


def _verify(cache: ShardCache, args: argparse.Namespace) -> int:
    checked, problems = cacheadmin.verify(cache)
    if args.json:
        emit_json({"cache": cache.root, "checked": checked, "problems": [
            {"name": p.name, "url": p.url, "why": p.why, "removed": p.removed}
            for p in problems]})
        return 1 if problems else 0
    for p in problems:
        fate = "removed" if p.removed else "kept"
        print(f"problem: {p.name} ({p.url}): {p.why}; {fate}")
    print(f"checked {plural(checked, 'entry', 'entries')}: {plural(len(problems), 'problem')}"
          + (", removed; they are fetched again when next read" if problems else ""))
    return 1 if problems else 0


def _prune(cache: ShardCache, args: argparse.Namespace) -> int:
    before = {e.name: e for e in cacheadmin.entries(cache)}
    evicted, used = cacheadmin.prune(cache, args.to)
    if args.json:
        emit_json({"cache": cache.root, "target": args.to, "bytes": used,
                   "evicted": [{"name": n, "url": before[n].url if n in before else None,
                                "size": before[n].size if n in before else None}
                               for n in evicted],
                   "entries": len(cacheadmin.entries(cache))})
        return 0
    for name in evicted:
        e = before.get(name)
        print(f"evicted {human_size(e.size) if e else '?':>10}  {e.url if e else '?'}  {name}")
    left = cacheadmin.entries(cache)
    print(f"evicted {plural(len(evicted), 'entry', 'entries')}; now "
          f"{plural(len(left), 'entry', 'entries')}, "
          f"{human_size(used)} (target {human_size(args.to)})")
    if used > args.to:
        print(f"still above the target: {human_size(used)} is charged by entries in use; run "
              "prune again when they are closed")
    return 0


def _clear(cache: ShardCache, args: argparse.Namespace) -> int:
    removed, kept, stale = cacheadmin.clear(cache)
    downloads = cacheadmin.usage(cache).downloads
    if args.json:
        emit_json({"cache": cache.root, "removed": removed, "kept_in_use": kept,
                   "stale_downloads_removed": stale, "downloads_in_progress": downloads})
        return 0
    print(f"removed {plural(removed, 'entry', 'entries')}; kept {kept:,} in use; removed "
          f"{plural(stale, 'download')} left by dead processes; {plural(downloads, 'download')} "
          "still in progress")
    return 0


_COMMANDS = {"ls": _ls, "du": _du, "verify": _verify, "prune": _prune, "clear": _clear}
