"""Shared fixtures. Set LAUNCHER_TEST_REQUIRE_ALL=1 (CI does) to turn 'tool missing' skips into failures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import leftovers

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
    """A real Docker engine: the running one, or dockerd started here, shared with xdist's other workers and
    other test sessions on this machine, and stopped when the last session that uses it ends (pytest_sessionfinish
    below; dockerenv.release_engine)."""
    from dockerenv import use_engine

    try:
        use_engine(leftovers.session_pid())
    except RuntimeError as exc:
        require(False, str(exc))


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


# -- pytest-xdist (scripts/test runs -n 3 --dist loadgroup): what must not run on two workers at once ----------
#
# xdist's loadgroup sends the tests of one xdist_group to one worker, reading the group from a suffix its workers
# add to each test's id; pytest 9 no longer takes that suffix (an item's id is no longer its `_nodeid`), so every
# group was spread over both workers. The workers write each test's group into a file of the session's instead
# (LAUNCHER_TEST_GROUPS), and the controller's scheduler reads it.

OCI_SIMULATION_MODULES = ("test_oci", "test_recovery_oci")  # their fixture `sim` runs the nodes
GROUPS_VAR = "LAUNCHER_TEST_GROUPS"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "docker_engine" in item.fixturenames:
            # one engine: two workers building the same project make the same tag (named after its content)
            # and move it from one's image to the other's
            item.add_marker(pytest.mark.xdist_group("docker"))
        elif "sim" in item.fixturenames and item.module.__name__.rsplit(".", 1)[-1] in OCI_SIMULATION_MODULES:
            # the simulation runs the nodes here, every run's main on OCI's port (29400) on 127.0.0.1
            item.add_marker(pytest.mark.xdist_group("oci"))
    if hasattr(config, "workerinput") and os.environ.get(GROUPS_VAR):
        groups = {item.nodeid: "_".join(sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name"))
                                                for mark in item.iter_markers("xdist_group")}))
                  for item in items if item.get_closest_marker("xdist_group")}
        target = Path(os.environ[GROUPS_VAR], f"{config.workerinput['workerid']}.json")
        target.with_suffix(".tmp").write_text(json.dumps(groups))
        target.with_suffix(".tmp").rename(target)


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: pytest runs without xdist too (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", None) != "loadgroup" or not os.environ.get(GROUPS_VAR):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(LoadGroupScheduling):
        """Tests of one xdist_group on one worker, the groups as the workers wrote them; the others one by one."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once every worker has collected (scheduling starts then)
                self.groups = {}
                for written in Path(os.environ[GROUPS_VAR]).glob("*.json"):
                    self.groups.update(json.loads(written.read_text()))
            return f"group {self.groups[nodeid]}" if nodeid in self.groups else super()._split_scope(nodeid)

    return Scheduling(config, log)


# -- what a test leaves behind fails the session (leftovers.py) -----------------------------------------------

_SESSION = pytest.StashKey[tuple]()  # (the session's mark, when it started), in the main process


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the main process: the only one, or xdist's controller
        config.stash[_SESSION] = (leftovers.start_session(), time.time())
        if config.getoption("dist", None) == "loadgroup":
            os.environ[GROUPS_VAR] = tempfile.mkdtemp(prefix="launcher-tests-groups-")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    """Whatever a test starts carries its name in its environment (a leftover names the test)."""
    os.environ[leftovers.TEST_VAR] = item.nodeid
    try:
        return (yield)
    finally:
        os.environ.pop(leftovers.TEST_VAR, None)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """In the main process, after every fixture (and with xdist every worker) is gone: the processes this
    session started that still run, and the containers of launcher runs it created, are reported, stopped and
    fail the session."""
    if _SESSION not in session.config.stash:
        return
    if os.environ.get(GROUPS_VAR):
        shutil.rmtree(os.environ[GROUPS_VAR], ignore_errors=True)
    from dockerenv import STATE, engine_answers, engine_users, release_engine

    session_id, started = session.config.stash[_SESSION]
    base_temp = session.config._tmp_path_factory.getbasetemp()
    used_engine = (STATE / "users" / str(os.getpid())).exists()
    found = []
    if used_engine and engine_answers():
        dockerd = (STATE / "dockerd").read_text().split()[0] if (STATE / "dockerd").exists() else None
        alone = (dockerd is not None and leftovers.carries(int(dockerd), session_id)
                 and engine_users(started - 1) == {os.getpid()})
        found += leftovers.containers(started - 1, base_temp, alone)
        leftovers.remove_containers(found)
    spared = {release_engine(os.getpid())} - {None} if used_engine else set()  # dockerd, on for other sessions
    processes = leftovers.lingering_processes(session_id, spared)
    leftovers.stop_processes(processes)
    found += [str(process) for process in processes]
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")  # ends the progress line
        reporter.write_sep("=", "left behind by the tests (stopped now)", red=True)
        for line in found:
            reporter.write_line(line)
        # counted in the closing line ("N passed, 2 left behind"); other plugins read reports' __dict__
        reporter.stats.setdefault("left behind", []).extend(_LeftBehind(line) for line in found)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class _LeftBehind:
    def __init__(self, line: str) -> None:
        self.line = line
