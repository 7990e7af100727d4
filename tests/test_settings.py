from __future__ import annotations

import pytest

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
