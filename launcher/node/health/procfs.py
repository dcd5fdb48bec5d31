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
CGROUPS = Path("/sys/fs/cgroup")
# where each cgroup version keeps the time its CPU controller held a group back under a quota, and its unit
V2_THROTTLED, V1_THROTTLED = ("throttled_usec", 1e-6), ("throttled_time", 1e-9)
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


def throttled_s(pid: int, proc: Path = PROC, cgroups: Path = CGROUPS) -> float | None:
    """Seconds that a CPU quota (``cpu.max``; v1 ``cpu.cfs_quota_us``) held back the cgroup of process ``pid`` and
    its ancestors, so far: a process's CPU share says nothing of a quota, and a throttled rank's looks like its
    peers'. None where no cgroup of it has a CPU controller this process can read."""
    try:
        memberships = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for membership in memberships:
        _, controllers, path = membership.split(":", 2)
        if controllers == "":  # the unified hierarchy (v2): at the root, or under unified/ beside v1 ones
            places = [(cgroups, V2_THROTTLED), (cgroups / "unified", V2_THROTTLED)]
        elif "cpu" in controllers.split(","):
            places = [(cgroups / controllers, V1_THROTTLED)]
        else:
            continue
        for mount, (key, unit) in places:
            found = _throttled_along(mount, Path(path.lstrip("/")), key)
            if found is not None:
                return found * unit
    return None


def _throttled_along(mount: Path, path: Path, key: str) -> int | None:
    """``key``'s sum in cpu.stat of the cgroup at ``path`` under ``mount`` and of every ancestor's."""
    total, found = 0, False
    for group in (path, *path.parents):
        try:
            lines = (mount / group / "cpu.stat").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                total, found = total + int(value), True
    return total if found else None


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
