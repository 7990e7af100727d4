"""How ``gs://`` reads are sent: with gcsfs's URL, headers and ``userProject``, by the reading
thread (wds_cloud.stores.direct) unless gcsfs's session was given options of its own.

(What every opener must do, this one included, is in test_contract.py; faults and resumes in
test_faults.py and test_cloudstores.py, which go through this path.)"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from stores import FaultProxy, Store
from stores.procs import child_env
from wds_cloud.router import gopen
from wds_cloud.settings import Settings
from wds_cloud.stores.aio import AsyncBody
from wds_cloud.stores.direct import DirectBody
from wds_cloud.stores.gcs import GcsOpener, _sendable

FAST = Settings(retries=1, retry_backoff=0.01, retry_backoff_max=0.02)
DATA = random.Random(5).randbytes(3 * 2**20 + 11)


@pytest.fixture
def gs(store_factory: Callable[[str], Store]) -> Store:
    return store_factory("gs").holding("data.bin", DATA)


def _options(store: Store, **extra: Any) -> dict[str, Any]:
    return {"gs": {**store.storage_options["gs"], "skip_instance_cache": True, **extra}}


@pytest.mark.parametrize(("extra", "direct"), [
    ({}, True),
    ({"requester_pays": "billed-project"}, True),
    ({"session_kwargs": {"trust_env": True}}, False),
])
def test_the_session_sends_what_only_it_can(gs: Store, extra: dict[str, Any],
                                            direct: bool) -> None:
    options = _options(gs, **extra)["gs"]
    fs = GcsOpener().filesystem(gs.url("data.bin"), options, timeout=5)
    assert _sendable(fs) == direct
    with gopen(gs.url("data.bin"), "rb", settings=FAST,
               storage_options=_options(gs, **extra)) as stream:
        assert isinstance(stream._body, DirectBody if direct else AsyncBody)
        assert stream.read() == DATA


def test_the_direct_get_is_gcsfs_own(gs: Store, fault_proxy: Callable[..., FaultProxy]) -> None:
    # the JSON API media download, pinned to the generation once known, with userProject
    proxy = fault_proxy(gs)
    via = gs.proxied(proxy)
    options = _options(via, requester_pays="billed-project")
    with gopen(via.url("data.bin"), "rb", settings=FAST, storage_options=options,
               offset=100) as stream:
        assert isinstance(stream._body, DirectBody) and stream.read() == DATA[100:]
    (get,) = [r for r in proxy.requests() if r.method == "GET"]
    assert get.path.startswith("/download/storage/v1/b/") and get.path.endswith("/o/data.bin")
    assert "alt=media" in get.query and "userProject=billed-project" in get.query
    assert get.range == "bytes=100-" and get.status == 206


_DEFAULT_CLASS = """
from wds_cloud.errors import ConfigError
from wds_cloud.stores.gcs import GcsOpener
options = {"endpoint_url": "http://127.0.0.1:9", "token": "anon", "project": "p"}
print(type(GcsOpener().filesystem("gs://b/k", options, timeout=5)).__name__)
try:
    GcsOpener().filesystem("gs://b/k", {"endpoint_ur": "http://127.0.0.1:9"}, timeout=5)
except ConfigError as exc:
    print(exc)
"""


def test_options_are_checked_against_the_class_gcsfs_uses_by_default() -> None:
    # without GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false (which the tests set: that class asks
    # the emulator for its bucket type over gRPC and waits a minute), gcsfs's ``gs`` class
    # is ExtendedGcsFileSystem, which names only its own options and hands the rest on
    env = child_env()
    env.pop("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", None)
    done = subprocess.run([sys.executable, "-c", _DEFAULT_CLASS], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    made, refused = done.stdout.splitlines()
    assert made == "ExtendedGcsFileSystem"
    assert "has no option 'endpoint_ur'; did you mean 'endpoint_url'?" in refused
