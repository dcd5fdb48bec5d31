"""CPU and memory of a process tree and of the machine, from Linux's /proc (one read of ``stat`` per process).

A tree's CPU time counts, for each live member, its own time and the time of its children it reaped
(``cutime``/``cstime``): a child that ends moves its time into its parent's, so the tree's total only grows,
and the difference between two readings is what the tree used in between, including processes that started
or ended meanwhile.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessStat:
    pid: int
    ppid: int
    cpu_s: float  # its own CPU time and that of the children it reaped
    rss_bytes: int


def read_stat(pid: int, proc: Path = PROC) -> ProcessStat | None:
    """One process's figures; None when it is gone."""
    try:
        with open(proc / str(pid) / "stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        ticks = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        return ProcessStat(pid, int(fields[1]), ticks / CLOCK_TICKS, int(fields[21]) * PAGE_BYTES)
    except (OSError, ValueError, IndexError):
        return None


def tree(processes: dict[int, ProcessStat], root: int) -> list[ProcessStat]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in processes.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    members, pending = [], [root]
    while pending:
        pid = pending.pop()
        if pid in processes:
            members.append(processes[pid])
            pending.extend(children.get(pid, ()))
    return members


class TreeReader:
    """The processes of ``root``'s tree, read again at every call. A process found outside the tree once is not
    read again while it lives (a parent never changes to one inside the tree), so a reading costs a listing of
    /proc and a read per member and per process new since the last reading, not one per process of the machine."""

    def __init__(self, root: int, proc: Path = PROC):
        self.root = root
        self.proc = proc
        self._outside: set[int] = set()

    def read(self) -> dict[int, ProcessStat]:
        listed = {int(entry.name) for entry in os.scandir(self.proc) if entry.name.isdigit()}
        self._outside &= listed
        read = {}
        for pid in listed - self._outside:
            if (stat := read_stat(pid, self.proc)) is not None:
                read[pid] = stat
        members = {stat.pid: stat for stat in tree(read, self.root)}
        self._outside |= read.keys() - members.keys()
        return members


class CpuMeter:
    """CPU use in percent of one core between two readings of the same thing (a tree, a rank)."""

    def __init__(self) -> None:
        self._last: dict[object, tuple[float, float]] = {}

    def percent(self, key: object, cpu_s: float, now: float | None = None) -> float | None:
        """None at the first reading of ``key``."""
        now = time.monotonic() if now is None else now
        previous = self._last.get(key)
        self._last[key] = (cpu_s, now)
        if previous is None or now <= previous[1]:
            return None
        return round(max(0.0, cpu_s - previous[0]) / (now - previous[1]) * 100, 1)

    def keep(self, keys: set) -> None:
        """Forget what is not in ``keys`` (processes that ended)."""
        for key in set(self._last) - keys:
            del self._last[key]


def machine_memory(proc: Path = PROC) -> dict[str, int]:
    """``mem_total_bytes`` and ``mem_available_bytes`` of the machine, where /proc/meminfo says."""
    wanted = {"MemTotal:": "mem_total_bytes", "MemAvailable:": "mem_available_bytes"}
    found = {}
    try:
        with open(proc / "meminfo") as handle:
            for line in handle:
                name, value, *_ = line.split()
                if name in wanted:
                    found[wanted[name]] = int(value) * 1024
    except (OSError, ValueError):
        pass
    return found
