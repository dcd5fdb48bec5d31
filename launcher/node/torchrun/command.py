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

import os
import sys
from typing import Mapping

from launcher.protocol.rendezvous import Decision
from launcher.node.settings import NodeSettings


CHECKPOINTS_SUBDIR = "checkpoints"  # LAUNCHER_CHECKPOINT_DIR, inside the outputs dir: synced and restored with it
# How often torchrun looks at its processes (its default 0.1 s): half of it is, on average, between the last
# process's exit and the end of the round or the run.
MONITOR_SECONDS = "0.05"
# Renamed by torch (which warns on the old name); specs written for the old name keep working.
RENAMED_ENV = {"NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
               "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT"}


def checkpoint_dir(settings: NodeSettings) -> str:
    return os.path.join(settings.outputs_dir, CHECKPOINTS_SUBDIR)


def rank_env(decision: Decision, settings: NodeSettings, processes: int, round_number: int = 0) -> dict[str, str]:
    env = {
        "MASTER_ADDR": decision.master_addr,
        "MASTER_PORT": str(decision.master_port),
        "LOCAL_WORLD_SIZE": str(processes),
        "LAUNCHER_OUTPUTS_DIR": settings.outputs_dir,
    }
    nnodes = len(decision.ranks)
    node_rank = decision.ranks[settings.node]
    env.update({
        "NODE_RANK": str(node_rank),
        "NNODES": str(nnodes),
        "WORLD_SIZE": str(nnodes * processes),
        "RANK": str(node_rank * processes),
        "LAUNCHER_CHECKPOINT_DIR": checkpoint_dir(settings),
        # A new number each time the training processes start again in this run (launcher.data keys its
        # progress records by it)
        "LAUNCHER_ROUND": str(round_number),
    })
    return env


def standing_env(base: Mapping[str, str]) -> dict[str, str]:
    """The part of the training environment that is the same in every round: what a spare torchrun and its
    warm interpreters start with (launcher.node.torchrun.spare), before the round is known."""
    from launcher.node.diagnosis.stacks import hooks_pythonpath

    env = dict(base)
    for old, new in RENAMED_ENV.items():
        if old in env:
            value = env.pop(old)
            env.setdefault(new, value)
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONPATH": hooks_pythonpath(env.get("PYTHONPATH"))})
    return env


def training_env(base: Mapping[str, str], decision: Decision, settings: NodeSettings,
                 processes: int, stacks_dir: str, round_number: int = 0) -> dict[str, str]:
    """The environment torchrun and the training processes start with (``stacks_dir``: see launcher.node.diagnosis.stacks)."""
    from launcher.node.diagnosis.stacks import stacks_env

    env = standing_env(base)
    env.update(rank_env(decision, settings, processes, round_number))
    env.update(stacks_env(stacks_dir))
    return env


def torchrun_argv(decision: Decision, settings: NodeSettings, processes: int, *, log_dir: str,
                  wait_seconds: float) -> list[str]:
    """torchrun's command line, through the shim: each training process writes its output into a pipe in
    log_dir (read by launcher.node.torchrun.ranklogs), and workers start once the main's port answers."""
    wait = [] if decision.main == settings.node else [decision.master_addr, str(decision.master_port),
                                                      f"{wait_seconds:g}"]
    argv = [sys.executable, "-m", "launcher.node.torchrun.shim", *wait, "--",
            "--nproc-per-node", str(processes), "--log-dir", log_dir, "--monitor-interval", MONITOR_SECONDS]
    argv += ["--nnodes", str(len(decision.ranks)), "--node-rank", str(decision.ranks[settings.node]),
             "--master-addr", decision.master_addr, "--master-port", str(decision.master_port)]
    return argv + list(settings.start_options) + entry_argv(settings) + list(settings.args)


def entry_argv(settings: NodeSettings) -> list[str]:
    """torchrun's view of the entry point: a script, ``--module NAME``, or ``--no-python PROGRAM``."""
    if settings.entry_kind == "module":
        return ["--module", settings.entry_point]
    if settings.entry_kind == "executable":
        program = settings.entry_point
        # exec looks a bare name up on PATH; the program is in the code directory
        return ["--no-python", program if "/" in program else f"./{program}"]
    return [settings.entry_point]
