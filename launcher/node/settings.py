"""What a node is told, read back from the environment :func:`launcher.plan.node_env` wrote."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Mapping

from launcher import node_names
from launcher.node import identity
from launcher.protocol.store import StoreError
from launcher.node.threads import MACHINE_NODES_VAR


class SettingsError(Exception):
    pass


@dataclass(frozen=True)
class NodeSettings:
    run_id: str
    work_dir: str
    node: str
    nodes: tuple[str, ...]
    groups: tuple[tuple[str, int], ...]  # [(main group, replicas), (worker group, replicas)]: ``nodes`` unexpanded
    nproc_per_node: int | None  # None: auto, one per GPU this node sees
    entry_point: str
    entry_kind: str  # script | module | executable
    args: tuple[str, ...]
    start_options: tuple[str, ...]
    rendezvous_timeout: float
    master_port: int
    outputs_dir: str
    outputs_temporary: bool  # launcher chose the directory: removed once its files are in the work dir
    outputs_sync_interval: float
    recovery: dict | None  # {"minNodes", "maxRestarts", "retryOn"}: membership rounds (launcher.protocol.rounds)
    max_runtime: float | None  # seconds from the node's start, then the run fails
    hang_timeout: float | None  # seconds without a line from any training process, then the run fails
    resume_from: str | None
    incarnation: int = 0  # 0: the node as first started; n: its n-th replacement (same name)
    # a recovering round trains this long before its node starts the next round's spare torchrun (launcher.node.torchrun.spare)
    spare_after: float = 0.0
    restore_from: tuple[str, ...] = ()  # a run retried whole: its earlier attempts (launcher.runs.attempts)
    machine_nodes: int = 1  # nodes of the run on this node's machine, where the backend knows (launcher.node.threads)

    @property
    def run_url(self) -> str:
        return f"{self.work_dir.rstrip('/')}/{self.run_id}"

    @property
    def earlier_runs(self) -> tuple[str, ...]:
        """The runs whose outputs this one continues: ``--resume-from``'s, and a retried run's earlier attempts."""
        return ((self.resume_from,) if self.resume_from else ()) + self.restore_from


def from_env(env: Mapping[str, str] = os.environ) -> NodeSettings:
    def need(name: str) -> str:
        value = env.get(name)
        if not value:
            raise SettingsError(f"{name} is not set: this program is started by launcher, with the env of the plan")
        return value

    try:
        run_id = need("LAUNCHER_RUN_ID")
        groups = [(str(name), int(count)) for name, count in json.loads(need("LAUNCHER_NODE_GROUPS"))]
        nodes = tuple(node_names.expand(groups))
        node, incarnation = _service_node(env, groups, need)
        if node not in nodes:
            raise SettingsError(f"LAUNCHER_NODE_NAME {node!r} is not a node of LAUNCHER_NODE_GROUPS "
                                f"({len(nodes)} nodes)")
        # Per run and per node, also under a configured outputsDir: nodes sharing a filesystem (local
        # nodes, a shared volume) and later runs never write into, or resume from, each other's files.
        configured = env.get("LAUNCHER_OUTPUTS_DIR")
        outputs_dir = (os.path.join(configured, run_id, node) if configured
                       else os.path.join(tempfile.gettempdir(), "launcher", run_id, node, "outputs"))
        return NodeSettings(
            run_id=run_id,
            work_dir=need("LAUNCHER_WORK_DIR"),
            node=node,
            nodes=nodes,
            groups=tuple(groups),
            nproc_per_node=_processes(env.get("LAUNCHER_NPROC_PER_NODE", "1")),
            entry_point=need("LAUNCHER_ENTRYPOINT"),
            entry_kind=_entry_kind(env.get("LAUNCHER_ENTRY_KIND", "script")),
            max_runtime=float(env["LAUNCHER_MAX_RUNTIME"]) if env.get("LAUNCHER_MAX_RUNTIME") else None,
            hang_timeout=float(env["LAUNCHER_HANG_TIMEOUT"]) if env.get("LAUNCHER_HANG_TIMEOUT") else None,
            args=tuple(json.loads(env.get("LAUNCHER_ARGS", "[]"))),
            start_options=tuple(json.loads(env.get("LAUNCHER_START_OPTIONS", "[]"))),
            rendezvous_timeout=float(env.get("LAUNCHER_RDZV_TIMEOUT", "600")),
            master_port=int(env.get("LAUNCHER_MASTER_PORT", "0")),
            outputs_dir=outputs_dir,
            outputs_temporary=not configured,
            outputs_sync_interval=float(env.get("LAUNCHER_OUTPUTS_SYNC_INTERVAL", "30")),
            spare_after=float(env.get("LAUNCHER_SPARE_AFTER", "0")),
            recovery=json.loads(env["LAUNCHER_RECOVERY"]) if env.get("LAUNCHER_RECOVERY") else None,
            incarnation=int(env.get("LAUNCHER_NODE_INCARNATION") or incarnation),
            resume_from=env.get("LAUNCHER_RESUME_FROM") or None,
            restore_from=tuple(str(url) for url in json.loads(env.get("LAUNCHER_RESTORE_FROM") or "[]")),
            machine_nodes=_at_least_one(MACHINE_NODES_VAR, env.get(MACHINE_NODES_VAR, "1")),
        )
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"malformed LAUNCHER_* variable: {exc}") from None


def _service_node(env: Mapping[str, str], groups: list[tuple[str, int]],
                  need: Callable[[str], str]) -> identity.Claim:
    """The node's name and incarnation: given, or, for a node that a service started from its group's shared env
    (OCI multi-node jobs), claimed (see :mod:`launcher.node.identity`)."""
    if env.get("LAUNCHER_NODE_NAME") or not env.get(identity.NODE_GROUP):
        return identity.Claim(need("LAUNCHER_NODE_NAME"), 0)
    try:
        run_url = f"{need('LAUNCHER_WORK_DIR').rstrip('/')}/{need('LAUNCHER_RUN_ID')}"
        return identity.service_node(env, groups, run_url)
    except (identity.IdentityError, StoreError) as exc:
        raise SettingsError(f"this node could not tell which node it is: {exc}") from None


def _processes(text: str) -> int | None:
    if text == "auto":
        return None
    return _at_least_one("LAUNCHER_NPROC_PER_NODE", text, "auto or ")


def _at_least_one(name: str, text: str, other: str = "") -> int:
    value = int(text) if text.strip().isdigit() else 0
    if value < 1:
        raise ValueError(f"{name} must be {other}>= 1, not {text!r}")
    return value


def _entry_kind(text: str) -> str:
    if text not in ("script", "module", "executable"):
        raise ValueError(f"LAUNCHER_ENTRY_KIND must be script, module or executable, not {text!r}")
    return text
