"""Small helpers shared by the benchmarks."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed_process(argv: list[str], **kwargs) -> tuple[float, float, int]:
    """Run a whole process; return (wall seconds, peak RSS MiB of the process, exit status)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_maxrss / 1024, proc.returncode


def median(values: list[float]) -> float:
    return statistics.median(values)
