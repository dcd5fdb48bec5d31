"""Inside torchrun: training processes forked from torchrun's own process, which has torch imported already.

A training process started the usual way (``python -u train.py``) spends over a second importing torch before
the script's first line, on every start: the first round and every round a recovery begins. torchrun's
process has imported it; a fork of it starts the script at once, sharing those pages. The child becomes what
a fresh ``python -u`` would be for the script: its own session (torchrun stops a process by its group), the
environment and output torchrun gave it, the script's directory first on ``sys.path``, signals at their
defaults, fresh random seeds, torch's thread count from ``OMP_NUM_THREADS`` (OpenMP read it when torchrun's
process loaded torch), launcher's rank hooks; at its end ``atexit`` runs and files it left open are flushed,
as a fresh interpreter's end would do, before ``os._exit`` (it must never return into torchrun's code).

Only ``python -u SCRIPT`` and ``python -u -m MODULE`` are forked; ``--no-python`` programs start as before, and
Forking is opt-in, ``LAUNCHER_WARM_START=fork``: a new-user trial found programs it breaks (a DataLoader with
worker processes hung; a class defined in ``__main__`` did not unpickle in a spawned child; threads still
running at the script's end were cut off). Without it every process starts the usual way.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import weakref
from types import TracebackType
from typing import Any

WARM_START_ENV = "LAUNCHER_WARM_START"  # "fork": fork training processes; "0": no spare torchrun either
HOOKS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rankhooks", "sitecustomize.py")
_RESET_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)


class ForkedProcess:
    """What torchrun asks of a ``subprocess.Popen``, for a child forked here: its pid, poll and wait."""

    def __init__(self, pid: int, args: tuple) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen's: raises subprocess.TimeoutExpired after ``timeout`` seconds."""
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)  # waitpid has no timeout; torchrun waits here only while stopping its processes
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


def forkable(args: tuple) -> tuple[str, str] | None:
    """("script" | "module", its name) when ``args`` is this interpreter running a script or module unbuffered."""
    if os.environ.get(WARM_START_ENV) != "fork" or len(args) < 3 or args[0] != sys.executable or args[1] != "-u":
        return None
    if args[2] == "-m":
        return ("module", args[3]) if len(args) > 3 else None
    return None if args[2].startswith("-") else ("script", args[2])


def install() -> None:
    """Make torchrun fork the training processes it can (call before torchrun starts them)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    usual = subprocess_handler.SubprocessHandler._popen

    def popen(handler: Any, args: tuple, env: dict[str, str]) -> Any:
        entry = forkable(args)
        if entry is None:
            return usual(handler, args, env)
        return start(entry, [str(arg) for arg in args[4 if entry[0] == "module" else 3:]], env,
                     handler._stdout, handler._stderr, args)

    subprocess_handler.SubprocessHandler._popen = popen


def start(entry: tuple[str, str], script_args: list[str], env: dict[str, str], stdout: Any, stderr: Any,
          args: tuple) -> ForkedProcess:
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # torchrun's objects stay out of the child's collections: none of theirs is finalised there
    pid = os.fork()
    if pid == 0:
        _become(entry, script_args, env, stdout, stderr)  # never returns
    return ForkedProcess(pid, args)


def _become(entry: tuple[str, str], script_args: list[str], env: dict[str, str], stdout: Any, stderr: Any) -> None:
    code = 1
    try:
        _prepare(entry, script_args, env, stdout, stderr)
        code = _run(entry)
    finally:  # whatever happens, the child never returns into torchrun's code
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _prepare(entry: tuple[str, str], script_args: list[str], env: dict[str, str], stdout: Any, stderr: Any) -> None:
    import io
    import random

    os.setsid()
    for finalizer in list(weakref.finalize._registry):  # torchrun's cleanups at exit are not the child's to run
        finalizer.atexit = False
    for signum in _RESET_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, stream in ((1, stdout), (2, stderr)):
        os.dup2(stream.fileno() if stream is not None else target, target)
    os.closerange(3, _max_fd())  # torchrun's sockets and files (its store's port among them) are not the child's
    os.environ.clear()
    os.environ.update(env)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    sys.argv = [entry[1] if entry[0] == "script" else "-m", *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(entry[1])) if entry[0] == "script" else os.getcwd()
    wanted = [os.path.abspath(part) for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
    sys.path[1:1] = [part for part in wanted if part not in sys.path]  # as a fresh start would put them
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    _run_rank_hooks()


def _run_rank_hooks() -> None:
    """What a fresh interpreter's start runs from launcher's rank hooks (the stack dump on a signal)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("launcher_rank_hooks", HOOKS_FILE)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _run(entry: tuple[str, str]) -> int:
    """The script or module as ``__main__``; its exit status as the interpreter would give it."""
    import atexit
    import runpy
    import types

    try:
        if entry[0] == "script":
            _run_script(entry[1])
        else:  # what `python -m` calls, its errors ("No module named ...") included, in a fresh __main__
            sys.modules["__main__"] = types.ModuleType("__main__")
            runpy._run_module_as_main(entry[1], alter_argv=True)
        code = 0
    except SystemExit as stop:
        code = _exit_status(stop.code)
    except BaseException as raised:
        users = _users_part(raised.__traceback__)
        sys.excepthook(type(raised), raised.with_traceback(users), users)  # the hook prints the exception's own
        code = 1
    atexit._run_exitfuncs()
    _flush_open_files()
    return code


def _flush_open_files() -> None:
    """What a fresh interpreter's finalisation would write: files the script left open and unflushed (the child
    ends with os._exit, never returning into torchrun's code)."""
    import io

    for candidate in gc.get_objects():  # the child's own: torchrun's were frozen before the fork
        if isinstance(candidate, io.IOBase):
            try:
                if not candidate.closed and candidate.writable():
                    candidate.flush()
            except (OSError, ValueError):
                pass


def _run_script(script: str) -> None:
    """As ``python script.py`` runs it: compiled under its absolute name (so since Python 3.9), executed in a
    fresh ``__main__`` module, ``sys.argv[0]`` left as given."""
    import builtins
    import io
    import types

    path = os.path.abspath(script)
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__, main.__cached__ = path, builtins, None
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _users_part(traceback: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's own first frame, as a fresh interpreter shows it (this module's and
    runpy's frames dropped; none left for a script that did not compile)."""
    while traceback is not None and (traceback.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                                     or traceback.tb_frame.f_code.co_filename.endswith("runpy.py")):
        traceback = traceback.tb_next
    return traceback


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 65536
