"""What a fresh process meets around forks and at exit, against the real servers: the parent's
requests after its DataLoader workers ran (whatever it did with the store before forking them)
neither stall nor make the workers print asyncio errors, and a stream left open at exit never
keeps the interpreter from ending.

Each case runs ``forkexit_child.py`` in a new process, forked from the zygote (tests/zygote.py:
torch and the SDKs imported, nothing of wds_cloud run): in this test process earlier tests
have long made clients and installed the fork hooks, which would hide the bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from zygote import Zygote

from stores.base import Store
from wds_cloud.testing.contract import tar_bytes

StoreFactory = Callable[[str], Store]

CHILD = Path(__file__).with_name("forkexit_child.py")
#: runs CHILD as ``__main__`` without putting its directory first on sys.path (this directory's
#: azure.py, gcs.py... would shadow the libraries)
RUN_CHILD = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
#: seconds a stalled request would wait before its retry; every request here takes far less
TIMEOUT = 5


def _run_child(zygote: Zygote, mode: str, cfg: dict[str, Any], store: Store, *,
               limit: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **store.env, "WDS_TIMEOUT": str(TIMEOUT)}
    try:
        return zygote.run([sys.executable, "-c", RUN_CHILD, str(CHILD), mode, json.dumps(cfg)],
                          env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout
        what = cfg.get("url") or cfg.get("shards")
        pytest.fail(f"{mode} of {what} still running after {limit} s; its output: {out!r}")


def _seed_shards(store: Store, shards: int = 4, per_shard: int = 10) -> list[str]:
    keys = [f"train/shard-{k:03d}.tar" for k in range(shards)]
    for k, key in enumerate(keys):
        store.put(key, tar_bytes([(f"s{k}-{i:03d}", {"txt": f"{k}/{i}".encode()})
                                  for i in range(per_shard)]))
    return keys


# (store, what the parent did before forking): a listing alone (the client it used is made by
# fsspec's own sync wrapper, not by a read), or writes, reads and listings
FORK_CASES = [("s3", ()), ("gs", ()), ("az", ()),
              ("s3", ("write", "read", "glob")), ("gs", ("write", "read", "glob")),
              ("az", ("write", "read", "glob")), ("http", ("write", "read"))]


@pytest.mark.parametrize(("name", "before"), FORK_CASES)
def test_the_parents_requests_after_forked_workers_do_not_stall(
    name: str, before: tuple[str, ...], store_factory: StoreFactory, zygote: Zygote,
) -> None:
    store = store_factory(name)
    keys = _seed_shards(store)
    listing = "list" in store.features
    cfg = {
        "storage_options": store.storage_options,
        "shards": store.url("train/shard-*.tar") if listing else [store.url(k) for k in keys],
        "pattern": store.url("train/shard-*.tar"),
        "read_url": store.url(keys[0]), "read_size": len(store.get(keys[0]) or b""),
        "write_url": store.url("out/written.bin"),
        "before": list(before),
        "after": ["read", "write", "glob"] if listing else ["read", "write"],
    }
    out = _run_child(zygote, "fork", cfg, store, limit=90)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "attached to a different loop" not in out.stderr, out.stderr[-3000:]
    assert "Task exception was never retrieved" not in out.stderr, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["epochs"] == [40, 40]
    slow = {step: s for step, s in report["seconds"].items() if s > TIMEOUT / 2}
    assert not slow, f"the parent's requests after the workers stalled: {slow}"
    assert report["stats"]["retries"] == 0
    assert store.get("out/written.bin") == b"written by the parent " * 100


@pytest.mark.parametrize("how", ["stream", "dataset"])
@pytest.mark.parametrize("name", ["s3", "gs", "az", "http", "ais"])
def test_a_stream_left_open_does_not_keep_the_process_from_exiting(
    name: str, how: str, store_factory: StoreFactory, zygote: Zygote,
) -> None:
    store = store_factory(name)
    payload = os.urandom(64 * 1024) * 128  # 8 MiB: far more than one read buffers
    if how == "dataset":
        store.put("big.tar", tar_bytes([("only", {"bin": payload})]))
        url = store.url("big.tar")
    else:
        store.put("big.bin", payload)
        url = store.url("big.bin")
    cfg = {"url": url, "storage_options": store.storage_options, "how": how}
    start = time.monotonic()
    out = _run_child(zygote, "abandon", cfg, store, limit=40)
    took = time.monotonic() - start
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(len(payload)) if how == "dataset" else "1000"]
    assert took < 20, f"the process took {took:.1f} s to exit"


def test_a_ctrl_c_in_a_child_being_forked_does_not_stop_the_loops_detach(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C goes to the whole process group: a DataLoader worker being forked may get its
    KeyboardInterrupt inside the fork hook, which Python reports as "Exception ignored in:
    <function _detach_loop>" with a traceback. The detach is finished all the same (the child
    must not close the parent's connections) and nothing is raised (the parent stops)."""
    import asyncio
    import selectors

    from wds_cloud.stores import aio

    loop = asyncio.new_event_loop()
    shared = loop._selector  # type: ignore[attr-defined]
    made = []
    real = selectors.DefaultSelector

    def interrupted_once() -> selectors.BaseSelector:
        if not made:
            made.append(None)
            raise KeyboardInterrupt
        made.append(real())
        return made[-1]

    monkeypatch.setattr(aio.selectors, "DefaultSelector", interrupted_once)
    monkeypatch.setattr(aio, "_loop_at_fork", [loop])
    aio._detach_loop()  # does not raise
    own = loop._selector  # type: ignore[attr-defined]
    assert own is made[-1] and own is not shared and shared.get_map() is None  # closed
    assert not loop.is_running() and aio._loop_at_fork == [None]
    monkeypatch.undo()
    loop.close()
