"""A real Docker engine, a node base image and an image registry for the tests, made here.

No registry on the internet is reachable, so the base image is built from Debian's packages:
``debootstrap`` a bookworm root file system with python3, install torch's CPU wheel and what
the node image needs into a venv inside it (wheels fetched by the host's pip), ``docker
import`` it. The image is tagged with a hash of its inputs and reused while they do not change.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from s3server import free_port, wait_until_listening

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "artifacts/pytorch/v1/requirements.txt"
TORCH = "torch==2.13.0"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = "python3,python3-venv,ca-certificates"
RECIPE_VERSION = "1"  # bump when the recipe below changes


def _run(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout)[-2000:]}")
    return done


def engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


STATE = Path(tempfile.gettempdir()) / "launcher-tests-docker"  # shared by every test process on this machine


@contextmanager
def _locked(name: str):
    """An exclusive lock shared by every test process on this machine (xdist's workers, other sessions)."""
    STATE.mkdir(exist_ok=True)
    with open(STATE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _started(pid: int) -> str | None:
    """The process's start time (its identity with its pid), or None once it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(record: Path) -> int | None:
    """The pid written in ``record`` ("PID STARTTIME"), if that very process still runs."""
    try:
        pid, started = record.read_text().split()
    except (OSError, ValueError):
        return None
    return int(pid) if _started(int(pid)) == started else None


def use_engine(session_pid: int) -> None:
    """Make a Docker engine answer for the test session whose main process is ``session_pid``: the running one,
    or dockerd started here, then shared with every session that uses it meanwhile and stopped by
    :func:`release_engine` when the last one ends (not when the session that started it does)."""
    with _locked("engine"):
        users = STATE / "users"
        users.mkdir(exist_ok=True)
        (users / str(session_pid)).write_text(f"{session_pid} {_started(session_pid)}")
        with open(STATE / "users.log", "a") as log:  # who used it when, for engine_users
            log.write(f"{session_pid} {time.time():.0f}\n")
        if engine_answers():
            return
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            raise RuntimeError("no Docker engine answers and this user cannot start dockerd "
                               "(apt-get install docker.io; run as root)")
        log = STATE / "dockerd.log"
        problems = []
        for driver in ("overlay2", "vfs"):
            process = subprocess.Popen(["dockerd", "--iptables=false", f"--storage-driver={driver}"],
                                       stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
            (STATE / "dockerd").write_text(f"{process.pid} {_started(process.pid)}")
            if _wait_ready(process, 60):
                return
            problems.append(f"{driver}: {log.read_text()[-1500:]}")
            _stop(process.pid)
        raise RuntimeError("dockerd did not start:\n" + "\n".join(problems))


def engine_users(since: float) -> set[int]:
    """The test sessions (their main pids) that began to use the engine at or after ``since``."""
    try:
        lines = (STATE / "users.log").read_text().split("\n")
    except OSError:
        return set()
    return {int(pid) for pid, _, when in (line.partition(" ") for line in lines if line) if float(when) >= since}


def release_engine(session_pid: int) -> int | None:
    """The session whose main process is ``session_pid`` no longer uses the engine. Stops the dockerd a test
    session started once no live session uses it; returns its pid where it goes on for others."""
    with _locked("engine"):
        users = STATE / "users"
        (users / str(session_pid)).unlink(missing_ok=True)
        others = [user for user in users.iterdir() if _alive(user) is not None] if users.is_dir() else []
        dockerd = _alive(STATE / "dockerd")
        if dockerd is None:
            return None
        if others:
            return dockerd
        _stop(dockerd)
        (STATE / "dockerd").unlink(missing_ok=True)
        return None


def _wait_ready(process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if engine_answers():
            return True
        time.sleep(0.5)  # polling a daemon's socket until it answers: there is no event to wait on
    return False


def _stop(pid: int) -> None:
    """Stop dockerd (it stops its containerd and containers first), whichever process started it."""
    started = _started(pid)
    for sig, patience in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)  # our own child: reap it
            except ChildProcessError:
                pass
            if _started(pid) != started:
                return
            time.sleep(0.2)  # not our child (another process started it): only /proc tells that it ended


def base_image_tag() -> str:
    recipe = "\n".join([RECIPE_VERSION, TORCH, SUITE, PACKAGES, REQUIREMENTS.read_text()])
    return f"launcher-test/base:{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def ensure_base_image() -> str:
    """The node base image (python3 venv with torch and the node's requirements); built once, by one test
    process at a time (the others wait for it and find it built)."""
    with _locked("base-image"):
        return _ensure_base_image()


def _ensure_base_image() -> str:
    tag = base_image_tag()
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is missing (apt-get install debootstrap)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="launcher-rootfs-") as scratch:
        root = Path(scratch) / "root"
        _run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(root), MIRROR], 900)
        wheels = root / "tmp/wheels"
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(wheels), TORCH,
              "-r", str(REQUIREMENTS)], 900)
        shutil.copy(REQUIREMENTS, wheels / "requirements.txt")
        _run(["chroot", str(root), "python3", "-m", "venv", "/opt/venv"], 300)
        _run(["chroot", str(root), "/opt/venv/bin/pip", "install", "--quiet", "--no-index", "--find-links",
              "/tmp/wheels", TORCH, "-r", "/tmp/wheels/requirements.txt"], 900)
        shutil.rmtree(wheels)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        _run(["docker", "import", "--change", "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
              "/usr/bin:/sbin:/bin", "--change", "ENV LANG=C.UTF-8", "-", tag], 900, stdin=tar.stdout)
        tar.wait()
    print(f"built the test base image {tag} in {time.monotonic() - started:.0f} s")
    return tag


class Registry:
    """Debian's docker-registry (distribution) on 127.0.0.1, storing in a temporary directory."""

    def __init__(self, storage: Path) -> None:
        binary = shutil.which("docker-registry")
        if binary is None:
            raise RuntimeError("docker-registry is missing (apt-get install docker-registry)")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        config = storage / "config.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {storage / 'data'}\n"
                          f"http:\n  addr: {self.address}\nlog:\n  level: warn\n")
        self.process = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL,
                                        stderr=(storage / "registry.log").open("wb"))
        wait_until_listening(self.port)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
