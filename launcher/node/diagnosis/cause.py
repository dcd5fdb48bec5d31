"""Why training failed, in a few words: the failing rank, its exit status or signal, and the exception.

torchrun's failure report lists every failed rank of this node (rank, local rank, exit code, error
file), the first one it saw end as the root cause. Each one's exception and innermost frame of user
code come from the error file a script decorated with torch's ``@record`` writes, else from the last
lines that rank wrote to stderr: a traceback (whatever prefix its lines carry: torch adds
``[rank3]: `` once a process group exists; output written without a newline, input()'s prompt, may
stand before its header), a SyntaxError's caret block, or the one line
``python -m`` prints when there is nothing to run. The frame is the user's own line: frames in
Python's files, an installed package's, torch's or launcher's own (a refusal of ``launcher.data``
raised under the user's ``for batch in loader``) are the library's, not the place to fix.

The rank torchrun saw end first is not always the one that failed first: a rank that only lost a
peer (a gloo or NCCL connection error) often ends before the rank that raised has finished
exiting. Such a cause gives way to another failed rank of this node with an exception of its own.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping, Sequence

from launcher.protocol.exits import killed_by, signal_name

_ENTRY = re.compile(r"^\[\d+\]:\s*$")  # "[0]:" opens one failure of torchrun's report
_REPORT_FIELD = re.compile(r"^\s*(rank|exitcode|error_file)\s*:\s*(.*)$")
_NUMBER = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'  File "(.+)", line (\d+)(?:, in (.+))?$')  # no "in" for a SyntaxError's location
_MARKERS = re.compile(r"^\s*[~^]+\s*$")  # Python 3.11's "    ^^^^^" under the part of a frame's code that failed
_RUNPY = re.compile(r"^\S*python[\d.]*: (.+)$")  # "/usr/bin/python3: No module named pkg"
# What a rank prints when a peer it waits on is gone: consequences, not causes.
_PEER_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe|remote process exited|"
                        r"communicator was aborted|collective operation timeout|Timed out waiting|"
                        r"Dist(Backend|Network|Store)Error")
LIBRARY_PATHS = ("site-packages", "dist-packages", "/lib/python", "<frozen")
# Packages whose files are libraries wherever they lie (an editable install, a checkout on PYTHONPATH, an
# image's copy): launcher itself (launcher.data runs inside the training processes) and torch.
LIBRARY_PACKAGES = ("launcher", "torch")
STDERR_TAIL_LINES = 10  # kept in the cause, for the status record and failure marker
# What libstdc++ prints when a process ends with a thread still running: at exit, most often a process group
# that was never destroyed (gloo's threads outlive Python's interpreter), after training itself went well.
_ABORTED_AT_EXIT = "terminate called without an active exception"


@dataclass
class Cause:
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None  # the shell's status: 128+N for a signal
    signal: str | None = None
    exception: str | None = None  # "ValueError: boom"
    frame: str | None = None  # 'train.py:5 in main: raise ValueError("boom")'
    stderr_tail: list[str] = field(default_factory=list)
    torchrun: bool = False  # torchrun itself failed (a busy port, ...): no training process ran

    def to_dict(self) -> dict:
        return asdict(self)


def diagnose(report: Iterable[str], stderr_tails: Mapping[int, Sequence[str]], torchrun_code: int | None = None
             ) -> Cause:
    """This node's cause: torchrun's root cause, unless that rank only lost a peer and another raised; with no
    failure report, torchrun's own error (it failed before or around its training processes), or the signal that
    killed it (``torchrun_code``, its process's return code, negative for a signal)."""
    report = list(report)
    failures = from_torchrun(report)
    for cause in failures:
        tail = list(stderr_tails.get(cause.local_rank, ())) if cause.local_rank is not None else []
        cause.stderr_tail = tail[-STDERR_TAIL_LINES:]
        if cause.exception is None:
            cause.exception, frame = from_stderr(tail)
            cause.frame = cause.frame or frame
    if not failures:
        exception, frame = from_stderr(report)
        if exception is None and torchrun_code is not None and torchrun_code < 0:  # killed: it could report nothing
            return Cause(exit_code=killed_by(-torchrun_code), signal=signal_name(-torchrun_code),
                         stderr_tail=report[-STDERR_TAIL_LINES:], torchrun=True)
        return Cause(exception=exception, frame=frame, stderr_tail=report[-STDERR_TAIL_LINES:],
                     torchrun=exception is not None)
    root = failures[0]
    if not lost_a_peer(root):
        return root
    return next((cause for cause in failures[1:] if cause.exception and not lost_a_peer(cause)), root)


def lost_a_peer(cause: Cause) -> bool:
    """The rank failed because a peer it waited on is gone (its error names the connection, not a cause)."""
    return bool(cause.exception and _PEER_LOST.search(cause.exception))


def from_torchrun(report: Iterable[str]) -> list[Cause]:
    """Every failure in torchrun's failure report, its "Root Cause (first observed failure)" first."""
    failures: list[Cause] = []
    root = 0
    in_root = False
    for line in report:
        if "Root Cause" in line:
            in_root = True
        elif _ENTRY.match(line):
            root = len(failures) if in_root else root
            failures.append(Cause())
        elif failures:
            _read_field(failures[-1], line)
    return failures[root:root + 1] + failures[:root] + failures[root + 1:]


def _read_field(cause: Cause, line: str) -> None:
    match = _REPORT_FIELD.match(line)
    if not match:
        return
    key, value = match.group(1), match.group(2).strip()
    number = _NUMBER.match(value)
    if key == "rank" and number:
        cause.rank = int(number.group(1))
        cause.local_rank = int(number.group(2)) if number.group(2) else None
    elif key == "exitcode" and number:
        status = int(number.group(1))
        if status < 0:
            cause.signal, cause.exit_code = signal_name(-status), killed_by(-status)
        else:
            cause.exit_code = status
    elif key == "error_file" and not value.startswith("<"):
        cause.exception, cause.frame = from_error_file(value)


def from_error_file(path: str) -> tuple[str | None, str | None]:
    """The exception and user frame in the error file torch's ``@record`` writes."""
    try:
        with open(path, encoding="utf-8") as handle:
            message = json.load(handle)["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    if isinstance(message, str):
        return message, None
    callstack = (message.get("extraInfo") or {}).get("py_callstack", "")
    _, frame = from_stderr(callstack.splitlines())
    return message.get("message"), frame


def from_stderr(lines: Sequence[str]) -> tuple[str | None, str | None]:
    """The exception line and the innermost frame of user code of the last error report in ``lines``."""
    block = _last_traceback(lines)
    if block is None:
        said = next((found.group(1) for found in map(_RUNPY.match, reversed(lines)) if found), None)
        return said, None
    exception = None
    frame = None
    for index, line in enumerate(block):
        found = _FRAME.match(line)
        if found:
            if not library_file(found.group(1)):
                code = block[index + 1] if index + 1 < len(block) else ""
                frame = _frame_text(*found.groups(), code.strip() if code.startswith("    ") else "")
        elif line.strip() and not line.startswith(" ") and not _MARKERS.match(line):
            exception = line.strip()  # the first unindented line, not a frame's markers, ends the frames
            break
    return exception, frame


def library_file(path: str) -> bool:
    """A file of Python's, of an installed package, or of launcher's or torch's own (see LIBRARY_PACKAGES), as a
    traceback or a stack names it: not the user's code. A package's file is recognised under the directory
    this process imports it from, or as ``.../launcher/<a file of that package>`` (the same package at another
    place: a relative path, another installation of it)."""
    if any(part in path for part in LIBRARY_PATHS):
        return True
    parts = PurePosixPath(path).parts
    for package, directory in _package_dirs():
        if path.startswith(f"{directory}/") or path.startswith(f"{directory.resolve()}/"):
            return True
        for index, part in enumerate(parts[:-1]):
            if part == package and (directory / Path(*parts[index + 1:])).is_file():
                return True
    return False


@lru_cache(maxsize=None)
def _package_dirs() -> tuple[tuple[str, Path], ...]:
    """(name, directory) of each of LIBRARY_PACKAGES this Python can import, found without importing it."""
    found = []
    for package in LIBRARY_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.append((package, Path(location)))
    return tuple(found)


def _last_traceback(lines: Sequence[str]) -> list[str] | None:
    """The lines after the last traceback header, or from the first frame when there is no header (a
    SyntaxError's report, a tail that lost its top), each without the prefix the header or frame has."""
    header = next((i for i in range(len(lines) - 1, -1, -1) if _HEADER in lines[i]), None)
    if header is not None:
        # The prefix's width is read off the first frame, not the header: output written without a newline
        # (input()'s prompt) can stand before the header on its line.
        block = lines[header + 1:]
        frame = next((found for found in map(_FRAME.search, block) if found), None)
        width = frame.start() if frame else lines[header].index(_HEADER)
        return [line[width:] for line in block]
    for index, line in enumerate(lines):
        found = _FRAME.search(line)
        if found:
            return [line[found.start():] for line in lines[index:]]
    return None


def _frame_text(path: str, line: str, function: str | None, code: str) -> str:
    return f"{path}:{line}" + (f" in {function}" if function else "") + (f": {code}" if code else "")


def describe_kill(cause: Cause) -> str:
    """``rank 1's training process was killed (SIGKILL)``: a rank ended by a signal from outside, its node alive."""
    who = f"rank {cause.rank}'s" if cause.rank is not None else "a"
    hint = ", often the out-of-memory killer" if cause.signal == "SIGKILL" else ""
    return f"{who} training process was killed ({cause.signal}{hint})"


def describe(cause: dict) -> str:
    """``rank 1: ValueError: boom (at train.py:5 in main)`` or ``rank 2 killed by SIGKILL``."""
    who = (f"rank {cause['rank']}" if cause.get("rank") is not None
           else "torchrun" if cause.get("torchrun") else "a training process")
    if cause.get("exception"):
        text = f"{who}: {cause['exception']}"
    elif cause.get("signal"):
        text = f"{who} killed by {cause['signal']}"
        if cause["signal"] == "SIGKILL":
            text += " (often the out-of-memory killer)"
        elif cause["signal"] == "SIGABRT" and any(_ABORTED_AT_EXIT in line for line in cause.get("stderr_tail", ())):
            text += (" as it exited, with threads still running (often a process group left open: "
                     "call dist.destroy_process_group() before the program ends)")
    elif cause.get("exit_code") is not None:
        text = f"{who} exited with status {cause['exit_code']}"
    else:
        text = who
    return text + (f"\n    at {cause['frame']}" if cause.get("frame") else "")
