"""Every public name of webdataset 1.0.2 (``dir(webdataset)``) exists in wds_cloud, except the
few left out on purpose, each with its reason: ``import wds_cloud as wds`` must not fail on a
name that worked before."""

from __future__ import annotations

import importlib
import inspect

import pytest
import webdataset

import wds_cloud

#: name -> why wds_cloud does not have it
DELIBERATE_OMISSIONS: dict[str, str] = {
}

PUBLIC = sorted(name for name in dir(webdataset) if not name.startswith("_"))


def test_webdataset_version_is_the_one_compared() -> None:
    from importlib.metadata import version

    assert version("webdataset") == "1.0.2"
    assert set(DELIBERATE_OMISSIONS) <= set(PUBLIC)  # stale entries are removed


def test_every_public_name_of_webdataset_exists() -> None:
    missing = [name for name in PUBLIC
               if name not in DELIBERATE_OMISSIONS and not hasattr(wds_cloud, name)]
    assert missing == []


@pytest.mark.parametrize("name", ["LRUCleanup", "pipe_cleaner", "LMDBCached", "utils",
                                  "extradatasets", "compat"])
def test_names_added_for_the_drop_in(name: str) -> None:
    assert hasattr(wds_cloud, name)


def test_webdataset_module_paths_import() -> None:
    """``webdataset.X`` modules (``webdataset.utils``, ``.extradatasets``, ...) are importable
    as ``wds_cloud.X``; ``gopen`` is the function in both (its module is shadowed)."""
    modules = [name for name in PUBLIC if inspect.ismodule(getattr(webdataset, name))]
    assert "utils" in modules and "gopen" not in modules
    failed = []
    for name in modules:
        try:
            importlib.import_module(f"wds_cloud.{name}")
        except ImportError as exc:
            failed.append(f"{name}: {exc}")
    assert failed == []
