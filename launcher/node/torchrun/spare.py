"""A torchrun kept ready: started before the node knows its round's ranks, so that a round (the first, and
each one a recovery begins) waits neither for torchrun's imports nor for its training processes' (over a second
of torch each).

The spare is ``python -u -c RUN_WARM_INTERPRETER --spare PROCESSES`` (:mod:`launcher.node.torchrun.warm_interpreter`, then
:func:`launcher.node.torchrun.shim.run_spare`), started as the node starts torchrun (its own session, ended with
the node), with the environment every round's has (the round's names aside). It imports torch, forks its first
warm interpreter and spawns the others (one per training process, :mod:`launcher.node.torchrun.warmstart`), imports what
torchrun needs and waits for one JSON line on stdin, the command line and environment of the round. Taking it
sends them; a node that ends without taking it closes its stdin and the spare ends quietly.
``LAUNCHER_WARM_START=0`` keeps no spare.

Once its imports are done the spare writes one byte to a pipe of its own (the fd :data:`READY_FD_VAR` names), so
a round that takes it can say whether it saved the whole import or only part of it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from typing import Callable

from launcher.node.torchrun.childproc import die_with_parent
from launcher.node.torchrun.warmstart import RUN_WARM_INTERPRETER, SPARE_ARG, differing, warm_starts_on

READY_FD_VAR = "LAUNCHER_SPARE_READY_FD"


class Spare:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.proc: subprocess.Popen | None = None
        self.ready: int | None = None  # the read end of the spare's pipe: a byte there once its imports are done
        self.env: dict[str, str] = {}  # what it started with: its warm interpreters' environment
        self.say = say  # the node's own lines: where a user reads why a round's processes did not start warm

    def prepare(self, processes: int) -> None:
        """Start a spare for ``processes`` training processes unless one is ready (or warm starts are off)."""
        from launcher.node.torchrun.command import standing_env

        if self.proc is not None or not warm_starts_on(os.environ):
            return
        self.ready, ready_write = os.pipe()
        # Its environment is its warm interpreters': the first is a fork of it, made once torch is imported. It holds
        # OMP_NUM_THREADS (launcher.node.threads), so torchrun's own rule for it changes nothing in a round's.
        self.env = standing_env(os.environ)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-c", RUN_WARM_INTERPRETER, SPARE_ARG, str(processes)],
                env={**self.env, READY_FD_VAR: str(ready_write)},
                pass_fds=(ready_write,),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent())
        except OSError:
            self._close_ready()
            raise
        finally:
            os.close(ready_write)

    def take(self, argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen | None, bool]:
        """The spare, now running ``argv`` (the shim's command line) with ``env``, and whether its imports were
        done when taken; None when there is none, or it ended meanwhile (the caller starts torchrun afresh)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None, False
        imported = bool(select.select([self.ready], [], [], 0)[0])
        self._close_ready()
        changed = differing(self.env, env)
        if changed:  # its torchrun still serves; its warm interpreters do not (torchrun's lines say so, with -v)
            self.say(f"the training processes start afresh, not warm: the round's environment differs in "
                     f"{', '.join(changed)} from the one the spare torchrun started with")
        try:
            if proc.poll() is not None:
                raise BrokenPipeError
            proc.stdin.write(json.dumps({"argv": argv[argv.index("launcher.node.torchrun.shim") + 1:],
                                         "env": env}).encode() + b"\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            _discard(proc)
            return None, False
        return proc, imported

    def discard(self) -> None:
        """The node ends: a spare nobody took ends too."""
        proc, self.proc = self.proc, None
        self._close_ready()
        if proc is not None:
            _discard(proc)

    def _close_ready(self) -> None:
        if self.ready is not None:
            os.close(self.ready)
            self.ready = None


def _discard(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
    except OSError:
        pass
    if proc.poll() is None:
        proc.kill()  # it holds nothing yet: no reason to wait for its imports to end
    proc.wait()
    proc.stdout.close()
