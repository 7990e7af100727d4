"""Run by tests/stores/test_fork_and_exit.py in a fresh interpreter, so that nothing done earlier
in the test process (fork hooks installed, a client made) hides what a new user's script meets.

``python forkexit_child.py MODE JSON`` (the JSON object is the configuration; the test runs it
with runpy, so that this directory does not shadow azure, gcs... on sys.path):

- ``fork``: the parent does the steps ``before`` (``"write"``, ``"read"``, ``"glob"``), builds a
  ``WebDataset`` over ``shards`` (a list, or a pattern it lists), reads it for two epochs
  through a ``DataLoader`` with two forked workers, then does each step ``after`` and prints
  one JSON line: the samples seen per epoch, the seconds each step after took, and its
  ``io_stats()``.
- ``abandon``: opens ``url``, reads 1000 bytes and leaves the stream open at exit (``how``:
  ``"stream"``, or ``"dataset"``: the first sample of a dataset iterator left unfinished).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import wds_cloud as wds
from wds_cloud.router import expand_glob


def _write(cfg: dict[str, Any]) -> None:
    with wds.gopen(cfg["write_url"], "wb", storage_options=cfg["storage_options"]) as sink:
        sink.write(b"written by the parent " * 100)


def _read(cfg: dict[str, Any]) -> None:
    with wds.gopen(cfg["read_url"], storage_options=cfg["storage_options"]) as stream:
        if len(stream.read()) != cfg["read_size"]:
            raise SystemExit(f"short read of {cfg['read_url']}")


def _glob(cfg: dict[str, Any]) -> None:
    if not expand_glob([cfg["pattern"]], storage_options=cfg["storage_options"]):
        raise SystemExit(f"nothing matches {cfg['pattern']}")


STEPS: dict[str, Callable[[dict[str, Any]], None]] = {
    "write": _write, "read": _read, "glob": _glob}


def fork(cfg: dict[str, Any]) -> None:
    import torch

    for step in cfg["before"]:
        STEPS[step](cfg)
    dataset = wds.WebDataset(cfg["shards"], shardshuffle=False,
                             storage_options=cfg["storage_options"]).to_tuple("txt")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    epochs = [sum(1 for _ in loader) for _ in range(2)]
    seconds = {}
    for step in cfg["after"]:
        start = time.monotonic()
        STEPS[step](cfg)
        seconds[step] = round(time.monotonic() - start, 3)
    print(json.dumps({"epochs": epochs, "seconds": seconds, "stats": wds.io_stats()}),
          flush=True)


def abandon(cfg: dict[str, Any]) -> None:
    global left_open  # a module global: the interpreter's own teardown is what closes it
    if cfg["how"] == "dataset":
        left_open = iter(wds.WebDataset(cfg["url"], shardshuffle=False,
                                        storage_options=cfg["storage_options"]))
        print(len(next(left_open)["bin"]), flush=True)
    else:
        left_open = wds.gopen(cfg["url"], storage_options=cfg["storage_options"])
        print(len(left_open.read(1000)), flush=True)


if __name__ == "__main__":
    {"fork": fork, "abandon": abandon}[sys.argv[-2]](json.loads(sys.argv[-1]))
