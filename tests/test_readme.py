"""Every code block of README.md runs, in order, as a reader runs them.

The blocks run one after the other in a fresh directory that looks like a clone (``config/``,
``docker/`` and ``.ci/`` linked in), with the environment each ``bash`` block leaves behind
(``export``, ``cd``) carried to the next, and with nothing of the caller's ``WDS_*`` settings:

- ``bash`` blocks run with ``bash -euo pipefail``; ``python`` blocks with this interpreter,
  as ``python -c`` runs them, in a process forked from a zygote that has imported the
  heavy third-party modules (torch, the cloud SDKs) once, not wds_cloud (tests/zygote.py);
  a block whose first line is ``# NAME.py`` or ``# NAME.yaml`` is written to ``NAME`` (and a
  ``.yaml`` one is loaded as a dataset spec), not run: later blocks run it.
- The README's servers are the ones its text names, on the ports of ``docker/compose.yaml``:
  the S3 server of ``wds-cloud serve-s3`` (port 9000, started by the README itself), fake-gcs
  (4443), Azurite (10000) and AIStore (51080), for which the test starts the test suite's own
  servers (with buckets ``shards``, as compose's set-up does). Each port is replaced by the
  free port the server got, in the block's text; nothing else is changed.
- An HTML comment on the line before a block says how it runs instead:
  ``<!-- readme-test: background -->`` starts it in the background and waits for its port;
  ``<!-- readme-test: ci -->`` (the two commands at the top) checks that ``.ci/run`` runs
  each of its lines as written (CI runs them on a fresh machine);
  ``<!-- readme-test: compose -->`` (a Docker engine is not available) validates
  ``docker/compose.yaml`` with ``docker-compose config`` and the Dockerfile with hadolint.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from zygote import NETWORK, Zygote

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*-->\s*$")
FILE_LINE = re.compile(r"^#\s*([\w./-]+\.(?:py|yaml|yml))\s*$")
#: the README's ports (docker/compose.yaml's) -> the server the test starts
PORTS = {"s3": 9000, "gcs": 4443, "azure": 10000, "ais": 51080}
BLOCK_TIMEOUT = 240
#: ``torchrun ARGS`` in a child of the zygote, its ranks too: python ARGV -> zygote.python()
TORCHRUN = """\
import sys
from torch.distributed.run import get_args_parser, main
argv = sys.argv[1:]
args = get_args_parser().parse_args(argv)
if not (args.no_python or args.module):
    at = len(argv) - len(args.training_script_args) - 1
    argv[at:at] = ["--no-python", *{python!r}, "-u"]
