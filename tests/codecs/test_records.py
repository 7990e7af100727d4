"""cbors_to_samples / msgpacks_to_samples on record files the tests write with cbor2/msgpack."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_cloud.codecs.records import cbor_file_samples as cbors_to_samples
from wds_cloud.codecs.records import msgpack_file_samples as msgpacks_to_samples
from wds_cloud.errors import ConfigError, MissingDependencyError, ShardFormatError
from wds_cloud.handlers import ignore_and_continue, ignore_and_stop

Dump = Callable[[Any], bytes]
KINDS: list[tuple[str, Dump, Any]] = [
    ("cbor", cbor2.dumps, cbors_to_samples),
    ("msgpack", msgpack.packb, msgpacks_to_samples),
]
ids = [k[0] for k in KINDS]


def _records(n: int, prefix: str = "") -> list[dict[str, Any]]:
    return [{"__key__": f"{prefix}k{i}", "txt": f"t{i}".encode(), "cls": i, "bin": bytes(i * 50)}
            for i in range(n)]


def _file(path: Path, dump: Dump, records: list[Any]) -> list[int]:
    """Write records back to back; return each record's start offset."""
    offsets, data = [], b""
    for record in records:
        offsets.append(len(data))
        data += dump(record)
    path.write_bytes(data)
    return offsets


class _Opener:
    """open_stream for local paths that remembers what it opened."""

    def __init__(self) -> None:
        self.opened: list[Any] = []

    def __call__(self, url: str) -> Any:
        self.opened.append(open(url, "rb"))  # noqa: SIM115 (closed by the reader)
        return self.opened[-1]


@pytest.mark.parametrize(("kind", "dump", "read"), KINDS, ids=ids)
def test_round_trip_over_several_files(tmp_path: Path, kind: str, dump: Dump, read: Any) -> None:
    files = {str(tmp_path / f"{n}.{kind}"): _records(n, prefix=str(n)) for n in (3, 0, 5)}
    for url, records in files.items():
        _file(Path(url), dump, records)
    opener = _Opener()
    out = list(read([{"url": url} for url in files], open_stream=opener))
    expected = [{**r, "__url__": url} for url, records in files.items() for r in records]
    assert out == expected
    assert len(opener.opened) == 3 and all(f.closed for f in opener.opened)


@pytest.mark.parametrize(("kind", "dump", "read"), KINDS, ids=ids)
def test_given_streams_and_missing_keys(tmp_path: Path, kind: str, dump: Dump, read: Any) -> None:
    records = [{"a": b"1"}, {b"bytes-key": b"2", "__key__": "mine"}, {"c": "text"}]
    data = b"".join(dump(r) for r in records)
    out = list(read([{"url": "mem://x", "stream": io.BytesIO(data)}]))
    assert out == [
        {"a": b"1", "__key__": "mem://x#0", "__url__": "mem://x"},
        {"bytes-key": b"2", "__key__": "mine", "__url__": "mem://x"},
        {"c": "text", "__key__": "mem://x#2", "__url__": "mem://x"},
    ]


@pytest.mark.parametrize(("kind", "dump", "read"), KINDS, ids=ids)
def test_truncated_file_names_url_and_offset(tmp_path: Path, kind: str, dump: Dump,
                                             read: Any) -> None:
    path = tmp_path / f"t.{kind}"
    offsets = _file(path, dump, _records(4))
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.raises(ShardFormatError, match="truncated") as info:
        list(read([{"url": str(path)}], open_stream=_Opener()))
    assert info.value.url == str(path) and info.value.offset == offsets[-1]
    assert "record #3" in str(info.value)
    # with a handler that goes on, the good records before the cut and the next file survive
    good = tmp_path / f"g.{kind}"
    _file(good, dump, _records(2, prefix="g"))
    out = list(read([{"url": str(path)}, {"url": str(good)}], ignore_and_continue,
                    open_stream=_Opener()))
    assert [s["__key__"] for s in out] == ["k0", "k1", "k2", "gk0", "gk1"]


@pytest.mark.parametrize(("kind", "dump", "read"), KINDS, ids=ids)
def test_garbage_and_non_map_records(tmp_path: Path, kind: str, dump: Dump, read: Any) -> None:
    garbage = b"\xc1" if kind == "msgpack" else b"\xff"
    name = "MessagePack" if kind == "msgpack" else "CBOR"
    with pytest.raises(ShardFormatError, match=f"not valid {name}"):
        list(read([{"url": "g", "stream": io.BytesIO(garbage + dump({"a": b"1"}))}]))
    data = dump({"__key__": "a"}) + dump([1, 2]) + dump({"__key__": "b"})
    with pytest.raises(ShardFormatError, match="record #1 is a list"):
        list(read([{"url": "n", "stream": io.BytesIO(data)}]))
    skipped = list(read([{"url": "n", "stream": io.BytesIO(data)}], ignore_and_continue))
    assert [s["__key__"] for s in skipped] == ["a", "b"]
    stopped = list(read([{"url": "n", "stream": io.BytesIO(data)}], ignore_and_stop))
    assert [s["__key__"] for s in stopped] == ["a"]


def test_sources_need_a_stream_or_an_opener() -> None:
    with pytest.raises(ConfigError, match="open_stream"):
        list(cbors_to_samples([{"url": "x.cbors"}]))
    with pytest.raises(ConfigError, match="'url'"):
        list(msgpacks_to_samples(["x.mp"]))  # type: ignore[list-item]


@pytest.mark.parametrize(("module", "extra", "read"),
                         [("cbor2", "cbor", cbors_to_samples),
                          ("msgpack", "msgpack", msgpacks_to_samples)])
def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, module: str,
                                         extra: str, read: Any) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingDependencyError) as info:
        list(read([{"url": "x", "stream": io.BytesIO(b"")}]))
    assert info.value.extra == extra


FIELDS = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda k: not k.startswith("__")),
    st.binary(max_size=64) | st.text(max_size=16) | st.integers(-(2**63), 2**63 - 1),
    max_size=5,
)


@settings(max_examples=50, deadline=None)
@given(records=st.lists(FIELDS, max_size=6), cut=st.integers(1, 40))
def test_any_records_round_trip_and_any_cut_is_caught(records: list[dict[str, Any]],
                                                      cut: int) -> None:
    for _, dump, read in KINDS:
        pieces = [dump(r) for r in records]
        data = b"".join(pieces)
        boundaries = {sum(map(len, pieces[:i])) for i in range(len(pieces) + 1)}
        out = list(read([{"url": "u", "stream": io.BytesIO(data)}]))
        assert [{k: v for k, v in s.items() if k not in ("__key__", "__url__")}
                for s in out] == records
        if len(data) - cut not in boundaries and cut < len(data):
            with pytest.raises(ShardFormatError):
                list(read([{"url": "u", "stream": io.BytesIO(data[:-cut])}]))
