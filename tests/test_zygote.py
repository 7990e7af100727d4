"""The zygote (tests/zygote.py) gives the tests' children what ``python ARGS`` would: these
checks run each case in a child of it and, where the answer is the interpreter's, in a fresh
``python`` too, and compare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zygote import Zygote

SHOW = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "env": os.environ.get("ZYGOTE_TEST"), "name": __name__,
                  "wds_cloud": "wds_cloud" in sys.modules, "stdin": sys.stdin.read()}))
"""


def _both(zygote: Zygote, args: list[str], **kwargs: object) -> list[subprocess.CompletedProcess]:
    return [run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                **kwargs)  # type: ignore[operator]
            for run in (zygote.run, subprocess.run)]


@pytest.mark.parametrize("how", ["-c", "script", "-m"])
def test_argv_path_directory_environment_and_streams_are_pythons(
        zygote: Zygote, tmp_path: Path, how: str) -> None:
    (tmp_path / "show.py").write_text(SHOW)
    args = {"-c": ["-c", SHOW, "a", "b"], "script": [str(tmp_path / "show.py"), "a", "b"],
            "-m": ["-m", "show", "a", "b"]}[how]
    env = {**os.environ, "ZYGOTE_TEST": "yes"}
    ours, theirs = _both(zygote, args, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert ours.returncode == theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)
    assert json.loads(ours.stdout)["env"] == "yes"


def test_exit_codes_exceptions_and_signals_are_pythons(zygote: Zygote) -> None:
    for code, want in [("import sys; sys.exit(3)", 3), ("raise ValueError('boom')", 1),
                       ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
                        -signal.SIGTERM)]:
        ours, theirs = _both(zygote, ["-c", code])
        assert ours.returncode == theirs.returncode == want, (code, ours.stderr)
        assert ours.stderr.splitlines()[-1:] == theirs.stderr.splitlines()[-1:]


def test_atexit_and_non_daemon_threads_end_the_process_as_pythons_do(zygote: Zygote) -> None:
    code = ("import atexit, threading, time\n"
            "atexit.register(lambda: print('atexit', flush=True))\n"
            "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n")
    ours, theirs = _both(zygote, ["-c", code])
    assert ours.stdout == theirs.stdout == "thread\natexit\n"


def test_a_timeout_kills_the_child_and_its_children(zygote: Zygote, tmp_path: Path) -> None:
    mark = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            f"p = subprocess.Popen(['sleep', '60']); open({str(mark)!r}, 'w').write(str(p.pid))\n"
            "print('started', flush=True); time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        zygote.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3)
    assert caught.value.stdout == "started\n"
    grandchild = int(mark.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{grandchild}").exists():
        if Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{grandchild}").exists() or \
        Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z"


def test_what_a_fork_cannot_give_runs_in_a_fresh_interpreter(zygote: Zygote) -> None:
    code = "import sys; print(sys.flags.optimize, sys.path[1] == '/zygote-test')"
    env = {**os.environ, "PYTHONPATH": "/zygote-test"}
    assert not zygote.forks([sys.executable, "-c", code], env)
    assert not zygote.forks([sys.executable, "-O", "-c", code], dict(os.environ))
    assert zygote.forks([sys.executable, "-u", "-c", code], dict(os.environ))
    out = zygote.run([sys.executable, "-O", "-c", code], env=env, capture_output=True,
                     text=True)
    assert out.stdout == "1 True\n", out.stderr


def test_a_launcher_child_ends_as_its_rank_and_takes_the_launchers_signals(
        zygote: Zygote, tmp_path: Path) -> None:
    """``zygote.python()`` (what torchrun starts with ``--no-python``): the exit code or the
    signal of the child, SIGTERM passed on to it, and the child killed with its client."""
    ended = subprocess.run([*zygote.python(), "-u", "-c", "import sys; sys.exit(7)"])
    assert ended.returncode == 7
    killed = subprocess.run([*zygote.python(), "-c",
                             "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.returncode == -signal.SIGKILL
    mark = tmp_path / "pid"
    code = (f"import os, time; open({str(mark)!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n")
    for sig, child_gone_by in [(signal.SIGTERM, "signal"), (signal.SIGKILL, "hang-up")]:
        mark.unlink(missing_ok=True)
        client = subprocess.Popen([*zygote.python(), "-c", code])
        deadline = time.monotonic() + 30
        while not mark.exists() or not mark.read_text():
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.02)
        child = int(mark.read_text())
        client.send_signal(sig)
        assert client.wait(30) == -sig, child_gone_by
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists(), f"the child outlived its client ({sig})"
