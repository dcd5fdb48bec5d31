"""What the work dir says about a run: node statuses, the decision, failures, and the run's result."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from launcher.node.control import CONTROL_PREFIX
from launcher.node.rendezvous import DECISION_KEY
from launcher.node.status import FINAL_STATES, status_key
from launcher.node.store import WorkDir
from launcher.runs.state import RunInfo


@dataclass
class RunView:
    info: RunInfo
    statuses: dict[str, dict[str, Any]]
    decision: dict[str, Any] | None
    failures: list[dict[str, Any]]
    cancelled: bool

    @property
    def ended(self) -> bool:
        return all(self.statuses.get(n, {}).get("state") in FINAL_STATES for n in self.info.nodes)

    @property
    def result(self) -> str:
        """pending | running | succeeded | failed | cancelled."""
        states = [self.statuses.get(n, {}).get("state") for n in self.info.nodes]
        if not self.ended:
            return "running" if any(s in ("waiting", "running") or s in FINAL_STATES for s in states) else "pending"
        if all(s == "succeeded" for s in states):
            return "succeeded"
        if "failed" in states and not self.cancelled:
            return "failed"
        return "cancelled"

    def rank_of(self, node: str) -> int | None:
        if self.decision and node in self.decision.get("ranks", {}):
            return self.decision["ranks"][node]
        return self.statuses.get(node, {}).get("rank")

    def root_failure(self) -> dict[str, Any] | None:
        """The first node that failed on its own (not stopped because of another)."""
        return min(self.failures, key=lambda f: f.get("at", 0)) if self.failures else None


def open_run(info: RunInfo) -> WorkDir:
    return WorkDir(info.run_url)


def read_view(info: RunInfo, run: WorkDir | None = None) -> RunView:
    run = run or open_run(info)
    statuses = {}
    for name in info.nodes:
        data = run.get(status_key(name))
        if data:
            statuses[name] = json.loads(data)
    decision_bytes = run.get(DECISION_KEY)
    control = run.list(CONTROL_PREFIX)
    failures = [json.loads(run.get(f"{CONTROL_PREFIX}/{name}") or b"{}") for name in control
                if name.startswith("failed.")]
    return RunView(info, statuses, json.loads(decision_bytes) if decision_bytes else None, failures,
                   "cancel" in control)


def closing_line(view: RunView) -> str:
    result = view.result
    if result == "failed":
        root = view.root_failure()
        if root:
            return (f"run {view.info.run_id} failed: node {root.get('node')} (rank {root.get('rank')}) "
                    f"exited with status {root.get('exit_code')}: {root.get('reason')}")
        failed = [n for n in view.info.nodes if view.statuses.get(n, {}).get("state") == "failed"]
        return f"run {view.info.run_id} failed: " + ", ".join(
            f"node {n} (rank {view.rank_of(n)}) exit status {view.statuses[n].get('exit_code')}" for n in failed)
    if result == "succeeded":
        return f"run {view.info.run_id} succeeded; outputs are in {view.info.run_url}/outputs/"
    return f"run {view.info.run_id} {result}"
