"""`launcher ui`'s log of a big run: one answer of the newest lines, and what it costs the server's memory.

Writes a finished run of 2 nodes x N log lines in chunks of the size nodes write (benchmarks/watch_memory.py's
writer), starts `launcher ui` on it, and asks for its log as a page opening it does (the newest 5,000 lines of the
whole log). Reports the answer's time and size and the server's peak resident memory (VmHWM) before and after.

    .venv/bin/python benchmarks/ui_log.py [--lines 1500000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, scratch_dir
from watch_memory import write_run


def peak_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_500_000, help="log lines per node")
    args = parser.parse_args()
    root = scratch_dir("ui-log-")
    write_run(root / "wd", "big", args.lines)
    home = root / "home"
    (home / "runs" / "big").mkdir(parents=True)
    (home / "runs" / "big" / "info.yaml").write_text(json.dumps({
        "run_id": "big", "backend": "local", "work_dir": str(root / "wd"), "nodes": ["a", "b"], "spec_file": "",
        "spec_digest": "", "created_at": time.time(), "processes_per_node": 1, "backend_ids": {}}))
    server = subprocess.Popen([sys.executable, "-m", "launcher", "ui", "--no-browser"], text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "LAUNCHER_HOME": str(home),
                                                           "PYTHONPATH": str(REPO)})
    try:
        url = server.stdout.readline().split(": ", 1)[1].strip()
        port, secret = url.split(":")[2].split("/")[0], url.split("token=")[1]
        before = peak_mib(server.pid)
        connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=600)
        started = time.perf_counter()
        connection.request("GET", "/api/runs/big/log?limit=5000&final=1",
                           headers={"Cookie": f"launcher_ui_{port}={secret}"})
        answer = connection.getresponse()
        body = answer.read()
        took = time.perf_counter() - started
        found = json.loads(body)
        print(f"2 nodes x {args.lines} lines: {len(found['lines'])} lines sent, {found['skipped']} skipped, "
              f"{len(body) / 2**20:.1f} MiB in {took:.1f} s; server peak RSS {before:.0f} MiB before, "
              f"{peak_mib(server.pid):.0f} MiB after")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
