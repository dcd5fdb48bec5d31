"""The bootstrap's entry in a pod of a Kubeflow PyTorchJob that ``launcher run --dry-run --output pytorchjob``
exported: the node is the spec's node at index 0 for the Master replica and 1 + the replica's index for a Worker
(``LAUNCHER_REPLICA_TYPE``, and ``LAUNCHER_REPLICA_INDEX`` from the operator's ``training.kubeflow.org/replica-index``
label), with its group's own variables from the arguments (:mod:`launcher.node.engines.indexed`).

The training operator puts its own rendezvous into every pod (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
``RANK``, and torchrun's ``PET_*`` defaults, which torchrun would follow for what launcher's command line does not
name: ``PET_RDZV_BACKEND``/``PET_RDZV_ENDPOINT`` would replace its static rendezvous); they are dropped here, said on
the node's console, and the bootstrap sets launcher's from the work dir.

The operator starts a lost replica again under the same pod name; the node claims its name in the work dir
(:func:`launcher.node.identity.claim`, the pod's name as the holder), so a pod that follows one of the same name is
the node's next incarnation. A SIGTERM that no ``launcher cancel`` asked for is a lost node here, as in an Indexed
Job's pod (:data:`launcher.node.sigterm.LOST_ON_SIGTERM`).
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping, NoReturn

from launcher.node.engines import indexed
from launcher.node.sigterm import LOST_ON_SIGTERM
from launcher.protocol.exits import EXIT_BAD_ENV, EXIT_STORE

REPLICA_TYPE = "LAUNCHER_REPLICA_TYPE"
REPLICA_INDEX = "LAUNCHER_REPLICA_INDEX"
POD_NAME = "LAUNCHER_POD_NAME"
NODE_INDEX = "LAUNCHER_NODE_INDEX"
OPERATOR_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def node_index(env: MutableMapping[str, str]) -> int:
    kind, index = env.get(REPLICA_TYPE, ""), env.get(REPLICA_INDEX, "")
    if kind not in ("master", "worker") or not index.isdigit():
        raise ValueError(f"{REPLICA_TYPE}={kind!r} and {REPLICA_INDEX}={index!r}: a PyTorchJob's pod has replica type "
                         "master or worker and the operator's replica index")
    return 0 if kind == "master" else 1 + int(index)


def drop_operator_env(env: MutableMapping[str, str]) -> list[str]:
    """Remove the training operator's rendezvous variables; returns their names."""
    dropped = sorted(name for name in env if name in OPERATOR_ENV or name.startswith("PET_"))
    for name in dropped:
        del env[name]
    return dropped


def main(argv: list[str] | None = None) -> int:
    from launcher.node.identity import JOB_RUN, SERVICE_RANK, IdentityError, claim
    from launcher.protocol.store import StoreError, WorkDir

    args = indexed.group_args(argv, "python -m launcher.node.engines.pytorchjob")
    env = os.environ
    pod = env.get(POD_NAME, "")
    try:
        env[NODE_INDEX] = str(node_index(env))
        name = indexed.name_at(env, NODE_INDEX)
    except (KeyError, ValueError) as exc:
        print(f"launcher node in pod {pod}: cannot tell which node this pod is: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    dropped = drop_operator_env(env)
    if dropped:
        print(f"[launcher {name}] the training operator's {', '.join(dropped)} are not used: the nodes elect the main "
              "and their ranks in the work dir", file=sys.stderr, flush=True)
    indexed.become(env, name, args)
    run_url = f"{env.get('LAUNCHER_WORK_DIR', '').rstrip('/')}/{env.get('LAUNCHER_RUN_ID', '')}"
    try:
        claimed = claim(WorkDir(run_url), [name], name, {JOB_RUN: pod, SERVICE_RANK: env[NODE_INDEX]})
    except (IdentityError, StoreError) as exc:
        print(f"[launcher {name}] could not claim its name in {run_url}: {exc}", file=sys.stderr)
        return EXIT_STORE
    env["LAUNCHER_NODE_INCARNATION"] = str(claimed.incarnation)
    env[LOST_ON_SIGTERM] = "1"
    _exec_bootstrap()


def _exec_bootstrap() -> NoReturn:
    os.execv(sys.executable, [sys.executable, "-m", "launcher.node"])


if __name__ == "__main__":
    sys.exit(main())
