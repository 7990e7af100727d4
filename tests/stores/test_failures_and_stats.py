"""What a user sees when a store fails or is counted: a refused connection (nothing listening)
through each store's real client, the retry budget's name against the attempts made, the
schemes an unknown one is told about, and the I/O counters of DataLoader workers gathered by
``WebLoader.io_stats()``."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from zygote import Zygote

import wds_cloud as wds
from stores.azure import connection_string
from stores.base import Store
from stores.procs import free_port
from wds_cloud.errors import ConfigError, TransferError, UnsupportedSchemeError
from wds_cloud.io import registry
from wds_cloud.testing.contract import tar_bytes

StoreFactory = Callable[[str], Store]


def _refused(name: str, port: int) -> tuple[str, dict[str, Any]]:
    """A URL of store ``name`` whose endpoint is 127.0.0.1:``port``, and its storage options."""
    endpoint = f"http://127.0.0.1:{port}"
    if name == "http":
        return f"{endpoint}/data/shard.tar", {}
    if name == "s3":
        return "s3://bucket/shard.tar", {"s3": {"endpoint_url": endpoint, "key": "testing",
                                               "secret": "testing"}}
    if name == "gs":
        return "gs://bucket/shard.tar", {"gs": {"endpoint_url": endpoint, "token": "anon",
                                               "project": "wds-test"}}
    return "az://container/shard.tar", {"az": {"connection_string": connection_string(endpoint)}}


@pytest.mark.parametrize(("name", "retries"), [("http", 2), ("s3", 2), ("gs", 2), ("az", 2),
                                               ("http", 0)])
def test_a_refused_connection_warns_once_and_ends_in_one_clean_line(
    name: str, retries: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()  # nothing listens there
    url, options = _refused(name, port)
    monkeypatch.setenv("WDS_RETRIES", str(retries))
    monkeypatch.setenv("WDS_RETRY_BACKOFF", "0.01")
    caplog.set_level(logging.INFO, logger="wds_cloud.stores")
    with pytest.raises(TransferError) as info:
        wds.gopen(url, storage_options=options).read()
    err = info.value
    attempts = f"{retries + 1} attempt" + ("s" if retries else "")
    retried = f"{retries} retr" + ("y" if retries == 1 else "ies")
    assert str(err) == (f"cannot read {url} at byte 0: connection refused (127.0.0.1:{port}); "
                        f"gave up after {retried} ({attempts} in a row failed)")
    assert err.attempts == retries + 1 and err.url == url
    levels = [r.levelname for r in caplog.records
              if r.name.startswith("wds_cloud.stores") and r.getMessage().startswith("retry ")]
    assert levels == (["WARNING"] + ["INFO"] * (retries - 1) if retries else [])
    said = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
                     and r.name.startswith("wds_cloud"))
    for internal in ("ConnectionKey", "Error(", "ssl:default"):
        assert internal not in str(err) + said


def test_an_unknown_scheme_names_ais_among_those_that_work() -> None:
    with pytest.raises(UnsupportedSchemeError) as info:
        wds.gopen("nosuch://bucket/a.tar")
    assert "ais" in info.value.registered and ", ais, " in str(info.value)
    assert "ais" not in registry.registered_schemes()  # no opener of its own: the router maps it
    with pytest.raises(ConfigError, match="AIS_ENDPOINT"):
        registry.get_opener("ais://bucket/a.tar")


def _note_worker(directory: Path, worker_id: int) -> None:
    (directory / f"worker-{worker_id}").touch()


def test_webloader_sums_the_io_of_its_workers(
    store_factory: StoreFactory, tmp_path: Path,
) -> None:
    store = store_factory("s3")
    sizes = []
    for k in range(4):
        data = tar_bytes([(f"s{k}-{i}", {"txt": f"{k}/{i}".encode() * 100}) for i in range(10)])
        store.put(f"data/shard-{k}.tar", data)
        sizes.append(len(data))
    dataset = wds.WebDataset(store.url("data/shard-*.tar"), shardshuffle=False,
                             storage_options=store.storage_options).to_tuple("txt")
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2,
                           multiprocessing_context="fork",
                           worker_init_fn=functools.partial(_note_worker, tmp_path))
    assert loader.io_stats() == dict.fromkeys(loader.io_stats(), 0)
    wds.reset_io_stats()
    for _ in range(2):
        assert sum(1 for _ in loader) == 40
    stats = loader.io_stats()
    assert stats["requests"] == 8 and stats["bytes_read"] == 2 * sum(sizes)
    assert stats["retries"] == stats["failures"] == 0
    assert wds.io_stats()["requests"] == 0  # the main process read nothing itself
    assert sorted(p.name for p in tmp_path.glob("worker-*")) == ["worker-0", "worker-1"]
    assert wds.WebLoader(dataset, batch_size=None).io_stats()["requests"] == 0  # no workers


_PYTHON_READER = """
import json, sys
import wds_cloud as wds
url, options = sys.argv[1], json.loads(sys.argv[2])
try:
    next(iter(wds.WebDataset(url, storage_options=options, shardshuffle=False)))
