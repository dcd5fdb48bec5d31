"""Shared fixtures. Set LAUNCHER_TEST_REQUIRE_ALL=1 (CI does) to turn 'tool missing' skips into failures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).resolve().parent / "specs"
SEED_004 = SPECS / "seed004_train.yaml"


def require(condition: bool, why: str) -> None:
    """Skip when a tool is missing locally; fail in CI, where everything must be present."""
    if condition:
        return
    if os.environ.get("LAUNCHER_TEST_REQUIRE_ALL") == "1":
        pytest.fail(f"required test dependency missing: {why}")
    pytest.skip(why)


def run_cli(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def launcher_home(tmp_path, monkeypatch):
    """An isolated per-test state directory for runs (info.yaml files)."""
    home = tmp_path / "launcher-home"
    monkeypatch.setenv("LAUNCHER_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def docker_compose_bin() -> str:
    path = shutil.which("docker-compose")
    require(path is not None, "docker-compose is not installed (apt-get install docker-compose)")
    return path


@pytest.fixture(scope="session")
def moto():
    """One moto_server for the session; tests use their own buckets."""
    from s3server import MotoServer

    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(moto, monkeypatch, request):
    """A fresh bucket, with this process's s3fs pointed at the server (like the nodes' env)."""
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-b"
    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    _reset_fsspec_config()
    moto.make_bucket(name)
    yield name
    _reset_fsspec_config()


def _reset_fsspec_config() -> None:
    """fsspec reads FSSPEC_* variables at import; re-read them after the test changed the env."""
    import fsspec.config

    fsspec.config.conf.clear()
    fsspec.config.set_conf_env(fsspec.config.conf)


@pytest.fixture(scope="session")
def docker_engine():
    """A real Docker engine: the running one, or dockerd started here (and stopped after the session)."""
    from dockerenv import Engine

    try:
        engine = Engine()
    except RuntimeError as exc:
        require(False, str(exc))
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def node_base_image(docker_engine) -> str:
    """The node base image (Debian + python3 venv with torch and the node's requirements), built once."""
    from dockerenv import ensure_base_image

    try:
        return ensure_base_image()
    except (RuntimeError, OSError) as exc:
        require(False, f"cannot build the test base image: {exc}")


@pytest.fixture(scope="session")
def registry(docker_engine, tmp_path_factory):
    """Debian's docker-registry on 127.0.0.1 (the engine trusts loopback registries without TLS)."""
    from dockerenv import Registry

    try:
        server = Registry(tmp_path_factory.mktemp("registry"))
    except RuntimeError as exc:
        require(False, str(exc))
    yield server
    server.stop()