sys.exit(main(argv))
"""


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int
    directive: str | None

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.lang or 'text'} block)"


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text`` with their language, line and directive."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directive = DIRECTIVE.search(before)
        blocks.append(Block(match.group(1), match.group(2), text.count("\n", 0, match.start())
                            + 1, directive.group(1) if directive else None))
    return blocks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, what: Block, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"{what}: nothing listens on port {port} after {timeout} s")


class Reader:
    """Runs blocks as a reader would, in ``workdir``, carrying the environment along."""

    def __init__(self, workdir: Path, env: dict[str, str], ports: dict[int, int],
                 zygote: Zygote) -> None:
        self.cwd = workdir
        self.env = env
        self.ports = ports
        self.background: list[subprocess.Popen[bytes]] = []
        self.zygotes: dict[str, Zygote] = {"torch": zygote}
        self.logs = workdir.parent / "logs"
        self.logs.mkdir(exist_ok=True)
        self._torchrun(workdir.parent / "bin", zygote)

    def _torchrun(self, bin: Path, zygote: Zygote) -> None:
        """``torchrun`` on the ``PATH``, ahead of the virtual environment's: the same
        launcher and arguments, run in children of ``zygote`` (the module's docstring)."""
        bin.mkdir(exist_ok=True)
        code = TORCHRUN.format(python=zygote.python())
        script = bin / "torchrun"
        script.write_text("#!/bin/sh\nexec " + shlex.join([*zygote.python(), "-c", code])
                          + ' "$@"\n')
        script.chmod(0o755)
        self.env["PATH"] = f"{bin}{os.pathsep}{self.env['PATH']}"

    def text(self, block: Block) -> str:
        text = block.text
        for mine, theirs in self.ports.items():
            text = re.sub(rf"(?<![\d.]){mine}(?!\d)", str(theirs), text)
        return text

    def run(self, block: Block) -> None:
        text = self.text(block)
        if block.directive == "background":
            self._background(block, text)
            return
        first = text.lstrip().split("\n", 1)[0]
        named = FILE_LINE.match(first)
        if named:
            path = self.cwd / named.group(1)
            path.write_text(text)
            if path.suffix in (".yaml", ".yml"):
                from wds_cloud.spec import DatasetSpec

                DatasetSpec.from_yaml(path, environ=self.env)
            return
        if block.lang == "bash":
            self._bash(block, text)
        elif block.lang == "python":
            self._python(block, text)
        elif block.lang == "yaml":
            yaml.safe_load(text)
        else:
            raise AssertionError(f"{block}: no way to run a {block.lang!r} block; give it a "
                                 "language (bash, python, yaml) or a readme-test directive")

    def _call(self, block: Block, argv: list[str]) -> None:
        log = self.logs / f"line{block.line}.log"
        with log.open("wb") as out:
            done = subprocess.run(argv, cwd=self.cwd, env=self.env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT,
                                  start_new_session=True)
        self._check(block, done.returncode, log)

    def _check(self, block: Block, returncode: int, log: Path) -> None:
        output = log.read_text(errors="replace")
        assert returncode == 0, f"{block} failed (exit {returncode}):\n{output[-4000:]}"
        assert "Traceback" not in output, f"{block} printed a traceback:\n{output[-4000:]}"

    def _python(self, block: Block, text: str) -> None:
        """Runs ``python -c text`` in a child forked from a zygote that has imported the
        third-party modules a block that uses torch imports (~2.5 s of CPU a process); a block
        that names neither torch nor WebLoader gets a zygote without torch and numpy, whose
        presence wds_cloud notices (``sys.modules``)."""
        kind = "torch" if re.search(r"\btorch\b|WebLoader", text) else "plain"
        if kind not in self.zygotes:
            self.zygotes[kind] = Zygote(self.logs / f"{kind}.ready", NETWORK, env=self.env)
        log = self.logs / f"line{block.line}.log"
        with log.open("wb") as out:
            done = self.zygotes[kind].run([sys.executable, "-c", text], env=self.env,
                                          cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
        self._check(block, done.returncode, log)

    def _bash(self, block: Block, text: str) -> None:
        state = self.logs / "state"
        script = (f"{text}\n__status=$?\npwd > {state}.cwd\nenv -0 > {state}.env\n"
                  "exit $__status\n")
        self._call(block, ["bash", "-euo", "pipefail", "-c", script])
        self.cwd = Path((state.with_suffix(".cwd")).read_text().strip())
        pairs = state.with_suffix(".env").read_bytes().split(b"\0")
        self.env = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)

    def _background(self, block: Block, text: str) -> None:
        log = (self.logs / f"line{block.line}.log").open("wb")
        proc = subprocess.Popen(["bash", "-c", text], cwd=self.cwd, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.background.append(proc)
        port = next(int(p) for p in re.findall(r"--port (\d+)", text))
        _wait_port(port, block)

    def stop(self) -> None:
        if "plain" in self.zygotes:
            self.zygotes["plain"].stop()
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


def _clone_like(workdir: Path) -> None:
    workdir.mkdir()
    for name in ("config", "docker", ".ci"):
        if (ROOT / name).exists():
            (workdir / name).symlink_to(ROOT / name)


def _environment(venv_bin: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WDS_", "GOPEN_", "AIS_", "USE_AIS", "AWS_", "AZURE_",
                                "STORAGE_EMULATOR", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def reader(tmp_path: Path, gcs_server: Any, azure_server: Any, ais_server: Any,
           zygote: Zygote) -> Iterator[Reader]:
    from urllib.parse import urlparse

    gcs_server.new_store("shards")
    azure_server.new_store("shards")
    ports = {PORTS["s3"]: _free_port(),
             PORTS["gcs"]: urlparse(gcs_server.endpoint_url).port,
             PORTS["azure"]: urlparse(azure_server.endpoint_url).port,
             PORTS["ais"]: urlparse(ais_server.endpoint).port}
    _clone_like(tmp_path / "clone")
    env = _environment(Path(sys.executable).parent)
    env["HOME"] = str(tmp_path / "home")  # ~/.cache/... of the README stays in here
    runner = Reader(tmp_path / "clone", env, ports, zygote)
    try:
        yield runner
    finally:
        runner.stop()


def _check_ci(block: Block) -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    for line in block.text.splitlines():
        command = line.split("#", 1)[0].strip()
        if command:
            assert command in ci, f"{block}: .ci/run does not run {command!r}"


def _check_compose(block: Block) -> None:
    compose = shutil.which("docker-compose")
    assert compose, f"{block}: docker-compose is missing; run bash .ci/setup"
    done = subprocess.run([compose, "-f", str(ROOT / "docker" / "compose.yaml"), "config",
                           "-q"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([lint, str(ROOT / "docker" / "Dockerfile")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_every_readme_block_runs_in_order(reader: Reader) -> None:
    blocks = readme_blocks(README.read_text())
    assert len(blocks) > 10
    for block in blocks:
        if block.directive == "ci":
            _check_ci(block)
        elif block.directive == "compose":
            _check_compose(block)
        else:
            reader.run(block)


def test_the_readme_opens_with_the_two_commands() -> None:
    first = readme_blocks(README.read_text())[0]
    assert first.directive == "ci" and first.lang == "bash"
    commands = [line for line in first.text.splitlines() if line and not line.startswith("#")]
    assert commands == ["bash .ci/setup && .venv/bin/wds-cloud demo",
                        "bash .ci/setup && .venv/bin/python -m pytest"]


def test_the_environment_table_names_every_variable_read() -> None:
    settings = (ROOT / "wds_cloud" / "settings.py").read_text()
    read = set(re.findall(r"""["']((?:WDS|GOPEN|AIS|USE_AIS)_[A-Z_]+|RANK|WORLD_SIZE|WORKER|
                              NUM_WORKERS)["']""", settings, re.X))
    table = README.read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    missing = sorted(name for name in read if f"`{name}`" not in table)
    assert read and not missing, f"README's environment table lacks {missing}"
