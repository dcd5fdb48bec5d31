"""Small helpers shared by the benchmarks."""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCHX_VENV = REPO / "benchmarks" / ".venv-torchx"


def scratch_dir(prefix: str) -> Path:
    """A temporary directory removed when the benchmark exits (also after a failed measurement)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


def torchx_bin() -> Path:
    """TorchX 0.7.0's command, installed into its own venv the first time (it must not change launcher's)."""
    binary = TORCHX_VENV / "bin" / "torchx"
    if not binary.exists():
        print("installing torchx==0.7.0 into benchmarks/.venv-torchx ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(TORCHX_VENV)
        subprocess.run([str(TORCHX_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "torchx==0.7.0"],
                       check=True)
    return binary


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


def print_table(header: list[str], rows: list[list[object]]) -> None:
    """A Markdown table (as the docs show the figures), after a blank line; nothing when there are no rows."""
    if not rows:
        return
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
