"""The stores whose GETs the reading thread sends and receives (wds_cloud.stores.direct):
``s3://``, ``gs://`` and ``http(s)://`` read that way by default, from the start and from an
offset. What each store leaves to its own client is in test_s3_reads.py, test_gcs_reads.py
and test_http_reads.py."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from stores import Store
from wds_cloud.router import gopen
from wds_cloud.settings import Settings
from wds_cloud.stores.direct import DirectBody

FAST = Settings(retries=1, retry_backoff=0.01, retry_backoff_max=0.02)
DATA = random.Random(6).randbytes(3 * 2**20 + 13)


@pytest.mark.parametrize("scheme", ["s3", "gs", "http"])
def test_a_read_is_received_by_the_reading_thread(scheme: str,
                                                  store_factory: Callable[[str], Store]) -> None:
    store = store_factory(scheme).holding("data.bin", DATA)
    url, options = store.url("data.bin"), store.storage_options
    with gopen(url, "rb", settings=FAST, storage_options=options) as stream:
        assert isinstance(stream._body, DirectBody)  # not through fsspec's event loop
        assert stream.read(10) == DATA[:10] and stream.read() == DATA[10:]
    with gopen(url, "rb", settings=FAST, storage_options=options, offset=2**20) as stream:
        assert stream.read() == DATA[2**20:]
