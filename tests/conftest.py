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
