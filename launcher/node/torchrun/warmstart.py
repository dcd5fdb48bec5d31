"""Inside the spare torchrun: training processes started before the round needs them.

A training process started the usual way (``python -u train.py``) spends over a second importing torch before
the script's first line, on every start: the first round and every round a recovery begins. The spare torchrun
(:mod:`launcher.node.torchrun.spare`) gets one warm interpreter per training process of its node ready as it starts
(:mod:`launcher.node.torchrun.warm_interpreter`: an interpreter that has imported torch and waits): the first it forks
from itself once torch is imported, the others it spawns (:class:`WarmPool`). When torchrun then starts its
processes, each takes a warm one and hands it its script, environment and output.

A warm interpreter is used only where it is what a fresh start would be: ``python -u SCRIPT`` or
``python -u -m MODULE`` (``--no-python`` programs start as before) and an environment that differs from the one
it started with only in names read while training runs, never at a start (the ranks torchrun and launcher
give, :data:`ROUND_NAMES`; the socket interfaces, :data:`PROCESS_GROUP_NAMES`). Anything else starts the usual
way, and the node says why in its own lines (:mod:`launcher.node.torchrun.spare`). ``LAUNCHER_WARM_START=0`` turns warm
starts off (no spare torchrun either).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from typing import IO, Any, Mapping

WARM_START_ENV = "LAUNCHER_WARM_START"
SPARE_ARG = "--spare"  # the warm interpreter's file, given it, is the spare torchrun (launcher.node.torchrun.spare)
OFF = ("0", "false", "no", "off")
# What torchrun (its local agent) and launcher's node set for each training process: read as it runs (by
# torch.distributed, by the script), never by the interpreter's or a library's start.
ROUND_NAMES = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NODE_RANK", "NNODES",
})
ROUND_PREFIXES = ("TORCHELASTIC_", "LAUNCHER_")
# What the node sets once it has chosen its address (launcher.node.netutil), after its spare started: the socket
# interfaces of the process group's traffic. Importing torch reads neither; gloo reads GLOO_SOCKET_IFNAME as a
# process group creates its device, NCCL reads NCCL_SOCKET_IFNAME as its first communicator starts: both once
# the script runs, with the environment the warm interpreter was given by then.
PROCESS_GROUP_NAMES = frozenset({"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"})
_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_interpreter.py")
# The file as the interpreter's own __main__ (see launcher.node.torchrun.warm_interpreter: not imported as launcher's module)
RUN_WARM_INTERPRETER = f"exec(compile(__import__('pathlib').Path({_PROGRAM!r}).read_text(), {_PROGRAM!r}, 'exec'))"


def differing(started: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The names, of those a start may read, in which ``env`` differs from ``started`` (a warm interpreter's or
    a spare's environment): none, and a training process with ``env`` may be that warm interpreter."""
    return sorted(name for name in set(env) | set(started) if env.get(name) != started.get(name)
                  and name not in ROUND_NAMES and name not in PROCESS_GROUP_NAMES
                  and not name.startswith(ROUND_PREFIXES))


def warm_starts_on(env: Mapping[str, str]) -> bool:
    """Whether ``env`` leaves warm starts on (the default): LAUNCHER_WARM_START=0 (false, no, off) turns them off."""
    return env.get(WARM_START_ENV, "1").strip().lower() not in OFF


