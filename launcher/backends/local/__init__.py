"""Local processes: every node is a process group on this machine running the real bootstrap."""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.errors import BadInput
from launcher.gpus import node_gpu_shares, pins_devices
from launcher.plan import Plan
from launcher.runs.state import RunInfo, home
from launcher.spec.model import LocalInfra, Spec
from launcher.workdirs import resolve_local, scheme

# A training process that has imported torch takes about 300 MiB; torchrun processes a little less. With warm
# starts (the default) each node also keeps a spare torchrun and one waiting interpreter per training process,
# each about as large. The check refuses clusters this machine clearly cannot hold, not tight ones.
MIB_PER_PROCESS = 300
PROCESSES_PER_CPU = 4


def capacity_problem(nodes: int, processes_per_node: int, *, cpus: int, available_mib: int | None,
                     warm: bool = True) -> str | None:
    """Why this machine cannot start the cluster as local processes, or None when it can (``warm``: warm starts on)."""
    training = nodes * processes_per_node
    if training > max(8, PROCESSES_PER_CPU * cpus):
        return (f"{nodes} nodes x {processes_per_node} processes = {training} training processes, more than this "
                f"machine's {cpus} CPUs can run as local processes (at most {max(8, PROCESSES_PER_CPU * cpus)})")
    needed = ((2 * training + 3 * nodes) if warm else (training + 2 * nodes)) * MIB_PER_PROCESS
    if available_mib is not None and needed > available_mib:
        return (f"{nodes} nodes x {processes_per_node} processes need about {needed} MiB "
                f"({MIB_PER_PROCESS} MiB per process), and this machine has {available_mib} MiB available")
    return None


def _available_mib() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


class LocalBackend(Backend):
    runs_images = False
    name = "local"
    node_command = (sys.executable, "-m", "launcher.node")

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        override = spec.infra.work_dir if isinstance(spec.infra, LocalInfra) else None
        wanted = override or spec.cluster.work_dir
        if not wanted:
            return str(home() / "workdir"), []
        return (resolve_local(wanted, spec.base_dir) if scheme(wanted) == "file" else wanted), []

    one_machine = True  # the nodes are processes of this machine

    def node_env_extra(self, spec: Spec) -> dict[str, str]:
        return {"LAUNCHER_NODE_ADDRESS": "127.0.0.1"}

    def node_devices(self, spec: Spec) -> tuple[list[dict[str, str]] | None, list[str]]:
        """The nodes share this machine: each gets its own GPUs, or none when they cannot all have some."""
        shares, note = node_gpu_shares(spec)
        if shares is None:
            return None, []
        return [{"CUDA_VISIBLE_DEVICES": share} for share in shares], [note] if note else []

    def requests(self, plan: Plan) -> list[Request]:
        """One spawn per node; ``gpus``: the node's share of this machine's GPUs where launcher chose it (its
        supervisor gives a node `launcher scale` adds one apart from them)."""
        cwd = str(plan.spec.base_dir)
        chosen = not pins_devices(plan.spec)
        return [Request("spawn", node.name, {"argv": list(node.command), "cwd": cwd, "env": dict(node.env),
                                             **({"gpus": node.env["CUDA_VISIBLE_DEVICES"]}
                                                if chosen and "CUDA_VISIBLE_DEVICES" in node.env else {})})
                for node in plan.nodes]

    def dryrun(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> DryRun:
        request = super().dryrun(spec, run_id=run_id, resume_from=resume_from)
        problem = self._capacity(spec)
        if problem:
            return DryRun(request.backend, request.plan, request.requests,
                          request.notes + (f"run would refuse: {problem}",))
        return request

    def _capacity(self, spec: Spec) -> str | None:
        from launcher.node.torchrun.warmstart import warm_starts_on

        settings = {item.name: item.value for item in (*spec.cluster.env, *spec.runtime.env)}
        return capacity_problem(spec.cluster.node_count, spec.cluster.processes_per_node or 1,
                                cpus=os.cpu_count() or 1, available_mib=_available_mib(), warm=warm_starts_on(settings))

    def check(self, dryrun: DryRun) -> list[str]:
        problem = self._capacity(dryrun.plan.spec)
        if problem:
            raise BadInput(f"{problem}; use fewer nodes or processes, or another backend")
        if dryrun.plan.spec.warnings:  # local nodes run the code directory as it is: this would fail on every node
            raise BadInput("\n".join(dryrun.plan.spec.warnings))
        return []

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        from launcher.backends.local.processes import start

        return start(dryrun, state_dir)

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        from launcher.backends.local.processes import read_processes
        from launcher.runs.supervision import console_log_path, recorded_fate

        supervisor, refs = read_processes(info.state_dir)
        recording = supervisor is not None and supervisor.running()
        fates = {}
        for name in info.nodes:
            console = str(console_log_path(info.state_dir, name))
            ref = refs.get(name)
            fate = recorded_fate(info.state_dir, name)
            if fate is not None:
                fates[name] = fate
            elif ref is None:
                continue  # not started yet, as far as this machine knows
            elif ref.running() or recording:  # a live supervisor is still saving what the node left
                fates[name] = NodeFate(True, console_log=console)
            else:
                fates[name] = NodeFate(False, None, "node process is gone and no exit was recorded for it "
                                       "(its supervisor was killed too)", console)
        return fates

    def scale_problem(self, info: RunInfo) -> str | None:
        from launcher.backends.local.processes import supervisor_problem

        return supervisor_problem(info.state_dir)

    def scale(self, info: RunInfo, add: Sequence[str]) -> list[str]:
        from launcher.backends.local.processes import request_nodes

        return request_nodes(info.state_dir, add)

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        from launcher.backends.local.processes import read_processes
        from launcher.node.leftovers import kill_groups
        from launcher.runs.supervision import wait_for_exit

        supervisor, refs = read_processes(info.state_dir)
        left = wait_for_exit(refs.values(), grace)
        kill_groups(ref.pid for ref in left)  # each node leads its own group; the supervisor kills their training
        if supervisor is not None:
            wait_for_exit([supervisor], 30)
        return [name for name, ref in refs.items() if ref in left]
