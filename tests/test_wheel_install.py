"""A non-editable `pip install .` into a fresh venv runs every offline verb: the data files ship in the wheel."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import REPO, SEED_004


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
                   check=True, timeout=600)
    [wheel] = wheels.glob("launcher-*.whl")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   timeout=600)
    return env_dir / "bin" / "launcher"


def test_every_offline_verb_works_from_the_wheel(installed, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(installed), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")})

    assert cli("init", "--framework", "pytorch", "--dir", "proj").returncode == 0
    assert (tmp_path / "proj/artifacts/pytorch/v1/Dockerfile").exists()
    assert cli("validate", "-f", "proj/train.yaml").returncode == 0
    for backend in ("local", "docker", "oci"):
        spec = str(SEED_004) if backend == "oci" else "proj/train.yaml"
        done = cli("run", "-f", spec, "--dry-run", "--backend", backend, "--output", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["backend"] == backend
    # compose builds "@image" first (an engine, a base image); a named image needs neither
    named = tmp_path / "proj" / "named.yaml"
    named.write_text((tmp_path / "proj" / "train.yaml").read_text().replace('image: "@image"', "image: train:1"))
    done = cli("compose", "-f", str(named), "-o", "compose.yaml")
    assert done.returncode == 0 and (tmp_path / "compose.yaml").exists(), done.stderr
    bad = cli("validate", "-f", "missing.yaml")
    assert bad.returncode == 2


def test_the_ui_serves_its_pages_from_the_wheel(installed, tmp_path):
    """Its HTML, JavaScript and CSS ship inside the package, and its web framework is a dependency."""
    proc = subprocess.Popen([str(installed), "ui", "--no-browser"], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            env={**os.environ, "LAUNCHER_HOME": str(tmp_path / "home"), "PYTHONPATH": ""})
    try:
        url = proc.stdout.readline().split(": ", 1)[1].strip()
        address, _, secret = url.removeprefix("http://").partition("/?token=")
        host, _, port = address.partition(":")
        cookie = None
        for path in ("/static/run.js", "/static/runs.js", "/static/common.js", "/static/ui.css", "/static/favicon.svg", "/runs/r1", "/"):
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.request("GET", path if cookie else f"{path}?token={secret}",
                               headers={"Cookie": cookie} if cookie else {})
            answer = connection.getresponse()
            body = answer.read()
            connection.close()
            if cookie is None:
                assert answer.status == 303
                cookie = answer.getheader("Set-Cookie").split(";")[0]
                connection = http.client.HTTPConnection(host, int(port), timeout=30)
                connection.request("GET", path, headers={"Cookie": cookie})
                answer = connection.getresponse()
                body = answer.read()
                connection.close()
            expected = 404 if path == "/runs/r1" else 200  # no such run: the page is not served
            assert answer.status == expected and body, (path, answer.status)
    finally:
        proc.terminate()
        proc.wait(30)
