"""Start a cluster's nodes as real local processes from a real spec and plan, and watch their output."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.backends.local import LocalBackend
from launcher.protocol.store import WorkDir
from launcher.plan import Plan
from launcher.spec import load_spec


def write_spec(directory: Path, script: str, *, nodes: int, args: list | None = None, work_dir: str = "./wd",
               extra_cluster: dict | None = None, env: list | None = None, entry: dict | None = None) -> Path:
    """A spec running ``script`` as job.py; ``entry`` replaces ``{"entryPoint": "job.py"}`` (``{"module": ...}``)."""
    (directory / "job.py").write_text(script)
    spec = {
        "kind": "distributed", "apiVersion": "v1.0",
        "spec": {
            "name": "t",
            "infrastructure": {"kind": "infrastructure", "type": "local"},
            "cluster": {"kind": "pytorch", "spec": {
                "workDir": work_dir, "config": {"env": env or []},
                "main": {"replicas": 1}, "worker": {"replicas": nodes - 1}, **(extra_cluster or {})}},
            "runtime": {"kind": "python", "spec": {**(entry or {"entryPoint": "job.py"}), "args": args or []}},
        },
    }
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@dataclass
class NodeProcess:
    name: str
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    _waiters: list[tuple[str, threading.Event]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.lines.append(line)
                for text, event in self._waiters:
                    if text in line:
                        event.set()

    def wait_for_line(self, text: str, timeout: float = 120) -> bool:
        event = threading.Event()
        with self._lock:
            if any(text in line for line in self.lines):
                return True
            self._waiters.append((text, event))
        return event.wait(timeout)

    @property
    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)


class Cluster:
    def __init__(self, spec_path: Path, start: list[str] | None = None, env: dict | None = None):
        self.spec = load_spec(spec_path)
        self.plan: Plan = LocalBackend().plan(self.spec)[0]
        self.run = WorkDir(f"{self.plan.work_dir}/{self.plan.run_id}")
        self.nodes: dict[str, NodeProcess] = {}
        for node in self.plan.nodes:
            if start is not None and node.name not in start:
                continue
            proc = subprocess.Popen(list(node.command), env={**os.environ, **(env or {}), **node.env},
                                    cwd=self.spec.base_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            self.nodes[node.name] = NodeProcess(node.name, proc)
            threading.Thread(target=self.nodes[node.name]._pump, daemon=True).start()

    def wait(self, timeout: float = 180) -> dict[str, int]:
        return {name: node.proc.wait(timeout) for name, node in self.nodes.items()}

    def status(self, name: str) -> dict:
        return json.loads(self.run.get(f"status/{name}.json") or b"{}")

    def log_text(self, name: str) -> str:
        messages = []
        for key in self.run.find(f"logs/{name}"):
            for line in (self.run.get(f"logs/{name}/{key}") or b"").decode().splitlines():
                messages.append(json.loads(line)["m"])
        return "\n".join(messages)

    def kill_all(self) -> None:
        import signal

        for node in self.nodes.values():
            try:
                os.killpg(node.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
