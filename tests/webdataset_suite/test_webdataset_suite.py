"""webdataset 1.0.2's own test suite (``upstream/tests/``, vendored unchanged) passes on wds_cloud.

It runs in a pytest subprocess whose ``import webdataset`` gives wds_cloud
(``webdataset_alias.py``), from a scratch directory holding the ``testdata/`` the tests read by
relative paths: webdataset's own files, and a stand-in for the one shard it did not publish
with the code (``standin.py``). The tests left out, and why, are listed in ``excluded.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import standin

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream"
REPO = HERE.parents[1]
SELECTED = 140

#: pytest's own variables that would change how the inner run is configured
_PYTEST_VARS = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PYTEST_VARS}
    paths = [str(HERE), str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


@pytest.fixture(scope="module")
def rundir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("webdataset_suite")
    data = root / "testdata"
    data.mkdir()
    for name in ("compressed.tar", "tendata.tar"):
        (data / name).symlink_to(UPSTREAM / "testdata" / name)
    standin.build(data / "imagenet-000000.tgz")
    return root


@pytest.mark.slow
def test_webdataset_own_suite_passes(rundir: Path) -> None:
    report = rundir / "report.xml"
    cmd = [
        sys.executable, "-m", "pytest", str(UPSTREAM / "tests"),
        "-c", os.devnull, "--rootdir", str(UPSTREAM), "--confcutdir", str(UPSTREAM),
        "-p", "webdataset_alias", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--basetemp", str(rundir / "tmp"), "--junitxml", str(report),
        "-q", "-ra", "--timeout", "120", "-W", "ignore::DeprecationWarning",
        "--continue-on-collection-errors",  # one file's import error hides no other failure
    ]
    run = subprocess.run(cmd, cwd=rundir, env=_env(), capture_output=True, text=True,
                         timeout=600, check=False)
    output = run.stdout[-20000:] + run.stderr[-5000:]
    assert report.exists(), output
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if any(child.tag in ("failure", "error", "skipped") for child in case)]
    assert run.returncode == 0 and not failed, "\n".join([*failed, output])
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, output)
    # 192 tests, less test_filters.py's 31 and the 21 others excluded.py names: nothing
    # silently left out of the selection (a file that fails to import counts as one)
    assert counts["tests"] == SELECTED, (counts, output)
