"""The batch script's ``srun``, out of reach of the signals a cancel sends the batch script's processes.

An ``scancel`` from outside signals every process of the batch step, srun among them, and srun takes a SIGTERM of
its own as the order to SIGKILL its tasks at once: the nodes, which Slurm signals too and gives KillWait to stop,
would be killed while they save, record their end and sync their outputs. So srun runs in a process that is
neither in the batch script's process tree nor in its session (what Slurm's proctrack/linuxproc and
proctrack/pgid signal); this process, the batch script's own, waits for it and exits with its status. Where
Slurm tracks the step's processes by cgroup (proctrack/cgroup), srun is still signalled.

Usage: ``python -m launcher.node.engines.slurm_srun srun ARGS...``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def run_detached(argv: list[str]) -> int:
    """Run ``argv`` in a new session whose parent leaves at once; wait for its end through a pipe and return its
    exit status (128 + N for a signal N, as a shell says it)."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(read_end)
        os.setsid()
        if os.fork() == 0:
            code = subprocess.call(argv)
            os.write(write_end, str(128 - code if code < 0 else code).encode())
            os._exit(0)
        os._exit(0)  # the keeper's parent is gone: it is no longer in this process's tree
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cancel's SIGTERM: srun and its tasks decide the end
    os.close(write_end)
    os.waitpid(first, 0)
    said = b""
    while chunk := os.read(read_end, 64):
        said += chunk
    return int(said) if said.isdigit() else 1  # nothing said: the keeper was killed


if __name__ == "__main__":
    sys.exit(run_detached(sys.argv[1:]))
