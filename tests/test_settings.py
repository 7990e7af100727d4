from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from shardgen import write_tar

import wds_cloud as wds
from wds_cloud.errors import ConfigError
from wds_cloud.settings import Settings, parse_size


def test_defaults_and_trust_env() -> None:
    env = {"WDS_CACHE": "/c", "RANK": "3"}
    assert Settings.from_env(env, trust_env=False) == Settings()
    s = Settings.from_env(env)
    assert s.cache_dir == "/c" and s.rank == 3


def test_rewrite_variable_names() -> None:
    s = Settings.from_env({"GOPEN_REWRITE": "a=b"})
    assert (s.rewrite, s.rewrite_var) == ("a=b", "GOPEN_REWRITE")
    s = Settings.from_env({"GOPEN_REWRITE": "a=b", "WDS_REWRITE": "c=d"})
    assert (s.rewrite, s.rewrite_var) == ("c=d", "WDS_REWRITE")


def test_gopen_verbose_reads_as_webdataset_reads_it() -> None:
    """webdataset: ``int(os.environ.get("GOPEN_VERBOSE", 0))``, non-zero is on."""
    for raw, on in (("1", True), ("2", True), ("-1", True), ("0", False), ("", False),
                    (" 1 ", True), ("true", True), ("off", False)):
        assert Settings.from_env({"GOPEN_VERBOSE": raw}).gopen_verbose is on, raw
    assert Settings.from_env({}).gopen_verbose is False
    with pytest.raises(ConfigError, match="GOPEN_VERBOSE"):
        Settings.from_env({"GOPEN_VERBOSE": "loud"})


def test_sizes() -> None:
    assert parse_size("1e9") == 10**9
    assert parse_size("50GB") == 50 * 10**9
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1.5k") == 1500
    assert parse_size(123) == 123
    with pytest.raises(ConfigError, match="WDS_CACHE_SIZE"):
        Settings.from_env({"WDS_CACHE_SIZE": "lots"})


def test_home_and_vars_expand_in_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/tester")
    assert Settings.from_env({"WDS_CACHE": "~/cache"}).cache_dir == "/home/tester/cache"


def test_ais_and_flags() -> None:
    s = Settings.from_env({"AIS_ENDPOINT": "http://a:1", "USE_AIS_FOR": "gs:s3", "WDS_SECURE": "1"})
    assert s.ais_endpoint == "http://a:1" and s.use_ais_for == ("gs", "s3") and s.secure
    with pytest.raises(ConfigError, match="WDS_VERBOSE_CACHE"):
        Settings.from_env({"WDS_VERBOSE_CACHE": "maybe"})
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        Settings.from_env({"WORLD_SIZE": "two"})


def test_url_vars() -> None:
    assert Settings.from_env({"WDS_ROOT": "/data", "OTHER": "x"}).url_vars == {"ROOT": "/data"}


def test_seed_and_weights_only_are_settings() -> None:
    s = Settings.from_env({"WDS_SEED": " 42 ", "WDS_PYTORCH_WEIGHTS_ONLY": "1"})
    assert (s.seed, s.pytorch_weights_only) == (42, True)
    assert (Settings().seed, Settings().pytorch_weights_only) == (None, False)
    with pytest.raises(ConfigError, match="WDS_SEED"):
        Settings.from_env({"WDS_SEED": "abc"})
    with pytest.raises(ConfigError, match="WDS_PYTORCH_WEIGHTS_ONLY"):
        Settings.from_env({"WDS_PYTORCH_WEIGHTS_ONLY": "maybe"})


class _CountedReads:
    """Wraps ``Settings.from_env`` and counts its calls (inherited by forked workers)."""

    calls = 0

    def __call__(self, *args: Any, **kw: Any) -> Settings:
        _CountedReads.calls += 1
        return _ORIGINAL_FROM_ENV(*args, **kw)


_ORIGINAL_FROM_ENV = Settings.from_env


def _calls_so_far(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "reads": _CountedReads.calls}


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> type[_CountedReads]:
    monkeypatch.setattr(Settings, "from_env", _CountedReads())
    _CountedReads.calls = 0
    return _CountedReads


def _pickled_shards(tmp_path: Path, shards: int = 12, per_shard: int = 5) -> str:
    for s in range(shards):
        write_tar(tmp_path / f"p-{s:03d}.tar", [
            (f"s{s:03d}_{i:03d}", {"pyd": pickle.dumps({"shard": s, "i": i}),
                                   "cls": str(i).encode()})
            for i in range(per_shard)])
    return str(tmp_path / f"p-{{000..{shards - 1:03d}}}.tar")


def test_the_environment_is_read_once_per_dataset(
    tmp_path: Path, counted_reads: type[_CountedReads], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dataset is the composition root: building and iterating it, two epochs of many
    shards with pickled members and a shard shuffle, reads the environment once."""
    monkeypatch.setenv("WDS_SECURE", "0")
    ds = wds.WebDataset(_pickled_shards(tmp_path), shardshuffle=4, seed=3).decode()
    assert counted_reads.calls == 1
    for _ in range(2):
        samples = list(ds)
        assert len(samples) == 60 and isinstance(samples[0]["pyd"], dict)
    assert counted_reads.calls == 1


def test_dataloader_workers_do_not_read_the_environment_again(
    tmp_path: Path, counted_reads: type[_CountedReads],
) -> None:
    import torch
    ds = (wds.WebDataset(_pickled_shards(tmp_path), shardshuffle=False,
                         nodesplitter=wds.split_by_node)
          .decode().map(_calls_so_far))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    reads = [sample["reads"] for sample in loader]
    assert len(reads) == 60
    assert set(reads) == {1}  # the parent's one read, inherited; none in the workers


def test_the_secure_setting_of_the_dataset_reaches_its_decoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WDS_SECURE", "1")
    ds = wds.WebDataset(_pickled_shards(tmp_path, shards=1), shardshuffle=False).decode()
    monkeypatch.delenv("WDS_SECURE")  # read when the dataset was built, not later
    with pytest.raises(wds.DecodingError, match="secure mode"):
        next(iter(ds))


def test_a_shard_writer_reads_the_environment_once(
    tmp_path: Path, counted_reads: type[_CountedReads],
) -> None:
    with wds.ShardWriter(str(tmp_path / "w-%03d.tar"), maxcount=2) as sink:
        for i in range(10):
            sink.write({"__key__": f"k{i}", "txt": "x"})
    assert len(list(tmp_path.glob("w-*.tar"))) == 5
    assert counted_reads.calls == 1
