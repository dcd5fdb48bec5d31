"""The bootstrap's entry in a Slurm task: which node this task is, and whether it sees what the client wrote.

``srun`` starts one task per allocated node with the same command line (:mod:`launcher.backends.slurm.batch`):
each task takes its node name from ``SLURM_NODEID`` in the spec's order (main first), adds its group's own env
(``--main-env NAME=VALUE``, ``--worker-env NAME=VALUE``) and checks that the spec's directory and a local work
dir are the ones the client used, which they are only on a filesystem the nodes share with it. Then it runs
the bootstrap (:mod:`launcher.node.main`) in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

from launcher import node_names
from launcher.node.main import EXIT_BAD_ENV, main as node_main

SHARED_FS_HINT = ("launcher runs your code and meets the other nodes there, so it must be on a filesystem every "
                  "node mounts at the same path as the machine you ran launcher on (your home or a shared "
                  "/scratch on most clusters); or use an s3:// or oci:// work dir")


def node_name(env: dict[str, str]) -> str:
    """This task's node: ``LAUNCHER_NODE_NAME`` where given, else the spec's ``SLURM_NODEID``-th node."""
    if env.get("LAUNCHER_NODE_NAME"):
        return env["LAUNCHER_NODE_NAME"]
    names = node_names.expand([tuple(group) for group in json.loads(env["LAUNCHER_NODE_GROUPS"])])
    index = int(env.get("SLURM_NODEID", "-1"))
    if not 0 <= index < len(names):
        raise ValueError(f"SLURM_NODEID is {env.get('SLURM_NODEID')!r}; the run has nodes 0..{len(names) - 1}")
    return names[index]


def visibility_problem(env: dict[str, str]) -> str | None:
    """Why this machine does not see the run as the client left it (None: it does)."""
    from launcher.workdirs import scheme

    code = env.get("LAUNCHER_CODE_DIR", "")
    if code and not os.path.isdir(code):
        return f"the spec's directory {code} is not on this machine: {SHARED_FS_HINT}"
    work_dir = env.get("LAUNCHER_WORK_DIR", "")
    if work_dir and scheme(work_dir) == "file":
        run = os.path.join(work_dir, env.get("LAUNCHER_RUN_ID", ""))
        if not os.path.isfile(os.path.join(run, "run.json")):
            return f"the work dir {work_dir} on this machine does not hold the run's record ({run}/run.json): " \
                   f"{SHARED_FS_HINT}"
    return None


def slurm_address(node: str) -> str | None:
    """The address Slurm reaches this machine at (its NodeAddr): on clusters, the network the nodes share."""
    try:
        shown = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(token.split("=", 1) for token in shown.stdout.split() if "=" in token)
    address = fields.get("NodeAddr")
    if not address or shown.returncode != 0:
        return None
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.node.slurm")
    parser.add_argument("--main-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    env = os.environ
    try:
        name = node_name(dict(env))
    except (KeyError, ValueError) as exc:
        print(f"launcher node on {socket.gethostname()}: cannot tell which node this task is: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    main_node = node_names.expand([tuple(group) for group in json.loads(env["LAUNCHER_NODE_GROUPS"])])[0]
    for item in args.main_env if name == main_node else args.worker_env:
        key, _, value = item.partition("=")
        env[key] = value
    env["LAUNCHER_NODE_NAME"] = name
    problem = visibility_problem(dict(env))
    if problem:
        print(f"launcher node {name} on {socket.gethostname()}: {problem}", file=sys.stderr)
        return EXIT_BAD_ENV
    os.chdir(env.get("LAUNCHER_CODE_DIR") or os.getcwd())
    if not env.get("LAUNCHER_NODE_ADDRESS") and not any(env.get(v) for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")):
        address = slurm_address(env.get("SLURMD_NODENAME", ""))
        if address:
            env["LAUNCHER_SLURM_NODE_ADDRESS"] = address
    return node_main()


if __name__ == "__main__":
    sys.exit(main())
