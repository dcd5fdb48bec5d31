"""The bootstrap's entry in a pod of the run's Indexed Job: the node is the spec's node at the pod's
``JOB_COMPLETION_INDEX`` (index 0 the main), with its group's own variables from the arguments
(:mod:`launcher.node.engines.indexed`); then the bootstrap (:mod:`launcher.node.main`) replaces this process, so that
the container's exit status is the node's. A pod that starts its index again after a lost one is the node's
next incarnation (``LAUNCHER_NODE_INCARNATION``, from the Job controller's failure count of the index). A SIGTERM
that no ``launcher cancel`` asked for (``kubectl delete pod``, a drained node) makes the node lost, exit 143, which the
Job's podFailurePolicy counts as a lost pod of its index (:data:`launcher.node.sigterm.LOST_ON_SIGTERM`)."""

from __future__ import annotations

import os
import socket
import sys
from typing import NoReturn

from launcher.node.engines import indexed
from launcher.node.sigterm import LOST_ON_SIGTERM
from launcher.node.main import EXIT_BAD_ENV

INDEX = "JOB_COMPLETION_INDEX"


def main(argv: list[str] | None = None) -> int:
    args = indexed.group_args(argv, "python -m launcher.node.engines.kubernetes")
    env = os.environ
    try:
        name = indexed.name_at(env, INDEX)
    except (KeyError, ValueError) as exc:
        print(f"launcher node in pod {socket.gethostname()}: cannot tell which node this pod is: {exc}",
              file=sys.stderr)
        return EXIT_BAD_ENV
    indexed.become(env, name, args)
    env[LOST_ON_SIGTERM] = "1"  # a pod deleted from outside is a lost node: the Job starts its index again
    _exec_bootstrap()


def _exec_bootstrap() -> NoReturn:
    os.execv(sys.executable, [sys.executable, "-m", "launcher.node"])


if __name__ == "__main__":
    sys.exit(main())
