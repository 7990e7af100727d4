"""A child process for the cache tests (tests/cache/test_cache_procs.py,
tests/cache/test_cache_fill.py,
driven by tests/cache/cacheprocs/driver.py): reads shards through a shard cache.

    python tests/cache/cacheprocs/child.py MODE --cache DIR --urls FILE [--expect FILE] [--first N]

It talks to the test over its standard streams, one line at a time (stdout is flushed after
every line; the test reads it with a timeout):

``shards``   prints ``ready``, waits for a line on stdin, then reads each URL of ``--urls`` (a
             JSON list) whole with ``wds.gopen(url, cache_dir=DIR)``, in that order, and prints
             ``ok <i>`` when its SHA-256 matches ``--expect`` (JSON ``{url: sha256}``) or
             ``BAD <i> <url>`` and exits 3 when it does not; at the end ``done``, and it
             waits for another line before it exits (so it can be killed after the end).
``samples``  prints ``ready``, waits for a line on stdin, then iterates
             ``wds.WebDataset(urls, cache_dir=DIR, shardshuffle=False)`` and prints one line
             ``sample <url> <key> <sha256 of its members>`` per sample, then ``done``, and
             waits for another line before it exits.
``hold``     opens the one URL of ``--urls`` through the cache, prints ``open``, reads
             ``--first`` bytes (0: none) and prints ``got <n>``, waits for a line on stdin,
             reads the rest and prints ``sha <sha256 of the whole shard>``, and waits for
             another line before it exits.

Why the last wait: a download is published by a daemon thread a moment after its reader got
the last byte; a process that exits at once can lose it (reported to the lead). The test lets a
child exit once what it downloaded is published.

With ``WDS_VERBOSE_CACHE=1`` in its environment the cache's hit/miss/follow/takeover lines go
to stderr. Only the environment the test gives it is used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

import wds_cloud as wds


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for_go() -> None:
    say("ready")
    if not sys.stdin.readline():
        sys.exit(2)  # the test went away


def members_digest(sample: dict[str, Any]) -> str:
    """The SHA-256 of a sample's members (raw bytes), in the order of their names (the tests
    import it to compute what a child should print)."""
    h = hashlib.sha256()
    for name in sorted(k for k in sample if not k.startswith("__")):
        h.update(name.encode() + b"\0" + sample[name] + b"\0")
    return h.hexdigest()


def read_shards(urls: list[str], cache: str, expect: dict[str, str]) -> int:
    wait_for_go()
    for i, url in enumerate(urls):
        with wds.gopen(url, cache_dir=cache) as stream:
            digest = hashlib.sha256(stream.read()).hexdigest()
        if digest != expect[url]:
            say(f"BAD {i} {url}")
            return 3
        say(f"ok {i}")
    say("done")
    sys.stdin.readline()
    return 0


def read_samples(urls: list[str], cache: str) -> int:
    dataset = wds.WebDataset(urls, cache_dir=cache, shardshuffle=False)
    wait_for_go()
    for sample in dataset:
        say(f"sample {sample['__url__']} {sample['__key__']} {members_digest(sample)}")
    say("done")
    sys.stdin.readline()
    return 0


def hold(url: str, cache: str, first: int) -> int:
    with wds.gopen(url, cache_dir=cache) as stream:
        say("open")
        h = hashlib.sha256()
        got = 0
        while got < first:
            chunk = stream.read(first - got)
            if not chunk:
                break
            h.update(chunk)
            got += len(chunk)
        say(f"got {got}")
        if not sys.stdin.readline():
            return 2
        while chunk := stream.read(1 << 20):
            h.update(chunk)
    say(f"sha {h.hexdigest()}")
    sys.stdin.readline()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("mode", choices=["shards", "samples", "hold"])
    parser.add_argument("--cache", required=True)
    parser.add_argument("--urls", required=True, help="a JSON file: a list of URLs")
    parser.add_argument("--expect", help="a JSON file: {url: sha256}")
    parser.add_argument("--first", type=int, default=0)
    args = parser.parse_args()
    with open(args.urls) as f:
        urls = list(json.load(f))
    if args.mode == "shards":
        with open(args.expect) as f:
            return read_shards(urls, args.cache, json.load(f))
    if args.mode == "samples":
        return read_samples(urls, args.cache)
    return hold(urls[0], args.cache, args.first)


if __name__ == "__main__":
    sys.exit(main())
