"""`launcher ui`'s run list with 1,000 runs in LAUNCHER_HOME: time to first byte of each answer.

Writes N recorded two-node runs with the real writers (the client's run record, the nodes' status records and
failure markers: tests/uirecords.py) into a temporary LAUNCHER_HOME, starts the ui's server on loopback and asks,
over HTTP, for the list page, the first page of runs (50), and the failed runs only (every run's state is needed):
each first on a fresh server (cold: every record parsed) and then again (warm: what it read is kept). Reports the
median of each over the repeats.

    .venv/bin/python benchmarks/ui_list.py [--runs 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import threading
import time
from pathlib import Path

from common import REPO, median, scratch_dir

sys.path[:0] = [str(REPO), str(REPO / "tests")]

ASKED = {"page": "/", "first 50 runs": "/api/runs?per_page=50", "failed runs": "/api/runs?state=failed&per_page=50"}


def first_byte(port: int, secret: str, path: str) -> float:
    """Seconds from sending the request to the answer's status line and headers."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    connection.request("GET", path, headers={"Cookie": f"launcher_ui_{port}={secret}"})
    answer = connection.getresponse()
    took = time.perf_counter() - started
    assert answer.status == 200, answer.read()
    answer.read()
    connection.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ["LAUNCHER_HOME"] = str(scratch_dir("ui-list-"))
    from launcher.ui.server import Server
    from uirecords import write_runs

    written = time.perf_counter()
    write_runs(Path(os.environ["LAUNCHER_HOME"]), args.runs)
    print(f"{args.runs} runs written in {time.perf_counter() - written:.1f} s")
    times: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for what, path in ASKED.items():
            server = Server("127.0.0.1", 0)  # a fresh one for each: its first answer is a cold one
            serving = threading.Thread(target=server.serve, daemon=True)
            serving.start()
            for round_name in ("cold", "warm"):
                times.setdefault(f"{what} ({round_name})", []).append(
                    first_byte(server.access.port, server.access.secret, path))
            server.stop()
            serving.join()
            server.close()
    for what, found in times.items():
        print(f"{what:<24} {median(found) * 1000:8.1f} ms  (median of {len(found)})")


if __name__ == "__main__":
    main()
