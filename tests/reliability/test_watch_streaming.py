"""`watch` streams logs of any size in bounded memory, merged by time; --tail (per node) and --since (issue 7,
item 9; issue 15, item 7)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

from launcher.commands.watch import LogFollower
from launcher.protocol.logship import MAX_CHUNK_LINES, chunk_key
from launcher.protocol.status import status_key
from launcher.protocol.store import WorkDir
from launcher.runs import state

NODES = ("a", "b")


def write_interleaved_log(work_dir: str, run_id: str, lines_per_node: int, chunk_lines: int = MAX_CHUNK_LINES) -> None:
    """Node a logs at even times, node b at odd times; each line's text is its time."""
    run = WorkDir(f"{work_dir}/{run_id}")
    for offset, node in enumerate(NODES):
        after = 0.0
        for seq, start in enumerate(range(0, lines_per_node, chunk_lines)):
            stamps = [2 * i + offset for i in range(start, min(start + chunk_lines, lines_per_node))]
            body = "".join(json.dumps({"t": t, "s": "out", "r": offset, "m": str(t)}) + "\n" for t in stamps)
            run.put(chunk_key(node, seq, after), body.encode())
            after = stamps[-1]
        run.put(status_key(node), json.dumps({"node": node, "state": "succeeded", "rank": offset}).encode())


def record(work_dir: str, run_id: str) -> state.RunInfo:
    info = state.RunInfo(run_id=run_id, backend="local", work_dir=work_dir, nodes=list(NODES), spec_file="",
                         spec_digest="", created_at=time.time())
    state.save(info)
    return info


def watch_with_peak_rss(*args: str) -> tuple[str, int]:
    """Run `launcher watch` and return its output and its peak resident memory in MiB."""
    probe = ("import resource, subprocess, sys;"
             "done = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
             "sys.stdout.write(done.stdout);"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "launcher", "watch", *args],
                          capture_output=True, text=True, timeout=600)
    return done.stdout, int(done.stderr.strip().splitlines()[-1])


def test_a_large_log_streams_in_bounded_memory_in_time_order(tmp_path, launcher_home):
    lines = 200_000
    write_interleaved_log(str(tmp_path / "wd"), "big-1", lines)
    record(str(tmp_path / "wd"), "big-1")
    output, peak_mib = watch_with_peak_rss("big-1", "--no-follow")
    printed = [int(line.split("] ", 1)[1]) for line in output.splitlines() if "] " in line]
    assert printed == list(range(2 * lines)), "lines are missing or out of time order"
    assert peak_mib < 150, f"watch peaked at {peak_mib} MiB"


def test_tail_prints_the_last_lines_of_each_node_counting_only_lines_it_shows(tmp_path, launcher_home):
    write_interleaved_log(str(tmp_path / "wd"), "tail-1", 30_000, chunk_lines=1000)
    hidden = "".join(json.dumps({"t": 70_000 + i, "s": "torchrun", "m": "torchrun's own"}) + "\n" for i in range(9))
    WorkDir(str(tmp_path / "wd" / "tail-1")).put(chunk_key("b", 30, 59_999), hidden.encode())  # shown with -v only
    record(str(tmp_path / "wd"), "tail-1")
    output, _ = watch_with_peak_rss("tail-1", "--no-follow", "--tail", "3")
    assert output.splitlines()[:-1] == ["[a r0] 59994", "[b r1] 59995", "[a r0] 59996", "[b r1] 59997", "[a r0] 59998",
                                   "[b r1] 59999"]


def test_since_skips_whole_chunks_without_fetching_them(tmp_path, launcher_home):
    write_interleaved_log(str(tmp_path / "wd"), "since-1", 10_000, chunk_lines=100)
    info = record(str(tmp_path / "wd"), "since-1")
    out = io.StringIO()
    follower = LogFollower(info, out, since=19_990)
    before = follower.run.requests
    assert follower.poll() == 10
    assert follower.run.requests - before <= 3, "old chunks were fetched"  # one LIST, one GET per node
    assert out.getvalue().splitlines()[0].endswith(" 19990")
