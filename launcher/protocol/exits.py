"""The node's exit statuses (see :mod:`launcher.node.main`), and how a process that ended by a signal is reported:
the shell's status 128+N and the signal's name."""

from __future__ import annotations

import signal

EXIT_PEER_FAILED = 1
EXIT_BAD_ENV = 2
EXIT_STORE = 3
EXIT_TIMED_OUT = 124  # maxRuntime or the hang watchdog, as timeout(1) reports it
EXIT_CANCELLED = 130
# 128 + SIGTERM: stopped from outside where the engine counts that as a lost node (a Kubernetes pod deleted: see
# launcher.node.sigterm.LOST_ON_SIGTERM); its Job starts the node again
EXIT_LOST = 143


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def killed_by(signum: int) -> int:
    """The exit status a shell reports for a process killed by ``signum``."""
    return 128 + signum
