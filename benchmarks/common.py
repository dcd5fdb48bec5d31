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


def timed_run(argv: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    """Run a whole process with its output captured; return (wall seconds, the finished process)."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - started, done


def median(values: list[float]) -> float:
    return statistics.median(values)
