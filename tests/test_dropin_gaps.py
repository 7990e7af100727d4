"""Drop-in gaps with webdataset 1.0.2: ``wds.utils.enforce_security``, one clean refusal
message, ``rewrite_url(url)``, ``SimpleShardList(seed=)``'s order, the ``utils``/
``extradatasets``/``compat`` module paths, and the sample caches ``Cached``/``LMDBCached``."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import webdataset
from shardgen import write_tar

import wds_cloud as wds
import wds_cloud.utils
from wds_cloud.errors import MissingDependencyError, UnsafeURLError

WEBDATASET_GOPEN = sys.modules["webdataset.gopen"]  # ``webdataset.gopen`` is the function


def _pth(value: Any) -> bytes:
    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


@pytest.fixture
def secure_flags(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool | None], None]:
    """Set ``enforce_security`` in both libraries (restored after the test)."""

    def set_flags(value: bool | None) -> None:
        monkeypatch.setattr(wds_cloud.utils, "enforce_security", value)
        monkeypatch.setattr(webdataset.utils, "enforce_security", bool(value))

    return set_flags


@pytest.fixture
def local_file(tmp_path: Path) -> str:
    path = tmp_path / "a.bin"
    path.write_bytes(b"payload")
    return str(path)


def _decode(lib: Any, field: str, data: bytes) -> Any:
    return lib.Decoder([])({"__key__": "k", field: data})[field]


def _read(lib: Any, url: str) -> bytes:
    with lib.gopen(url) as stream:
        data: bytes = stream.read()
    return data


# each case: what is tried, given the library and a local file; what the message must name
CASES: dict[str, tuple[Callable[[Any, str], Any], str]] = {
    "unpickle .pyd": (lambda lib, f: _decode(lib, "pyd", pickle.dumps(1)), "unpickling"),
    "unpickle .pickle": (lambda lib, f: _decode(lib, "pickle", pickle.dumps(2)), "unpickling"),
    "torch.load .pth": (lambda lib, f: _decode(lib, "pth", _pth(torch.ones(2))).tolist(),
                        "torch.load"),
    "local path": (lambda lib, f: _read(lib, f), "a local path"),
    "file: URL": (lambda lib, f: _read(lib, "file://" + f), "a file: URL"),
    "pipe: URL": (lambda lib, f: _read(lib, f"pipe:cat {f}"), "a pipe: URL"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_enforce_security_refuses_what_webdataset_refuses(
    case: str, local_file: str, secure_flags: Callable[[bool | None], None],
) -> None:
    attempt, what = CASES[case]
    secure_flags(True)
    with pytest.raises((ValueError, webdataset.DecodingError)) as theirs:
        attempt(webdataset, local_file)
    # webdataset's DecodingError is no ValueError: the refusal is its cause
    assert isinstance(theirs.value.__cause__ or theirs.value, ValueError)
    with pytest.raises(ValueError) as refused:
        attempt(wds, local_file)
    message = str(refused.value)
    assert what in message and "enforce_security" in message and "is True" in message
    secure_flags(False)
    assert attempt(wds, local_file) == attempt(webdataset, local_file)


def test_enforce_security_refuses_url_rewriting(
    monkeypatch: pytest.MonkeyPatch, local_file: str,
    secure_flags: Callable[[bool | None], None],
) -> None:
    monkeypatch.setenv("GOPEN_REWRITE", "s3://bkt/=http://mirror/")
    secure_flags(True)
    with pytest.raises(ValueError):
        WEBDATASET_GOPEN.rewrite_url("s3://bkt/a.tar")
    with pytest.raises(UnsafeURLError, match=r"refusing to rewrite 's3://bkt/a\.tar'.*GOPEN_REWRITE"):
        wds.rewrite_url("s3://bkt/a.tar")
    with pytest.raises(ValueError, match="refusing to rewrite"):
        wds.gopen("s3://bkt/a.tar")
    # webdataset refused every URL once GOPEN_REWRITE was set; no rule rewrites this one
    assert wds.rewrite_url("gs://other/a.tar") == "gs://other/a.tar"
    secure_flags(False)
    assert wds.rewrite_url("s3://bkt/a.tar") == WEBDATASET_GOPEN.rewrite_url("s3://bkt/a.tar")


def test_the_flag_is_read_when_used_not_when_built(
    tmp_path: Path, secure_flags: Callable[[bool | None], None],
) -> None:
    """A Decoder and a WebDataset built before the flag is set obey it (webdataset reads its
    flag at each call, and code sets it after building datasets)."""
    url = write_tar(tmp_path / "p.tar", [("k", {"pyd": pickle.dumps({"x": 1})})])
    decoder = wds.Decoder([])
    plain = wds.WebDataset(url, shardshuffle=False)
    decoded = wds.WebDataset(url, shardshuffle=False).decode()
    assert decoder({"__key__": "k", "pyd": pickle.dumps(3)})["pyd"] == 3
    secure_flags(True)
    with pytest.raises(wds.DecodingError, match="enforce_security"):
        decoder({"__key__": "k", "pyd": pickle.dumps(3)})
    with pytest.raises(ValueError, match="a local path"):
        next(iter(plain))
    secure_flags(None)
    assert next(iter(decoded))["pyd"] == {"x": 1}


def test_none_follows_wds_secure_and_false_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, local_file: str,
    secure_flags: Callable[[bool | None], None],
) -> None:
    monkeypatch.setenv("WDS_SECURE", "1")
    secure_flags(None)
    with pytest.raises(wds.DecodingError, match="WDS_SECURE"):
        _decode(wds, "pyd", pickle.dumps(1))
    with pytest.raises(UnsafeURLError, match=r"a pipe: URL.*WDS_SECURE"):
        _read(wds, f"pipe:cat {local_file}")
    assert _read(wds, local_file) == b"payload"  # local data keeps working under WDS_SECURE
    secure_flags(False)  # set by the user: wins over the environment
    assert _decode(wds, "pyd", pickle.dumps(1)) == 1
    assert _read(wds, f"pipe:cat {local_file}") == b"payload"


def test_the_flag_starts_as_none_without_reading_the_environment() -> None:
    code = ("import os; os.environ['WDS_SECURE'] = '1'\n"
            "import wds_cloud as wds\n"
            "print(wds.utils.enforce_security, wds.utils.refuses_code(False))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "False"]


def test_a_refused_field_is_named_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = write_tar(tmp_path / "p.tar", [("k1", {"pyd": pickle.dumps(1)})])
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(wds.DecodingError) as refused:
        next(iter(wds.WebDataset(url, shardshuffle=False).decode()))
    message = str(refused.value)
    assert message.startswith(f"cannot decode field 'pyd' of sample 'k1' from '{url}': "
                              "refusing unpickling")
    assert message.count("cannot decode") == 1 and "None" not in message
    assert refused.value.k == "pyd" and refused.value.key == "k1"
    with pytest.raises(wds.DecodingError) as direct:  # the decoder function on its own
        wds.autodecode.basichandlers(".pyd", pickle.dumps(1))
    assert str(direct.value).startswith("cannot decode: refusing unpickling")


# ---------------------------------------------------------------- rewrite_url(url)


@pytest.mark.parametrize("variable", ["GOPEN_REWRITE", "WDS_REWRITE"])
def test_rewrite_url_with_one_argument_uses_the_environment_rules(
    variable: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rules = "s3://bkt/=http://mirror/s3/;gs://=/shared/"
    monkeypatch.setenv(variable, rules)
    monkeypatch.setenv("GOPEN_REWRITE", rules)  # webdataset reads only its own name
    for url in ("s3://bkt/a.tar", "gs://b/x.tar", "http://other/y.tar"):
        assert wds.rewrite_url(url) == WEBDATASET_GOPEN.rewrite_url(url)
    assert wds.rewrite_url("gs://b/x.tar") == "/shared/b/x.tar"
    assert wds_cloud.router.rewrite_url is wds.rewrite_url
    assert wds.rewrite_url("gs://b/x.tar", settings=wds.Settings()) == "gs://b/x.tar"
    parsed = wds_cloud.urls.parse_rewrite_rules("gs://=/x/")
    assert wds.rewrite_url("gs://b/x.tar", parsed) == "/x/b/x.tar"


# ---------------------------------------------------------------- SimpleShardList(seed=)


def _urls(shards: Any) -> list[str]:
    return [d["url"] for d in shards]


@pytest.mark.parametrize("seed", [0, 1, 7, 2**40 + 3])
def test_a_seeded_shard_list_starts_in_webdatasets_order(seed: int) -> None:
    """Users reproduce published runs when they switch: every iteration is webdataset's
    ``random.Random(seed).shuffle``, also after the seed is changed; only ``set_epoch``
    (wds_cloud's, which WebLoader calls) gives later epochs new orders."""
    spec = "s-{000..099}.tar"
    ours = wds.SimpleShardList(spec, seed=seed)
    theirs = webdataset.SimpleShardList(spec, seed=seed)
    first = _urls(ours)
    assert first == _urls(theirs)
    assert _urls(ours) == first
    ours.seed = theirs.seed = seed + 1
    assert _urls(ours) == _urls(theirs) != first
    ours.seed = seed
    after_set_epoch = wds.SimpleShardList(spec, seed=seed)
    after_set_epoch.set_epoch(0)
    assert _urls(after_set_epoch) == first
    after_set_epoch.set_epoch(1)
    assert _urls(after_set_epoch) != first


# ---------------------------------------------------------------- module paths


def test_webdataset_module_paths_utils_extradatasets_compat() -> None:
    out = subprocess.run([sys.executable, "-c", (
        "import sys, wds_cloud as wds\n"
        "from wds_cloud.utils import enforce_security\n"
        "from wds_cloud.extradatasets import MockDataset, with_epoch, with_length\n"
        "from wds_cloud.compat import WebDataset, WebLoader, FluidInterface\n"
        "import wds_cloud.extradatasets as e\n"
        "assert e is sys.modules['wds_cloud.extradatasets'] is wds.extradatasets\n"
        "assert wds.utils is sys.modules['wds_cloud.utils']\n"
        "assert (MockDataset, with_epoch, with_length) == "
        "(wds.MockDataset, wds.with_epoch, wds.with_length)\n"
        "assert (WebDataset, WebLoader) == (wds.WebDataset, wds.WebLoader)\n"
        "print(enforce_security, len(list(with_length(MockDataset(1, 3), 3))))\n")],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "3"]


# ---------------------------------------------------------------- Cached, LMDBCached


class Counted(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """A source that counts how often it is read."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        self.samples = samples
        self.iterations = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.iterations += 1  # on the first next(): a pipeline calls iter() each epoch
        for sample in self.samples:
            yield dict(sample)


SAMPLES = [{"__key__": f"k{9 - i}", "x": i, "arr": [i] * 3} for i in range(10)]


def test_cached_replays_the_first_epoch_like_webdataset() -> None:
    ours, theirs = Counted(SAMPLES), Counted(SAMPLES)
    a = wds.DataPipeline(ours, wds.Cached())
    b = webdataset.DataPipeline(theirs, webdataset.Cached())
    assert [list(a) for _ in range(3)] == [list(b) for _ in range(3)] == [SAMPLES] * 3
    assert ours.iterations == theirs.iterations == 1


def test_lmdb_cached_replays_in_order_across_runs(tmp_path: Path) -> None:
    db = str(tmp_path / "cache.lmdb")
    source = Counted([*SAMPLES, {"__key__": "k0", "x": "same key, other shard"}])
    stage = wds.LMDBCached(db, map_size=2**26)
    epochs = [list(wds.DataPipeline(source, stage)) for _ in range(3)]
    assert epochs == [source.samples] * 3  # in the first epoch's order, none lost
    assert source.iterations == 1
    later_run = pickle.loads(pickle.dumps(wds.LMDBCached(db, map_size=2**26)))
    assert list(wds.DataPipeline(Counted([]), later_run)) == source.samples


def test_lmdb_cached_reads_what_webdataset_wrote(tmp_path: Path) -> None:
    db = str(tmp_path / "wds.lmdb")
    theirs = webdataset.LMDBCached(db, map_size=2**26)
    written = list(webdataset.DataPipeline(Counted(SAMPLES), theirs))
    theirs.db.close()
    replayed = list(wds.DataPipeline(Counted([]), wds.LMDBCached(db, map_size=2**26)))
    by_key = sorted(written, key=lambda s: s["__key__"])  # webdataset's keys: __key__
    assert replayed == by_key


def test_lmdb_cached_records_again_after_an_interrupted_epoch(tmp_path: Path) -> None:
    source = Counted(SAMPLES)
    stage = wds.LMDBCached(str(tmp_path / "c.lmdb"), map_size=2**26, chunksize=3)
    it = iter(wds.DataPipeline(source, stage))
    assert [next(it) for _ in range(5)] == SAMPLES[:5]
    del it
    assert not stage.is_complete()
    assert list(wds.DataPipeline(source, stage)) == SAMPLES
    assert list(wds.DataPipeline(source, stage)) == SAMPLES
    assert source.iterations == 2


def test_lmdb_cached_without_lmdb_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(MissingDependencyError, match=r"'lmdb'.*wds-cloud\[lmdb\]"):
        wds.LMDBCached(str(tmp_path / "c.lmdb"))
