"""`launcher watch --no-follow` on a big finished run: this version against the one before streaming.

Writes a run with 2 nodes x N log lines (interleaved in time, in chunks of the size nodes
write) into a temporary work dir, then times `watch` of this checkout and of an earlier commit
(checked out with `git worktree`, default 3a718ca: the last one that read whole logs into
memory), alternated, with output to /dev/null. Reports wall time and peak RSS.

    .venv/bin/python benchmarks/watch_memory.py [--lines 1500000] [--repeat 3] [--baseline 3a718ca]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, median, timed_process

sys.path.insert(0, str(REPO))
from launcher.protocol.logship import MAX_CHUNK_LINES, chunk_key  # noqa: E402


def write_run(work_dir: Path, run_id: str, lines: int) -> None:
    for offset, node in enumerate(("a", "b")):
        base = work_dir / run_id
        for seq, start in enumerate(range(0, lines, MAX_CHUNK_LINES)):
            stamps = range(start, min(start + MAX_CHUNK_LINES, lines))
            body = "".join(json.dumps({"t": 1e9 + 2 * i + offset, "s": "out",
                                       "m": f"rank {offset}: step {i} loss 0.{i % 9973:04d}"}) + "\n" for i in stamps)
            path = base / chunk_key(node, seq, 1e9 + 2 * stamps[-1] + offset)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        status = base / "status" / f"{node}.json"
        status.parent.mkdir(parents=True, exist_ok=True)
        status.write_text(json.dumps({"node": node, "state": "succeeded", "rank": offset}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_500_000, help="log lines per node")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", default="3a718ca", help="commit to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        write_run(root / "wd", "big", args.lines)
        print(f"wrote 2 x {args.lines} lines in {time.perf_counter() - started:.1f}s")
        home = root / "home"
        (home / "runs" / "big").mkdir(parents=True)
        # Only fields both versions know, so each reads the same record.
        (home / "runs" / "big" / "info.yaml").write_text(json.dumps({
            "run_id": "big", "backend": "local", "work_dir": str(root / "wd"), "nodes": ["a", "b"],
            "spec_file": "", "spec_digest": "", "created_at": time.time(), "processes_per_node": 1,
            "backend_ids": {}}))
        baseline = root / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), args.baseline],
                       check=True, capture_output=True)
        try:
            results: dict[str, list[tuple[float, float]]] = {"this checkout": [], args.baseline: []}
            for _ in range(args.repeat):
                for label, code in (("this checkout", REPO), (args.baseline, baseline)):
                    env = {**os.environ, "LAUNCHER_HOME": str(home), "PYTHONPATH": str(code)}
                    wall, rss, status = timed_process([sys.executable, "-m", "launcher", "watch", "big",
                                                       "--no-follow"], env=env, cwd=root)
                    assert status == 0, f"{label}: watch exited {status}"
                    results[label].append((wall, rss))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)],
                           capture_output=True)
    print(f"\n2 nodes x {args.lines} lines, median of {args.repeat}:")
    print(f"{'version':<16} {'wall s':>8} {'peak RSS MiB':>13}")
    for label, runs in results.items():
        print(f"{label:<16} {median([w for w, _ in runs]):>8.1f} {median([r for _, r in runs]):>13.0f}")
    new, old = results["this checkout"], results[args.baseline]
    print(f"ratio (this / {args.baseline}): wall {median([w for w, _ in new]) / median([w for w, _ in old]):.2f}, "
          f"memory {median([r for _, r in new]) / median([r for _, r in old]):.3f}")


if __name__ == "__main__":
    main()
