"""A server that ignores ``Range`` (Python's ``http.server``, as many mirrors): reads work, and a
resume at a byte reads the object from its start and skips to it (logged once), so a restored
state continues the stream exactly."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from shardgen import write_tar

import wds_cloud as wds


@pytest.fixture
def plain_http(no_ranges: str, tmp_path: Path) -> str:
    """4 shards of 25 samples on ``http.server``; their URL pattern."""
    for s in range(4):
        write_tar(tmp_path / f"p-{s}.tar", [(f"p{s}-{i:03d}", {"txt": b"y" * 300})
                                            for i in range(25)])
    return f"{no_ranges}/p-{{0..3}}.tar"


def test_resume_from_a_server_that_ignores_range(plain_http: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def dataset() -> wds.WebDataset:
        return wds.WebDataset(plain_http, shardshuffle=4, seed=2).shuffle(20)

    whole = [s["__key__"] for s in dataset()]
    assert len(whole) == 100
    first = dataset()
    it = iter(first)
    head = [s["__key__"] for s in itertools.islice(it, 37)]
    state = first.state_dict()
    assert any(k.endswith(".offset") and v > 0 for k, v in state.items()
               if isinstance(v, int))  # a resume at a byte inside a shard
    again = dataset()
    again.load_state_dict(state)
    with caplog.at_level("WARNING"):
        tail = [s["__key__"] for s in again]
    assert head + tail == whole
    assert caplog.text.count("ignores Range requests") == 1
