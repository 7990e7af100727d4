"""pytest plugin (``-p webdataset_alias``) that runs webdataset 1.0.2's own tests on wds_cloud.

Loaded only by the pytest subprocess that ``test_webdataset_suite.py`` starts, before any test
module is imported, it makes ``import webdataset`` (and ``webdataset.utils``,
``webdataset.shardlists``, ...) give wds_cloud's modules: the very module objects, so a test
that sets ``webdataset.utils.enforce_security`` sets wds_cloud's flag. The alias lives in that
process only; the real webdataset stays what other tests of ours import.

A submodule of webdataset that wds_cloud lacks fails to import (ModuleNotFoundError naming
it) instead of being loaded a second time from wds_cloud's directory.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
from excluded import EXCLUDED

#: webdataset 1.0.2's submodules (listed from the installed package, which is not imported)
_spec = importlib.util.find_spec("webdataset")
assert _spec is not None and _spec.submodule_search_locations is not None
SUBMODULES = sorted(m.name for m in pkgutil.iter_modules(_spec.submodule_search_locations))


class _MissingSubmodule(importlib.abc.MetaPathFinder):
    """Refuses ``webdataset.X`` when wds_cloud has no ``X`` (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith("webdataset."):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: wds_cloud has no module "
                f"{'wds_cloud' + fullname[len('webdataset'):]!r}", name=fullname)
        return None


def install() -> None:
    import wds_cloud

    sys.modules["webdataset"] = wds_cloud
    for name in SUBMODULES:
        try:
            module = importlib.import_module(f"wds_cloud.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"wds_cloud.{name}":
                raise
            continue
        sys.modules[f"webdataset.{name}"] = module
    sys.meta_path.insert(0, _MissingSubmodule())


install()


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if _relative(collection_path, config.rootpath) in EXCLUDED:
        config.stash[_USED].add(_relative(collection_path, config.rootpath))
        return True
    return None


_USED = pytest.StashKey[set[str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_USED] = set()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        (dropped if item.nodeid in EXCLUDED else kept).append(item)
    config.stash[_USED].update(item.nodeid for item in dropped)
    collected = {item.nodeid.split("::")[0] for item in items}
    stale = sorted(key for key in set(EXCLUDED) - config.stash[_USED]
                   if key.split("::")[0] in collected)  # a file's import error hides its tests
    if stale:
        raise pytest.UsageError(f"excluded.py names tests that do not exist: {stale}")
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
