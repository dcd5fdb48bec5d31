"""Where each training process is, without stopping it: its Python stacks, and whether it waits in a collective.

Used when training seems hung. Every training process runs ``rankhooks/sitecustomize.py`` at
start, which has faulthandler write all its threads' stacks to ``{stacks dir}/{local rank}.stack``
when it gets :data:`STACK_SIGNAL`. A rank whose main thread is inside torch.distributed (or in
backward, where DDP's gradient all-reduce runs) is *waiting* for its peers; a rank anywhere else
(user code, data loading, a sleep) is what the others wait for.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.node.diagnosis.cause import library_file
from launcher.procinfo import FROZEN_STATES, process_state, start_time

STACK_SIGNAL = signal.SIGRTMIN + 4  # real-time: no framework we know of uses it (Lightning uses SIGUSR1)
HOOKS_DIR = str(Path(__file__).resolve().parent / "rankhooks")
DUMP_WAIT_SECONDS = 2.0
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>.+)$')
THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$")
# The main thread of a rank that waits for its peers is inside one of these (most recent frame first).
WAITING_IN = ("torch/distributed/", "torch/nn/parallel/distributed.py", "torch/autograd/", "torch/_tensor.py")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class RankStack:
    local_rank: int
    frames: tuple[Frame, ...]  # the main thread's, most recent first

    @property
    def waiting(self) -> bool:
        """In a collective (or in backward, where DDP's all-reduce runs): waiting for the other ranks."""
        return bool(self.frames) and any(part in self.frames[0].file for part in WAITING_IN)

    @property
    def innermost_user_frame(self) -> Frame | None:
        """The most recent frame of the user's code: outside Python's, installed packages', torch's and launcher's
        own files (the line of the user's that called into them)."""
        return next((frame for frame in self.frames if not library_file(frame.file)), None)


def hooks_pythonpath(base_pythonpath: str | None) -> str:
    """PYTHONPATH for the training processes, :func:`capture` needs it: the hooks first."""
    return HOOKS_DIR + (os.pathsep + base_pythonpath if base_pythonpath else "")


def stacks_env(stacks_dir: str) -> dict[str, str]:
    """Where and on which signal the rank hooks write a training process's stacks, for :func:`capture`."""
    return {"LAUNCHER_STACKS_DIR": stacks_dir, "LAUNCHER_STACK_SIGNAL": str(int(STACK_SIGNAL))}


@dataclass(frozen=True)
class Capture:
    stacks: dict[int, RankStack]  # local rank -> its stack, for the processes that answered
    gone: list[int]  # local ranks whose process has ended
    frozen: dict[int, str]  # local rank -> the /proc state of a process that did not answer because it cannot run


def capture(stacks_dir: str, local_ranks: range) -> Capture:
    """Ask every training process of this node for its stacks; what arrives within DUMP_WAIT_SECONDS."""
    asked: dict[int, tuple[int, int]] = {}  # local rank -> (its pid, the size of its file before it was asked)
    gone = []
    for local in local_ranks:
        path = Path(stacks_dir) / f"{local}.stack"
        pid = _pid_of(path)
        if pid is None:
            continue
        size = path.stat().st_size
        try:
            os.kill(pid, STACK_SIGNAL)
        except ProcessLookupError:
            gone.append(local)
            continue
        asked[local] = pid, size
    stacks: dict[int, RankStack] = {}
    previous = {local: size for local, (_, size) in asked.items()}
    deadline = time.monotonic() + DUMP_WAIT_SECONDS
    while len(stacks) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.05)  # faulthandler writes from a signal handler: nothing to wait on but the file's growth
        for local, (_, before) in asked.items():
            path = Path(stacks_dir) / f"{local}.stack"
            size = path.stat().st_size
            if local not in stacks and size > before and size == previous[local]:  # grown, then still
                with path.open(errors="replace") as handle:
                    handle.seek(before)
                    stacks[local] = RankStack(local, main_thread_frames(handle.read()))
            previous[local] = size
    frozen = {local: state for local, (pid, _) in asked.items() if local not in stacks
              and (state := process_state(pid)) in FROZEN_STATES}
    return Capture(stacks, gone, frozen)


def live_training_pids(stacks_dir: str) -> list[int]:
    """This node's training processes still alive: the pid each recorded in its stack file, where that process is
    the one that wrote it, not another that got the pid since: it started before the file was last written (a
    later process could not have), or it carries this node's stacks dir in the environment it started with (a
    warm interpreter, :mod:`launcher.node.torchrun.warmstart`, shows the one it started with before its round)."""
    marker = f"LAUNCHER_STACKS_DIR={stacks_dir}".encode()
    alive = []
    for path in Path(stacks_dir).glob("*.stack"):
        pid = _pid_of(path)
        try:
            written = path.stat().st_mtime
            environ = Path(f"/proc/{pid}/environ").read_bytes() if pid else b""
            started = start_time(pid) if pid else None
        except OSError:
            continue
        if marker in environ.split(b"\0") or (started is not None and started <= written):
            alive.append(pid)
    return alive


def _pid_of(path: Path) -> int | None:
    try:
        with path.open(errors="replace") as handle:
            first = handle.readline().strip()
    except OSError:
        return None
    return int(first[4:]) if first.startswith("pid ") and first[4:].isdigit() else None


def main_thread_frames(dump: str) -> tuple[Frame, ...]:
    """The frames of the thread running the script (it has the ``<module>`` frame; else the thread the
    signal interrupted), most recent first."""
    threads: list[tuple[bool, list[Frame]]] = []
    for line in dump.splitlines():
        if header := THREAD.match(line):
            threads.append((header[1] == "Current thread", []))
        elif (found := FRAME.match(line)) and threads:
            threads[-1][1].append(Frame(found["file"], int(found["line"]), found["function"]))
    for wanted in (lambda current, frames: any(f.function == "<module>" for f in frames),
                   lambda current, frames: current):
        chosen = next((frames for current, frames in threads if wanted(current, frames)), None)
        if chosen:
            return tuple(chosen)
    return ()
