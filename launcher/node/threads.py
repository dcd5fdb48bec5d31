"""How many threads each training process runs: its share of the cores this node may use.

torch sizes its intra-op thread pool (OpenMP's) once, from ``OMP_NUM_THREADS``, as it is imported; unset, every
process takes every core of the machine. torchrun sets 1 only for several processes under one torchrun, but the
backends that put several nodes on one machine (local, docker, compose) start a torchrun per node: 2 nodes of
1 process on 2 cores ran 4 threads on 2 cores, 7x slower than with 1 each. So the node sets ``OMP_NUM_THREADS`` to
its processes' share, unless the user set it, before its spare torchrun starts (:mod:`launcher.node.torchrun.spare`: the
warm interpreters import torch then, and a value set later would not reach their pools).

The share: usable cores // training processes on this machine, at least 1.
- Usable cores: the CPU affinity mask (``taskset``, Slurm's binding, a container's cpuset), no more than the CPU
  quota of the node's cgroup and its parents (cgroup v2 ``cpu.max``: ``docker --cpus``, Kubernetes limits).
- Processes on this machine: this node's times :data:`MACHINE_NODES_VAR`, which the backends that place several
  nodes on one machine set to their node count (nodes ``launcher scale`` adds later are not counted). Elsewhere
  it is 1: Slurm starts one node per machine, a Kubernetes pod or an OCI job run is a node of its own whose
  quota or affinity says what it may use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import MutableMapping

from launcher.wording import plural

THREADS_VAR = "OMP_NUM_THREADS"
MACHINE_NODES_VAR = "LAUNCHER_MACHINE_NODES"  # how many nodes of the run the backend put on this node's machine
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_quota(own_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> float | None:
    """The CPU time, in cores, that the cgroup v2 quotas of this process's cgroup and its parents allow; None
    where no quota is set or none can be read (cgroup v1, no cgroup filesystem)."""
    try:
        path = next(line[3:] for line in own_cgroup.read_text().splitlines() if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    quotas = []
    directory = root / path.strip().lstrip("/")
    while True:
        try:
            quota, period = (directory / "cpu.max").read_text().split()
            if quota != "max":
                quotas.append(int(quota) / int(period))
        except (OSError, ValueError):
            pass  # no controller here, or unreadable: its parents may still say
        if directory == root or root not in directory.parents:
            return min(quotas, default=None)
        directory = directory.parent


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), no more than its cgroup's quota allows (at least 1)."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_quota()
    return max(1, min(cores, int(quota))) if quota is not None else cores


def share_threads(env: MutableMapping[str, str], processes: int, machine_nodes: int, cores: int) -> str:
    """Set ``OMP_NUM_THREADS`` in ``env`` to each of ``processes`` training processes' share of ``cores`` (the
    machine holding ``machine_nodes`` such nodes), unless the user set it; the words for the node's start line."""
    given = env.get(THREADS_VAR, "").strip()
    if given:
        return f"{THREADS_VAR}={given} as set"
    sharing = processes * machine_nodes
    threads = max(1, cores // sharing)
    env[THREADS_VAR] = str(threads)
    return (f"{plural(threads, 'thread')} per process ({plural(cores, 'core')} / {plural(sharing, 'process')}); "
            f"set {THREADS_VAR} to choose")
