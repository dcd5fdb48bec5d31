"""A real Docker engine, a node base image and an image registry for the tests, made here.

No registry on the internet is reachable, so the base image is built from Debian's packages:
``debootstrap`` a bookworm root file system with python3, install torch's CPU wheel and what
the node image needs into a venv inside it (wheels fetched by the host's pip), ``docker
import`` it. The image is tagged with a hash of its inputs and reused while they do not change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
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


class Engine:
    """The running engine, or one started here (stopped again by :meth:`stop`)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        if engine_answers():
            return
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            raise RuntimeError("no Docker engine answers and this user cannot start dockerd "
                               "(apt-get install docker.io; run as root)")
        self.log = Path(tempfile.gettempdir()) / "launcher-tests-dockerd.log"
        problems = []
        for driver in ("overlay2", "vfs"):
            self.process = subprocess.Popen(["dockerd", "--iptables=false", f"--storage-driver={driver}"],
                                            stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                            start_new_session=True)
            if self._wait_ready(60):
                return
            problems.append(f"{driver}: {self.log.read_text()[-1500:]}")
            self.stop()
        raise RuntimeError("dockerd did not start:\n" + "\n".join(problems))

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if engine_answers():
                return True
            time.sleep(0.5)  # polling a daemon's socket until it answers: there is no event to wait on
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.process = None


def base_image_tag() -> str:
    recipe = "\n".join([RECIPE_VERSION, TORCH, SUITE, PACKAGES, REQUIREMENTS.read_text()])
    return f"launcher-test/base:{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def ensure_base_image() -> str:
    """The node base image (python3 venv with torch and the node's requirements); built once."""
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
