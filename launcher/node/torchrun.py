"""The rank environment and the torchrun command line, each defined once.

Meaning of the variables (docs/protocol.md repeats this table):
  NODE_RANK         this node's rank among nodes, 0..NNODES-1; the main node is 0
  NNODES            number of nodes
  LOCAL_WORLD_SIZE  training processes on this node (torchrun --nproc-per-node)
  WORLD_SIZE        training processes in the whole job = NNODES * LOCAL_WORLD_SIZE
  RANK              global rank of a process; exported here as this node's first process rank
                    (NODE_RANK * LOCAL_WORLD_SIZE); torchrun sets each process's own RANK
  MASTER_ADDR/PORT  the main node's address and the port of its rendezvous store
"""

from __future__ import annotations

import sys

from launcher.node.rendezvous import Decision
from launcher.node.settings import NodeSettings


def rank_env(decision: Decision, settings: NodeSettings) -> dict[str, str]:
    env = {
        "MASTER_ADDR": decision.master_addr,
        "MASTER_PORT": str(decision.master_port),
        "LOCAL_WORLD_SIZE": str(settings.nproc_per_node),
        "LAUNCHER_OUTPUTS_DIR": settings.outputs_dir,
        "PYTHONUNBUFFERED": "1",
    }
    if decision.mode == "static":
        nnodes = len(decision.ranks)
        node_rank = decision.ranks[settings.node]
        env.update({
            "NODE_RANK": str(node_rank),
            "NNODES": str(nnodes),
            "WORLD_SIZE": str(nnodes * settings.nproc_per_node),
            "RANK": str(node_rank * settings.nproc_per_node),
        })
    return env


def torchrun_argv(decision: Decision, settings: NodeSettings, *, wait_seconds: float) -> list[str]:
    """torchrun's command line; on workers wrapped so it starts once the main's port answers."""
    if decision.main == settings.node:
        argv = [sys.executable, "-m", "torch.distributed.run"]
    else:
        argv = [sys.executable, "-m", "launcher.node.torchrun_shim", decision.master_addr,
                str(decision.master_port), f"{wait_seconds:g}", "--"]
    argv += ["--nproc-per-node", str(settings.nproc_per_node)]
    if decision.mode == "static":
        argv += ["--nnodes", str(len(decision.ranks)), "--node-rank", str(decision.ranks[settings.node]),
                 "--master-addr", decision.master_addr, "--master-port", str(decision.master_port)]
    else:
        elastic = settings.elastic or {}
        is_host = "true" if decision.main == settings.node else "false"
        argv += ["--nnodes", f"{elastic.get('minNodes', 1)}:{elastic.get('maxNodes', len(settings.nodes))}",
                 "--max-restarts", str(elastic.get("maxRestarts", 0)),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{decision.master_addr}:{decision.master_port}",
                 "--rdzv-id", settings.run_id, "--rdzv-conf", f"is_host={is_host}"]
    return argv + list(settings.start_options) + [settings.entry_point] + list(settings.args)
