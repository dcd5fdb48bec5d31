"""A torchrun kept ready: started before the node knows its round's ranks, so that a round (the first, and
each one a recovery begins) waits neither for torchrun's imports nor for its training processes' (over a second
of torch each).

The spare is ``python -m launcher.node.torchrun_shim --spare PROCESSES``, started as the node starts torchrun
(its own session, ended with the node), with the environment every round's has (the round's names aside); it
starts one warm interpreter per training process (:mod:`launcher.node.warmstart`), imports torch and waits for
one JSON line on stdin, the command line and environment of the round. Taking it sends them; a node that ends
without taking it closes its stdin and the spare ends quietly. ``LAUNCHER_WARM_START=0`` keeps no spare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from launcher.node.childproc import die_with_parent
from launcher.node.warmstart import warm_starts_on


class Spare:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def prepare(self, processes: int) -> None:
        """Start a spare for ``processes`` training processes unless one is ready (or warm starts are off)."""
        from launcher.node.torchrun import standing_env

        if self.proc is not None or not warm_starts_on(os.environ):
            return
        self.proc = subprocess.Popen([sys.executable, "-m", "launcher.node.torchrun_shim", "--spare", str(processes)],
                                     env=standing_env(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent())

    def take(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen | None:
        """The spare, now running ``argv`` (the shim's command line) with ``env``; None when there is none, or
        it ended meanwhile (the caller starts torchrun afresh)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            if proc.poll() is not None:
                raise BrokenPipeError
            proc.stdin.write(json.dumps({"argv": argv[argv.index("launcher.node.torchrun_shim") + 1:],
                                         "env": env}).encode() + b"\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            _discard(proc)
            return None
        return proc

    def discard(self) -> None:
        """The node ends: a spare nobody took ends too."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _discard(proc)


def _discard(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
    except OSError:
        pass
    if proc.poll() is None:
        proc.kill()  # it holds nothing yet: no reason to wait for its imports to end
    proc.wait()
    proc.stdout.close()