except wds.WdsCloudError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def _cli_options(options: dict[str, Any]) -> list[str]:
    return [arg for scheme, values in options.items() for name, value in values.items()
            for arg in ("-o", f"{scheme}.{name}={value}")]


@pytest.mark.parametrize("endpoint", ["refused", "silent"])
@pytest.mark.parametrize("name", ["http", "s3", "gs", "az"])
@pytest.mark.parametrize("via", ["cli", "python"])
def test_an_unreachable_endpoint_ends_within_the_budget_in_one_line(
        name: str, endpoint: str, via: str, tmp_path: Path, zygote: Zygote) -> None:
    """``wds-cloud ls`` and ``WebDataset`` against an endpoint where nothing listens (refused)
    or where nothing answers (a listening socket that never accepts: each request waits out
    WDS_TIMEOUT): a listing (a bucket's glob) or a lookup or read (http) ends after
    WDS_RETRIES retries, with one error line naming the URL and neither a library's traceback
    nor its ERROR log (gcsfs retried 6 times over 34 s and logged a traceback, azure-core 3
    times a request over 2m47s)."""
    retries, timeout = 1, 0.5
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        if endpoint == "silent":
            silent.bind(("127.0.0.1", 0))
            silent.listen(64)
            port = silent.getsockname()[1]
        else:
            port = free_port()
        url, options = _refused(name, port)
        if name != "http":
            url = url.replace("shard.tar", "*.tar")  # a listing
        env = {**os.environ, "WDS_RETRIES": str(retries), "WDS_TIMEOUT": str(timeout),
               "WDS_RETRY_BACKOFF": "0.01"}
        command = ([sys.executable, "-m", "wds_cloud.cli", "ls", url, *_cli_options(options)]
                   if via == "cli" else
                   [sys.executable, "-c", _PYTHON_READER, url, json.dumps(options)])
        start = time.monotonic()
        done = zygote.run(command, capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
        elapsed = time.monotonic() - start
    errors = [line for line in done.stderr.splitlines()
              if "error" in line.lower() and not line.startswith("WARNING wds_cloud")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and url in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "ERROR" not in done.stderr, done.stderr
    assert ("connection refused" if endpoint == "refused" else "timed out") in errors[0]
    # every attempt may wait out the timeout; 15 s for starting Python on a busy machine
    assert elapsed < (retries + 1) * timeout + 0.01 * retries + 15, (elapsed, done.stderr)


@pytest.mark.parametrize("what", ["a shard", "a glob"])
def test_an_endpoint_that_is_no_url_fails_at_once(what: str) -> None:
    """A mistyped endpoint (``htp://``) is a configuration no retry mends: the first read or
    listing fails at once, naming the shard and the endpoint (it was retried for 20 s)."""
    options = {"s3": {"endpoint_url": "htp://127.0.0.1:9", "key": "k", "secret": "s"}}
    url = "s3://shards/train-000000.tar" if what == "a shard" else "s3://shards/train-*.tar"
    stats = wds.io_stats()
    with pytest.raises(wds.OpenError, match=r"htp://127\.0\.0\.1:9") as info:
        list(wds.WebDataset(url, shardshuffle=False, storage_options=options))
    assert url in str(info.value) and not isinstance(info.value, TransferError)
    assert wds.io_stats()["retries"] == stats["retries"]
