"""Inside torchrun: one pipe per training process for both its stdout and its stderr.

torchrun's own ``--redirects`` gives each process two files, and a reader of two files cannot tell
in which order lines written to both were written (a traceback came out before the epoch line that
preceded it). Both streams of a process share one named pipe here, so the node reads them in the
order they were written; the pipe is named after the global rank torchrun gave the process, so
the node learns it from torchrun itself, whatever decided it. Imported only by
:mod:`launcher.node.torchrun.shim`, in torchrun's process: it imports torch.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any, Callable

from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest

from launcher.node.torchrun.ranklogs import output_pipe, reading_marker

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_BYTES = 1 << 20  # a burst waits less on the reader; Linux's default limit for unprivileged processes


class RankPipes(DefaultLogsSpecs):
    """torchrun's log directory (error files included), with ``output-of-rank-N`` pipes for the processes' output."""

    def __init__(self, log_dir: str | None):
        super().__init__(log_dir=log_dir)
        self._held: list[int] = []

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        destinations = super().reify(envs)
        self._release()
        for local_rank, error_file in destinations.error_files.items():
            path = output_pipe(os.path.dirname(error_file), envs[local_rank]["RANK"])
            os.mkfifo(path)
            self._held.append(_hold(path))
            _HELD_PATHS.append(path)
            destinations.stdouts[local_rank] = destinations.stderrs[local_rank] = path
        destinations.tee_stdouts.clear()
        destinations.tee_stderrs.clear()
        return destinations

    def _release(self) -> None:
        """The previous attempt's pipes (an elastic restart): their processes are gone."""
        for fd in self._held:
            os.close(fd)
        self._held.clear()


_HELD_PATHS: list[str] = []  # every pipe this torchrun made, of every attempt


def await_readers(seconds: float, node_pid: int) -> None:
    """Wait (at most ``seconds``) until the node has opened every pipe: a process that wrote its lines and
    ended before the node found its pipe leaves them in the pipe, and they are lost once torchrun, the last
    to hold it open, ends. Not at all once the node (``node_pid``, torchrun's parent) is gone: nobody will."""
    deadline = time.monotonic() + seconds
    waiting = [path for path in _HELD_PATHS if os.path.exists(path)]
    while waiting and time.monotonic() < deadline and os.getppid() == node_pid:
        waiting = [path for path in waiting if not os.path.exists(reading_marker(path))]
        if waiting:
            time.sleep(0.01)  # the node looks for new pipes every 0.1 s: a few rounds at most


def _hold(path: str) -> int:
    """Open the pipe's read end here, so that opening it for the process's output never waits for the node's
    reader (its data waits in the pipe for the node); and make the pipe large."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # a lower system limit: the default size works, a burst waits a little more
        pass
    return fd


def with_rank_pipes(config_from_args: Callable[[Any], tuple]) -> Callable[[Any], tuple]:
    """torchrun's ``config_from_args`` with :class:`RankPipes` as its logs specs (torchrun's ``--logs-specs``
    looks for installed entry points, which a node image that copies the package has not)."""
    def configure(args: Any) -> tuple:
        config, entrypoint, entry_args = config_from_args(args)
        config.logs_specs = RankPipes(args.log_dir)
        return config, entrypoint, entry_args
    return configure
