"""The architecture's import rules and the public face, checked in fresh interpreters."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import wds_cloud

L0 = ["errors", "settings", "urls", "handlers", "utils"]
#: rooms below the stores: no torch, no fsspec, no remote store, no cache
L2_ROOMS = ["io", "tar", "codecs", "pipeline", "spec"]
BLOCKED = ("torch", "fsspec", "s3fs", "gcsfs", "adlfs", "aiohttp", "botocore")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def _modules_of(room: str) -> list[str]:
    package = importlib.import_module(f"wds_cloud.{room}")
    return [f"wds_cloud.{room}"] + [f"wds_cloud.{room}.{m.name}"
                                    for m in pkgutil.iter_modules(package.__path__)]


def test_import_is_light() -> None:
    out = _run("import sys, wds_cloud; print(sorted(m for m in ('torch', 'fsspec', 'numpy') "
               "if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("room", L0 + L2_ROOMS + ["router"])
def test_lower_layers_import_without_torch_fsspec_stores_or_cache(room: str) -> None:
    modules = _modules_of(room) if room in L2_ROOMS else [f"wds_cloud.{room}"]
    code = (
        "import importlib, sys\n"
        f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
        f"for module in {modules!r}: importlib.import_module(module)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('wds_cloud.stores', "
        "'wds_cloud.cache', 'wds_cloud.pytorch', 'wds_cloud.dataset'))))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{room} pulls in {out.stdout.strip()}"


def test_the_torch_layer_and_the_commands_import_without_torch() -> None:
    """torch is imported by using a WebLoader or a torch codec, never by importing a module
    (tests/test_no_torch.py runs the datasets and commands with torch blocked)."""
    from wds_cloud.cli.main import COMMANDS

    modules = ["wds_cloud.pytorch", "wds_cloud.torch_datasets", "wds_cloud.dataset",
               "wds_cloud.specdataset", "wds_cloud.compat", "wds_cloud.shardlists",
               *(f"wds_cloud.cli.{c}" for c in COMMANDS)]
    code = (
        "import importlib, sys\n"
        "sys.modules['torch'] = None\n"
        f"for module in {modules!r}: importlib.import_module(module)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch')))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['torch']"  # the block itself, nothing else


def test_all_is_the_lazy_export_table() -> None:
    assert wds_cloud.__all__ == sorted(wds_cloud._EXPORTS)
    out = _run("import wds_cloud as w\nmissing=[n for n in w.__all__ if not hasattr(w, n)]\n"
               "print(missing)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_exports_come_from_the_module_the_table_names() -> None:
    """httpx's ``test_exported_members``: each public name is defined where the table says
    (or re-exported there from inside the package), and each room's ``__all__`` resolves."""
    for name, module in wds_cloud._EXPORTS.items():
        value = getattr(wds_cloud, name)
        assert getattr(importlib.import_module(f"wds_cloud.{module}"), name) is value
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue  # curried stages and constants
        defined_in = value.__module__
        assert defined_in.startswith("wds_cloud"), (name, defined_in)
    for room in [*L2_ROOMS, "stores", "cache", "cli", "parallel", "testing"]:
        package = importlib.import_module(f"wds_cloud.{room}")
        assert [n for n in package.__all__ if not hasattr(package, n)] == [], room


def test_one_name_one_definition() -> None:
    """A public name is defined once in the package; the rooms' helpers have names of their own."""
    definitions: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(wds_cloud.__path__, "wds_cloud."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for attr, value in vars(module).items():
            if getattr(value, "__module__", None) == info.name and attr in wds_cloud.__all__ \
                    and getattr(value, "__name__", attr) == attr:
                definitions.setdefault(attr, []).append(info.name)
    twice = {name: where for name, where in definitions.items() if len(where) > 1}
    assert twice == {}


@pytest.mark.parametrize("alias", ["autodecode", "filters", "shardlists", "tariterators", "writer",
                                   "mix", "tenbin", "handlers", "pipeline", "cache", "urls",
                                   "utils", "extradatasets", "compat", "multi", "typecheck"])
def test_webdataset_module_paths_are_the_real_modules(alias: str) -> None:
    out = _run(
        "import importlib, sys, wds_cloud\n"
        f"m = importlib.import_module('wds_cloud.{alias}')\n"
        f"assert sys.modules['wds_cloud.{alias}'] is m is getattr(wds_cloud, '{alias}')\n"
        "print(m.__name__)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("wds_cloud.")


def test_patching_a_module_flag_reaches_its_reader() -> None:
    import wds_cloud.autodecode as ad
    from wds_cloud.codecs import decoder

    assert ad is decoder
    import wds_cloud.pipeline

    assert wds_cloud.pipeline.DataPipeline is wds_cloud.DataPipeline


def test_no_module_shadows_a_public_name() -> None:
    """Importing ``wds_cloud.X`` sets attribute ``X``: a module named like an export hides it.
    The one exception is webdataset's: module ``gopen`` and function ``gopen``, where the
    package keeps the function (``wds_cloud._Package``; tests/test_webdataset_modules.py)."""
    modules = {m.name for m in pkgutil.iter_modules(wds_cloud.__path__)}
    assert modules & set(wds_cloud.__all__) == set(wds_cloud._SHADOWED_MODULES) == {"gopen"}
    out = _run("import wds_cloud.gopen, inspect, wds_cloud\n"
               "print(inspect.isfunction(wds_cloud.gopen))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