class WarmInterpreter:
    """One interpreter importing torch, ours until a training process is started with it."""

    def __init__(self, env: Mapping[str, str], proc: subprocess.Popen | ForkedProcess, channel: socket.socket):
        self.env = dict(env)
        self.proc = proc
        self.channel = channel

    @classmethod
    def spawned(cls, env: Mapping[str, str]) -> WarmInterpreter:
        """A fresh ``python -u`` of its own: its own session (torchrun stops a process by its group, as it would one
        it started), stdin as a spare's training process would have it, ended with torchrun's process while unused."""
        from launcher.node.torchrun.childproc import die_with_parent

        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-u", "-c", RUN_WARM_INTERPRETER, str(theirs.fileno())],
                                env=dict(env), stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                start_new_session=True, preexec_fn=die_with_parent())
        theirs.close()
        return cls(env, proc, ours)

    def start(self, entry: tuple[str, str], args: list[str], env: Mapping[str, str],
              stdout: IO | None, stderr: IO | None) -> subprocess.Popen | None:
        """This interpreter, now running ``entry`` with ``args``; None if it ended meanwhile."""
        outputs = [(target, stream.fileno()) for target, stream in ((1, stdout), (2, stderr)) if stream is not None]
        command = {"kind": entry[0], "name": entry[1], "args": args, "env": dict(env), "cwd": os.getcwd(),
                   "outputs": [target for target, _ in outputs]}
        body = json.dumps(command).encode()
        try:
            sent = socket.send_fds(self.channel, [body], [fd for _, fd in outputs])
            self.channel.sendall(body[sent:])
        except OSError:  # it ended (killed) before its rank came: the caller starts one afresh
            self.discard()
            return None
        finally:
            self.channel.close()
        return self.proc

    def discard(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()  # it holds nothing yet; waiting for its end would wait for its imports
        self.proc.wait()


class ForkedProcess:
    """What torchrun and launcher ask of a ``Popen``, for the warm interpreter the spare torchrun forked (its child,
    see :func:`launcher.node.torchrun.warm_interpreter.fork_interpreter`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.args = [sys.executable, "-u", "-c", RUN_WARM_INTERPRETER]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None and timeout is not None:
            from launcher.node.torchrun.childproc import ExitEvent

            exited = ExitEvent(self.pid)
            try:
                if not exited.wait(timeout):
                    raise subprocess.TimeoutExpired(self.args, timeout)
            finally:
                exited.close()
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # reaped elsewhere: its status is lost, as Popen has it then
            self.returncode = 0
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


class WarmPool:
    """The warm interpreters of one torchrun, taken in the order torchrun starts its processes: in a spare torchrun,
    the first is the one it forked (``forked``: its pid and our end of its socket), the others spawned."""

    def __init__(self, count: int, env: Mapping[str, str], forked: tuple[int, socket.socket] | None = None) -> None:
        first = [WarmInterpreter(os.environ, ForkedProcess(forked[0]), forked[1])] if forked else []
        self.ready = first + [WarmInterpreter.spawned(env) for _ in range(count - len(first))]

    def take(self, env: Mapping[str, str]) -> WarmInterpreter | None:
        while self.ready:
            warm = self.ready.pop(0)
            differ = differing(warm.env, env)
            if not differ:
                return warm
            print(f"[launcher] a training process starts afresh: its environment differs in {', '.join(differ)} "
                  "from the one its warm interpreter started with", file=sys.stderr, flush=True)
            warm.discard()
        return None

    def close(self) -> None:
        """torchrun ends: interpreters no round took end too."""
        for warm in self.ready:
            warm.discard()
        self.ready.clear()


def entry_of(args: tuple) -> tuple[str, str] | None:
    """("script" | "module", its name) when torchrun starts ``args`` as this interpreter, unbuffered."""
    if len(args) < 3 or args[0] != sys.executable or args[1] != "-u":
        return None
    if args[2] == "-m":
        return ("module", args[3]) if len(args) > 3 else None
    return None if args[2].startswith("-") else ("script", args[2])


def install(pool: WarmPool) -> None:
    """Make torchrun start its training processes from ``pool`` where it can (call before it starts them)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    usual = subprocess_handler.SubprocessHandler._popen

    def popen(handler: Any, args: tuple, env: dict[str, str]) -> Any:
        entry = entry_of(args)
        warm = pool.take(env) if entry is not None else None
        started = warm and warm.start(entry, [str(arg) for arg in args[4 if entry[0] == "module" else 3:]], env,
                                      handler._stdout, handler._stderr)
        return started or usual(handler, args, env)

    subprocess_handler.SubprocessHandler._popen = popen
