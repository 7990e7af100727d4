"""The architecture's import rules, checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOWER_LAYERS = [
    "errors", "settings", "urls", "handlers",           # L0
    "openers", "router", "remote", "aiobody", "httpstore", "fsspecstore",
    "s3store", "gcsstore", "azurestore",
    "readahead", "prefetched", "locals3", "pipes",                              # L1
    "tario", "tarformat", "tarheader", "tarcompress",
    "pipeline", "filters", "batching", "keys", "mix", "shards",
    "autodecode", "typedecode", "imagedecode", "tenbin", "records",  # L2
]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_import_is_light() -> None:
    out = _run("import sys, wds_cloud; print(sorted(m for m in ('torch', 'fsspec', 'numpy') "
               "if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", LOWER_LAYERS)
def test_lower_layers_import_without_torch_or_fsspec(module: str) -> None:
    code = (
        "import sys\n"
        "for name in ('torch', 'fsspec', 's3fs', 'gcsfs', 'adlfs'): sys.modules[name] = None\n"
        f"import wds_cloud.{module}\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr


def test_all_exports_resolve() -> None:
    out = _run("import wds_cloud as w\nmissing=[n for n in w.__all__ if not hasattr(w, n)]\n"
               "print(missing)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_module_shadows_a_public_name() -> None:
    """Importing ``wds_cloud.X`` sets attribute ``X``: a module named like an export hides it."""
    import pkgutil

    import wds_cloud

    modules = {m.name for m in pkgutil.iter_modules(wds_cloud.__path__)}
    assert modules & set(wds_cloud.__all__) == set()
