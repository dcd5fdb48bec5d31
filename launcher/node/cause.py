"""Why training failed, in a few words: the failing rank, its exit status or signal, and the exception.

Sources, best first: torchrun's report of the first observed failure (rank, local rank, exit
code, error file), the error file a script decorated with torch's ``@record`` writes, and
otherwise the last lines that rank wrote to stderr (its traceback).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from launcher.node.exits import killed_by, signal_name

_REPORT_FIELD = re.compile(r"^\s*(rank|exitcode|error_file)\s*:\s*(.*)$")
_RANK = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
LIBRARY_PATHS = ("site-packages", "dist-packages", "/lib/python", "<frozen")


@dataclass
class Cause:
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None  # the shell's status: 128+N for a signal
    signal: str | None = None
    exception: str | None = None  # "ValueError: boom"
    frame: str | None = None  # 'train.py:5 in main: raise ValueError("boom")'
    stderr_tail: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def from_torchrun(report: Iterable[str]) -> Cause:
    """The "Root Cause (first observed failure)" section of torchrun's failure report."""
    cause = Cause()
    in_root = False
    for line in report:
        if "Root Cause" in line:
            in_root = True
            continue
        match = _REPORT_FIELD.match(line) if in_root else None
        if not match:
            continue
        key, value = match.groups()
        if key == "rank":
            numbers = _RANK.match(value.strip())
            if numbers:
                cause.rank = int(numbers.group(1))
                cause.local_rank = int(numbers.group(2)) if numbers.group(2) else None
        elif key == "exitcode":
            code = _RANK.match(value.strip())
            if code:
                status = int(code.group(1))
                if status < 0:
                    cause.signal, cause.exit_code = signal_name(-status), killed_by(-status)
                else:
                    cause.exit_code = status
        elif key == "error_file" and not value.strip().startswith("<"):
            exception, frame = from_error_file(value.strip())
            cause.exception, cause.frame = exception or cause.exception, frame or cause.frame
    return cause


def from_error_file(path: str) -> tuple[str | None, str | None]:
    try:
        with open(path, encoding="utf-8") as handle:
            message = json.load(handle)["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    if isinstance(message, str):
        return message, None
    callstack = (message.get("extraInfo") or {}).get("py_callstack", "")
    _, frame = from_traceback(callstack.splitlines())
    return message.get("message"), frame


def from_traceback(lines: Sequence[str]) -> tuple[str | None, str | None]:
    """The exception line and the innermost frame of user code in the last traceback of ``lines``."""
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
                default=None)
    if start is None:
        return None, None
    exception = None
    frame = None
    block = list(lines[start + 1:])
    for index, line in enumerate(block):
        found = _FRAME.match(line)
        if found and not any(part in found.group(1) for part in LIBRARY_PATHS):
            code = block[index + 1].strip() if index + 1 < len(block) and not _FRAME.match(block[index + 1]) else ""
            frame = f"{found.group(1)}:{found.group(2)} in {found.group(3)}" + (f": {code}" if code else "")
        elif not line.startswith(" ") and line.strip():  # the first unindented line ends the frames
            exception = line.strip()
            break
    return exception, frame


def describe(cause: dict) -> str:
    """``rank 1: ValueError: boom (at train.py:5 in main)`` or ``rank 2 killed by SIGKILL``."""
    who = f"rank {cause['rank']}" if cause.get("rank") is not None else "a training process"
    if cause.get("exception"):
        text = f"{who}: {cause['exception']}"
    elif cause.get("signal"):
        text = f"{who} killed by {cause['signal']}"
        if cause["signal"] == "SIGKILL":
            text += " (often the out-of-memory killer)"
    elif cause.get("exit_code") is not None:
        text = f"{who} exited with status {cause['exit_code']}"
    else:
        text = who
    return text + (f"\n    at {cause['frame']}" if cause.get("frame") else "")
