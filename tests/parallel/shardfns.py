"""Sample functions for the map_shards tests: at the top level of a module, so process pools
and Dask workers (which import this module by name) can run them. Failures are keyed by the
shard's URL and, for "fail once", recorded in a marker file, since tasks run in other
processes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any


def shout(sample: dict[str, Any]) -> dict[str, Any]:
    """txt upper-cased; the key comes back from the input (not returned)."""
    return {"txt": sample["txt"].upper(), "cls": sample["cls"]}


def shout_decoded(sample: dict[str, Any]) -> dict[str, Any]:
    sample["txt"] = sample["txt"].upper()
    sample["json"]["seen"] = True
    return sample


def fail_once(markers: str, victim: str, sample: dict[str, Any]) -> dict[str, Any]:
    """Raise on the first attempt at the shard whose URL ends with ``victim``."""
    if sample["__url__"].endswith(victim):
        marker = os.path.join(markers, "failed-" + victim)
        if not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            raise RuntimeError(f"first attempt at {victim} fails")
    return shout(sample)


def fail_midway(victim: str, sample: dict[str, Any]) -> dict[str, Any]:
    """Fail every attempt at ``victim``, after some of its samples were written."""
    if sample["__url__"].endswith(victim) and sample["__key__"].endswith("-0003"):
        raise ValueError(f"{victim} always fails")
    return shout(sample)


def split_in_two(sample: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """Two samples out of each, or none out of odd-numbered ones."""
    if int(sample["cls"]) % 2:
        return []
    key = sample["__key__"]
    return [{"__key__": f"{key}-a", "txt": sample["txt"]},
            {"__key__": f"{key}-b", "txt": sample["txt"][::-1]}]


def keep_first_two(samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A whole-shard function: the first two samples, with the shard's sample count."""
    taken = list(samples)
    for sample in taken[:2]:
        yield {"__key__": sample["__key__"], "json": json.dumps({"of": len(taken)})}
