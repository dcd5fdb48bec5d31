"""torchrun as every node starts it: the training processes' output in one pipe per rank, and on a
worker, only once the main node's port accepts connections.

Run as ``python -m launcher.node.torchrun.shim [HOST PORT SECONDS] -- TORCHRUN_ARGS...``. With
HOST PORT SECONDS (workers), it imports torchrun first (over a second of torch imports) and then
waits for the port, so a worker's start-up overlaps the main's instead of following it; torchrun's
own rendezvous begins only after the port answers. Exits with :data:`EXIT_NO_MAIN` if the port does
not answer in time. The output pipes: :mod:`launcher.node.torchrun.rankpipes`.

The spare (:mod:`launcher.node.torchrun.spare`), which a node keeps ready before it knows the next round's ranks, starts
as the warm interpreter's file (:func:`run_spare`): it imports torch, forks its first warm interpreter, spawns the
others (:mod:`launcher.node.torchrun.warmstart`), imports all that torchrun needs and then waits for its command line and
environment, one JSON object on stdin. Ends quietly when stdin closes with nothing.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from launcher.node.torchrun.warmstart import WarmPool

EXIT_NO_MAIN = 75  # EX_TEMPFAIL
READERS_SECONDS = 5.0  # at most this long for the node to open the last pipes (it looks every 0.1 s)
USAGE = "usage: torchrun_shim [HOST PORT SECONDS] -- TORCHRUN_ARGS..."


def run_spare(processes: int, forked: int, channel: socket.socket) -> NoReturn:
    """The spare torchrun, started as ``python -u -c RUN_WARM_INTERPRETER --spare PROCESSES``
    (:data:`launcher.node.torchrun.warmstart.RUN_WARM_INTERPRETER`): it imported torch and forked its first warm
    interpreter (pid ``forked``, reached through ``channel``); the others it spawns now, as they import as it does."""
    from launcher.node.torchrun.warmstart import WarmPool

    pool = WarmPool(processes, os.environ, forked=(forked, channel))
    command = _await_command()
    if command is None:
        pool.close()
        _exit_now(0)
    os.environ.clear()
    os.environ.update(command["env"])
    _exit_now(main(command["argv"], pool))


def main(argv: list[str], pool: WarmPool | None = None) -> int:
    """torchrun for ``argv`` (HOST PORT SECONDS -- TORCHRUN_ARGS, or -- TORCHRUN_ARGS), its training processes
    started from ``pool``'s warm interpreters where it can."""
    from launcher.node.torchrun.warmstart import WarmPool

    node_pid = os.getppid()
    pool = pool or WarmPool(0, {})
    if "--" not in argv or argv.index("--") not in (0, 3):
        raise SystemExit(USAGE)
    wait, torchrun_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    from torch.distributed import run

    from launcher.node.torchrun import warmstart
    from launcher.node.torchrun.rankpipes import await_readers, with_rank_pipes

    if wait and not _main_answers(*wait):
        return EXIT_NO_MAIN
    warmstart.install(pool)
    run.config_from_args = with_rank_pipes(run.config_from_args)
    sys.argv = ["torchrun", *torchrun_args]
    try:
        run.main()
    except SystemExit as stop:
        return _exit_code(stop.code)
    except BaseException:  # shown as the interpreter would; torch's @record wrote its error file already
        sys.excepthook(*sys.exc_info())
        return 1
    finally:
        pool.close()
        await_readers(READERS_SECONDS, node_pid)
    return 0


def _await_command() -> dict | None:
    """Import what torchrun needs, then wait for the command line and environment the node sends."""
    import importlib
    import json

    from launcher.node.torchrun.spare import READY_FD_VAR

    for module in ("torch.distributed.run", "launcher.node.torchrun.rankpipes"):
        importlib.import_module(module)  # now, while the node waits for its round
    ready = os.environ.pop(READY_FD_VAR, None)
    if ready is not None:
        try:
            os.write(int(ready), b"1")
        except BrokenPipeError:
            pass  # the node took this spare before its imports were done, and stopped listening
        finally:
            os.close(int(ready))
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


def _exit_code(code: object) -> int:
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _exit_now(code: int) -> NoReturn:
    """End without the interpreter's finalisation: with torch imported it takes 0.5-1.5 s here (collecting
    torch's objects), all of it between the training processes' end and the node's. Nothing of torchrun's
    needs it: its workers have ended and its files are written; only our buffered output is flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _main_answers(host: str, port: str, seconds: str) -> bool:
    from launcher.node.netutil import wait_for_port

    if wait_for_port(host, int(port), deadline=time.monotonic() + float(seconds)):
        return True
    print(f"[launcher] the main node's {host}:{port} did not accept connections within {seconds}s",
          file=sys.stderr, flush=True)
    return False


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
