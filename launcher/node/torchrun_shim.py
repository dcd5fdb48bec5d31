"""Start torchrun on a worker only once the main node's port accepts connections.

Run as ``python -m launcher.node.torchrun_shim HOST PORT SECONDS -- TORCHRUN_ARGS...``. It imports
torchrun first (over a second of torch imports) and then waits for the port, so a worker's start-up
overlaps the main's instead of following it; torchrun's own rendezvous begins only after the port
answers. Exits with :data:`EXIT_NO_MAIN` if the port does not answer in time.
"""

from __future__ import annotations

import sys
import time

EXIT_NO_MAIN = 75  # EX_TEMPFAIL


def main(argv: list[str]) -> int:
    host, port, seconds, separator, *torchrun_args = argv
    if separator != "--":
        raise SystemExit("usage: torchrun_shim HOST PORT SECONDS -- TORCHRUN_ARGS...")
    from torch.distributed import run

    from launcher.node.netutil import wait_for_port

    if not wait_for_port(host, int(port), deadline=time.monotonic() + float(seconds)):
        print(f"[launcher] the main node's {host}:{port} did not accept connections within {seconds}s",
              file=sys.stderr, flush=True)
        return EXIT_NO_MAIN
    sys.argv = ["torchrun", *torchrun_args]
    run.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
