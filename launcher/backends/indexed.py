"""What backends share that start every node with one command and one environment and let each node take its
name from the index the engine gives it (Slurm, a Kubernetes Indexed Job; :mod:`launcher.node.engines.indexed`): the
variables every node has, and what each group has of its own, which goes on the command line."""

from __future__ import annotations

from typing import Mapping, Sequence

from launcher.plan import NodeConfig, Plan


def shared_env(nodes: Sequence[NodeConfig]) -> dict[str, str]:
    """The variables every node has with the same value."""
    first = dict(nodes[0].env)
    return {name: value for name, value in first.items() if all(node.env.get(name) == value for node in nodes[1:])}


def group_env(plan: Plan, shared: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per group, what its nodes have beyond ``shared`` (their own name aside, which each node works out)."""
    groups: dict[str, dict[str, str]] = {}
    for node in plan.nodes:
        own = {name: value for name, value in node.env.items()
               if shared.get(name) != value and name != "LAUNCHER_NODE_NAME"}
        groups.setdefault(node.group, own)
    return groups
