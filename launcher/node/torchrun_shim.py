"""torchrun as every node starts it: the training processes' output in one pipe per rank, and on a
worker, only once the main node's port accepts connections.

Run as ``python -m launcher.node.torchrun_shim [HOST PORT SECONDS] -- TORCHRUN_ARGS...``. With
HOST PORT SECONDS (workers), it imports torchrun first (over a second of torch imports) and then
waits for the port, so a worker's start-up overlaps the main's instead of following it; torchrun's
own rendezvous begins only after the port answers. Exits with :data:`EXIT_NO_MAIN` if the port does
not answer in time. The output pipes: :mod:`launcher.node.rankpipes`.
"""

from __future__ import annotations

import sys
import time

EXIT_NO_MAIN = 75  # EX_TEMPFAIL
USAGE = "usage: torchrun_shim [HOST PORT SECONDS] -- TORCHRUN_ARGS..."


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") not in (0, 3):
        raise SystemExit(USAGE)
    wait, torchrun_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    from torch.distributed import run

    from launcher.node.rankpipes import with_rank_pipes

    if wait and not _main_answers(*wait):
        return EXIT_NO_MAIN
    run.config_from_args = with_rank_pipes(run.config_from_args)
    sys.argv = ["torchrun", *torchrun_args]
    run.main()
    return 0


def _main_answers(host: str, port: str, seconds: str) -> bool:
    from launcher.node.netutil import wait_for_port

    if wait_for_port(host, int(port), deadline=time.monotonic() + float(seconds)):
        return True
    print(f"[launcher] the main node's {host}:{port} did not accept connections within {seconds}s",
          file=sys.stderr, flush=True)
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
