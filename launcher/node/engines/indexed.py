"""A node started by an engine that runs the same command on every node and numbers them (Slurm's
``SLURM_NODEID``, a Kubernetes Indexed Job's ``JOB_COMPLETION_INDEX``): its name is the spec's node at that
index (main first), and what its group has of its own comes as arguments (``--main-env NAME=VALUE``,
``--worker-env NAME=VALUE``), since every node gets the same environment."""

from __future__ import annotations

import argparse
import json
from typing import MutableMapping, Sequence

from launcher import node_names


def spec_names(env: MutableMapping[str, str]) -> list[str]:
    """The run's nodes in the spec's order, main first."""
    return node_names.expand([tuple(group) for group in json.loads(env["LAUNCHER_NODE_GROUPS"])])


def name_at(env: MutableMapping[str, str], index_variable: str) -> str:
    """This node's name: the spec's node at the index the engine put in ``index_variable``."""
    names = spec_names(env)
    index = int(env.get(index_variable, "-1"))
    if not 0 <= index < len(names):
        raise ValueError(f"{index_variable} is {env.get(index_variable)!r}; the run has nodes 0..{len(names) - 1}")
    return names[index]


def group_args(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--main-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE")
    return parser.parse_args(argv)


def become(env: MutableMapping[str, str], name: str, args: argparse.Namespace) -> None:
    """Give ``env`` node ``name``'s identity: its name and its group's own variables."""
    for item in args.main_env if name == spec_names(env)[0] else args.worker_env:
        key, _, value = item.partition("=")
        env[key] = value
    env["LAUNCHER_NODE_NAME"] = name


def group_argv(groups: dict[str, dict[str, str]]) -> list[str]:
    """The arguments that carry each group's own variables (the inverse of :func:`become`)."""
    argv: list[str] = []
    for group, env in groups.items():
        for name, value in env.items():
            argv += [f"--{group}-env", f"{name}={value}"]
    return argv

