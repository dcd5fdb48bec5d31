"""Local processes: every node is a process group on this machine running the real bootstrap."""

from __future__ import annotations

import sys
from typing import Any

from launcher.backends.base import Backend, Request
from launcher.plan import DEFAULT_LOCAL_WORK_DIR, Plan
from launcher.spec.model import LocalInfra, Spec
from launcher.workdirs import resolve_local, scheme, unusable_reason


class LocalBackend(Backend):
    name = "local"
    node_command = (sys.executable, "-m", "launcher.node")

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        override = spec.infra.work_dir if isinstance(spec.infra, LocalInfra) else None
        wanted = override or spec.cluster.work_dir
        if wanted:
            reason = unusable_reason(wanted)
            if reason is None:
                return (resolve_local(wanted, spec.base_dir) if scheme(wanted) == "file" else wanted), []
            fallback = resolve_local(DEFAULT_LOCAL_WORK_DIR, spec.base_dir)
            return fallback, [f"work dir {wanted} is not usable from here ({reason}); using {fallback}"]
        return resolve_local(DEFAULT_LOCAL_WORK_DIR, spec.base_dir), []

    def node_env_extra(self, spec: Spec) -> dict[str, str]:
        return {"LAUNCHER_NODE_ADDRESS": "127.0.0.1"}

    def requests(self, plan: Plan) -> list[Request]:
        cwd = str(plan.spec.base_dir)
        return [Request("spawn", node.name, {"argv": list(node.command), "cwd": cwd, "env": dict(node.env)})
                for node in plan.nodes]

    def schedule(self, dryrun: Any, state_dir: str) -> dict[str, Any]:
        from launcher.backends.local_run import start

        return start(dryrun, state_dir)

    def alive(self, backend_ids: dict[str, Any]) -> bool | None:
        from launcher.backends.local_run import pids_alive

        return bool(pids_alive([backend_ids["supervisor_pid"], *backend_ids["node_pids"].values()]))

    def stop(self, backend_ids: dict[str, Any], grace: float) -> list[str]:
        from launcher.backends.local_run import kill_groups, wait_for_exit

        pids = backend_ids["node_pids"]
        left = wait_for_exit(pids.values(), grace)
        kill_groups(left)  # each node leads its own process group; the supervisor kills their training
        wait_for_exit([backend_ids["supervisor_pid"]], 30)
        return [name for name, pid in pids.items() if pid in left]
