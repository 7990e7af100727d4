"""What a user sees when a store fails or is counted: a refused connection (nothing listening)
through each store's real client, the retry budget's name against the attempts made, the
schemes an unknown one is told about, and the I/O counters of DataLoader workers gathered by
``WebLoader.io_stats()``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
