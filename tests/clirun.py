"""Helpers for tests that drive the real CLI through whole runs: projects, run records, a live watcher, /proc."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from cluster import write_spec
from conftest import run_cli


def init_project(directory: Path, *, workers: int, epochs: int) -> Path:
    done = run_cli("init", "--framework", "pytorch", "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    spec = directory / "train.yaml"
    text = spec.read_text().replace("replicas: 1\n      # Training", f"replicas: {workers}\n      # Training")
    text = text.replace("        - 8\n", f"        - {epochs}\n")
    spec.write_text(text)
    return spec


def run_failing(directory: Path, script: str, **spec_options) -> tuple[str, str]:
    """Run a 2-node job (write_spec's options) that must fail; return its whole output and its closing summary."""
    spec = write_spec(directory, script, nodes=2, **spec_options)
    done = run_cli("run", "-f", str(spec), cwd=directory, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout, done.stdout[done.stdout.rindex("\nrun "):]


def info_of(home: Path, run_id: str) -> dict:
    return yaml.safe_load((home / "runs" / run_id / "info.yaml").read_text())


def run_id_from(output: str) -> str:
    return re.search(r"^run (\S+): \d+ nodes? on \w+", output, re.M).group(1)


class LiveCli:
    """A CLI command as a subprocess; its lines (stdout and stderr) are collected and can be awaited."""

    def __init__(self, args: list[str], env: dict, cwd: str | os.PathLike | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], env=env, cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def mark(self) -> int:
        """Where the lines are now: ``wait_for(..., since=mark)`` looks only at lines that come after."""
        with self.cond:
            return len(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120, since: int = 0) -> str:
        regex = re.compile(pattern)
        with self.cond:
            found = self.cond.wait_for(lambda: next((l for l in self.lines[since:] if regex.search(l)), None),
                                       timeout)
        assert found, f"no line matching {pattern!r} in:\n" + "\n".join(self.lines[-30:])
        return found

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with self.cond:
                tail = "\n".join(self.lines[-60:])
            raise AssertionError(f"{self.proc.args[2:]} still running after {timeout} s; its last lines:\n{tail}")
        self._pumping.join(timeout)  # every line read: the pump ends with the pipe
        with self.cond:
            return code, "\n".join(self.lines)


class Watcher(LiveCli):
    """`launcher watch RUN` as a subprocess."""

    def __init__(self, run_id: str, env: dict):
        super().__init__(["watch", run_id], env)


def wait_until(condition, timeout: float) -> bool:
    """For state changes the test cannot subscribe to (an engine's cleanup, a simulated service's lifecycle)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie awaiting its parent's wait() is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def processes_started_with(**environment: str) -> dict[int, list[bytes]]:
    """This machine's processes whose starting environment holds every given entry, with their argv. A
    container's processes are this machine's too, so this finds a Docker node's or a pod's processes as well."""
    marks = [f"{name}={value}".encode() for name, value in environment.items()]
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if all(mark in (entry / "environ").read_bytes().split(b"\0") for mark in marks):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:  # gone, or not ours to read
            continue
    return found


def is_node_bootstrap(argv: list[bytes]) -> bool:
    """Whether a process is a node's bootstrap (``python -m launcher.node``), not what it started."""
    return argv[-2:] == [b"-m", b"launcher.node"]


def group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(") ", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def interruptible() -> None:
    """preexec_fn for a client a test interrupts as a terminal's Ctrl-C would: SIGINT at its default. A test
    session started in the background (`cmd &` in a script) has SIGINT ignored, which children inherit and
    Python then keeps ignoring."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
