"""The node's hold on its torchrun: started so that it never outlives the node, awaited without busy polling,
and stopped as a group (torchrun and every training process), gently first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Callable


class ExitEvent:
    """Waits for a process to exit without busy polling (a pidfd becomes readable when it does)."""

    def __init__(self, pid: int):
        self.fd = os.pidfd_open(pid)

    def wait(self, timeout: float) -> bool:
        import select

        ready, _, _ = select.select([self.fd], [], [], timeout)
        return bool(ready)

    def close(self) -> None:
        os.close(self.fd)


def die_with_parent() -> Callable[[], object] | None:
    """A pre-exec hook asking Linux to SIGTERM the child if this node dies, so training never outlives it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork: the child only calls it
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


def terminate(proc: subprocess.Popen, grace: float, say: Callable[[str], None]) -> int:
    """SIGTERM to the child's process group, SIGKILL after ``grace`` seconds; its exit status."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        say(f"training did not stop within {grace:g}s of SIGTERM; sending SIGKILL")
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    except ProcessLookupError:
        return proc.wait()
