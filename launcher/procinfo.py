"""What Linux's /proc says of a process: when it started (what tells it apart from a later one that got its pid) and
its state."""

from __future__ import annotations

import os
import time


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (exact: two reads of one process agree); None
    when there is no such process, or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


# A process in one of these states cannot run (so, for one, cannot write its stack on a signal): what it is instead.
FROZEN_STATES = {"T": "stopped (SIGSTOP, or a job-control stop)", "t": "stopped by a debugger (traced)",
                 "D": "in uninterruptible sleep (waiting on a disk, a network file system or a device driver)"}


def process_state(pid: int) -> str | None:
    """The one-letter state /proc gives process ``pid`` (``R`` running, ``S`` sleeping, ``T`` stopped, ``t`` traced,
    ``D`` uninterruptible, ``Z`` zombie); None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rindex(b")") + 2:].split()[0].decode()
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> float | None:
    """When process ``pid`` started, as Unix time (to the clock tick); None where /proc cannot say."""
    ticks = start_ticks(pid)
    try:
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if ticks is None else time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
