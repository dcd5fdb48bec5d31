"""How a process that ended by a signal is reported: the shell's status 128+N and the signal's name."""

from __future__ import annotations

import signal


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def killed_by(signum: int) -> int:
    """The exit status a shell reports for a process killed by ``signum``."""
    return 128 + signum
