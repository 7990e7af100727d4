"""Shared test set-up: nothing may leave the machine, and each test gets a clean wds_cloud env."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

import pytest
from zygote import Zygote, shared

pytest_plugins = ["stores.fixtures", "stores.plainhttp"]  # real test servers, on first use

# Cloud SDKs probe instance-metadata addresses for default credentials; keep them on loopback.
_NO_METADATA = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "AWS_EC2_METADATA_DISABLED": "true",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}
os.environ.update(_NO_METADATA)

# pytest keeps the test modules it rewrites (assertions) in __pycache__ only where bytecode may
# be written; with PYTHONDONTWRITEBYTECODE set (as on these machines) each xdist worker would
# rewrite every test module again on every run (~5 s of CPU each). The variable stays set for
# the processes the tests start.
sys.dont_write_bytecode = False

_OURS = ("WDS_", "GOPEN_", "AIS_ENDPOINT", "USE_AIS_FOR")
_DIST = ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS", "LOCAL_RANK")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): one worker more than the cores this process may use.

    Many tests wait on subprocesses and servers (a server's start, a timeout budget, a
    torchrun rendezvous): with one worker per core, a core idles while its worker waits (the
    whole run kept the machine ~80 % busy); one more worker fills those waits. Measured on 2
    cores (whole run, under no other load): 2 workers 288 s, 3 workers 238 s, 4 workers
    236 s but more CPU (421 s against 433 s of user+sys for 3 and 4).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still overrides, as xdist documents.
    """
    forced = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if forced:
        return int(forced)
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first, the rest in their usual order.

    Under pytest-xdist (``-n``, ``--dist loadgroup`` in pyproject: each test, or each
    ``xdist_group``, is a unit handed to the next idle worker) each slow test then starts at
    once on a worker of its own, instead of one of them starting last and the run waiting for it.
    The order is the same in every worker, as xdist requires.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


@pytest.fixture(scope="session")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Zygote:
    """New Python processes forked from one that has imported torch and the cloud SDKs
    (tests/zygote.py), shared by the run's pytest-xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return shared(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


#: Python's own variables as the run started: dask's "processes" scheduler sets
#: PYTHONHASHSEED in the process that calls it, which every later test's children would inherit
_PYTHON_AT_START = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}


@pytest.fixture(autouse=True)
def _clean_wds_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests start without any wds_cloud or rank/worker variables from the caller's shell, and
    with Python's own variables as the run started."""
    for name in list(os.environ):
        if name.startswith(_OURS) or name in _DIST:
            monkeypatch.delenv(name)
    yield
    for name in [k for k in os.environ if k.startswith("PYTHON")]:
        if name not in _PYTHON_AT_START:
            del os.environ[name]
    os.environ.update(_PYTHON_AT_START)


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started during the test, in order."""
    started: list[str] = []
    start = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", recording_start)
    return started
