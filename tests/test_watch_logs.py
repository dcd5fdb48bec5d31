"""Logs in order, live, and named alike (issue 15, items 3 and 4).

Within a rank, lines keep the order they were written in across stdout and stderr; training lines
carry the global rank torchrun gave the process (whatever assigned it), launcher's own lines the
node only, and the summary uses the same words. Lines are shipped as soon as they arrive, and a local
follower finds each next chunk by its name instead of listing the whole log.
"""

from __future__ import annotations

import io
import os
import re
import threading

import pytest

from cluster import write_spec
from conftest import run_cli
from launcher.commands.watch import PROBES_PER_SECOND, STORE_PROBES_PER_SECOND, LogFollower
from launcher.protocol.logship import LogShipper, next_chunk_name
from launcher.node.torchrun.ranklogs import RankLogs
from launcher.protocol.store import StoreError, WorkDir
from launcher.runs.state import RunInfo

BURSTS = """
import os, sys
rank = os.environ["RANK"]
for i in range(1, 7):  # one burst, alternately to stdout and stderr
    (sys.stdout if i % 2 else sys.stderr).write(f"rank {rank} line {i}\\n")
print(f"rank {rank} epoch 3 done")
if rank == "3":
    raise ValueError("bad batch")
"""
PREFIX = re.compile(r"^\[(\S+)\s*(?: r(\S+))?\] (.*)$")


def test_each_ranks_lines_come_in_order_under_its_global_rank_and_the_summary_says_the_same(tmp_path, launcher_home):
    spec = write_spec(tmp_path, BURSTS, nodes=2, extra_cluster={"processesPerNode": 2})
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    body, summary = done.stdout[:done.stdout.rindex("\nrun ")], done.stdout[done.stdout.rindex("\nrun "):]
    shown: dict[str, list[str]] = {}
    for line in body.splitlines():
        found = PREFIX.match(line)
        if not found:
            continue
        node, rank, text = found.groups()
        if rank is None:  # the node's own line: it names the node, and no number
            assert text.startswith(("[launcher]", "[torchrun]")), line
            continue
        assert node == ("t-main" if rank in "01" else "t-worker-0"), line
        shown.setdefault(rank, []).append(text)
    for rank in "0123":
        assert shown[rank][:7] == [f"rank {rank} line {i}" for i in range(1, 7)] + [f"rank {rank} epoch 3 done"]
    assert shown["3"][7] == "Traceback (most recent call last):" and shown["3"][-1] == "ValueError: bad batch"
    assert "failed: node t-worker-0 exited with status 1" in summary
    assert "cause: rank 3: ValueError: bad batch" in summary and "(rank" not in summary


def test_the_pipes_carry_the_rank_torchrun_gave_and_both_streams_in_order(tmp_path):
    from launcher.node.torchrun.rankpipes import RankPipes

    # As an elastic rendezvous may assign them: not node index x processes + local rank.
    envs = {local: {"RANK": rank, "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0"}
            for local, rank in ((0, "5"), (1, "2"))}
    places = RankPipes(str(tmp_path / "logs")).reify(envs)
    assert places.stdouts == places.stderrs
    shipper = _Lines()
    rank_logs = RankLogs(str(tmp_path / "logs"), shipper, io.BytesIO()).start()
    for local in (0, 1):  # as torchrun's subprocess handler opens them: once per stream
        with open(places.stdouts[local], "w") as out, open(places.stderrs[local], "w") as err:
            for i in range(1, 7):
                (out if i % 2 else err).write(f"local {local} line {i}\n")
                (out if i % 2 else err).flush()
    rank_logs.close()
    assert [line for line in shipper.lines if line[2] == 5] == [("out", f"local 0 line {i}", 5) for i in range(1, 7)]
    assert [line for line in shipper.lines if line[2] == 2] == [("out", f"local 1 line {i}", 2) for i in range(1, 7)]
    assert (rank_logs.global_rank(0), rank_logs.global_rank(1)) == (5, 2)


def test_lines_of_a_process_that_ended_before_the_node_found_its_pipe_survive_torchruns_end(tmp_path):
    """What waits in a pipe is gone once nobody holds it open: torchrun, holding it, ends only after the node has
    it open, even when the process wrote and ended before the node first looked (the node ships its rank-exit)."""
    from launcher.node.torchrun import rankpipes

    envs = {0: {"RANK": "0", "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0"}}
    specs = rankpipes.RankPipes(str(tmp_path / "logs"))
    places = specs.reify(envs)
    with open(places.stdouts[0], "w") as out:  # the process writes and ends before any reader exists
        out.write("said before the node looked\n")
    shipper, exits = _Lines(), []
    rank_logs = RankLogs(str(tmp_path / "logs"), shipper, io.BytesIO(),
                         exited=lambda rank, at: exits.append(rank)).start()
    rankpipes.await_readers(10, os.getppid())
    specs._release()  # torchrun ends: its hold on the pipe goes
    rank_logs.close()
    assert shipper.lines == [("out", "said before the node looked", 0)]
    assert exits == [0]


class _Lines:
    """A shipper that keeps what it is given."""

    def __init__(self):
        self.lines: list[tuple[str, str, int | None]] = []

    def add_many(self, lines: list[tuple[str, str, int | None]]) -> None:
        self.lines += lines


class _Store:
    """A local work dir whose puts can be awaited, and made to fail."""

    def __init__(self, path: str, failures: int = 0):
        self.store = WorkDir(path)
        self.is_local = True
        self.failures = failures
        self.puts: list[tuple[str, bytes]] = []
        self.put_done = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        self.puts.append((key, data))
        if self.failures:
            self.failures -= 1
            raise StoreError("the store is down", permanent=False)
        self.store.put(key, data)
        self.put_done.set()


def test_a_line_is_shipped_when_it_arrives_and_its_chunk_names_the_next(tmp_path):
    store = _Store(str(tmp_path / "run"))
    shipper = LogShipper(store, "n", interval=60).start()
    shipper.add("out", "first")
    assert store.put_done.wait(10), "the first line waited for the interval"
    shipper.add("out", "second")  # within the interval: it goes with the next chunk, at the latest on close
    shipper.close()
    (_, body), (second, _) = store.puts
    assert second.rpartition("/")[2] == next_chunk_name(0, body)


def test_a_chunk_that_failed_is_retried_as_it_was(tmp_path):
    store = _Store(str(tmp_path / "run"), failures=1)
    shipper = LogShipper(store, "n")
    shipper.add("out", "first")
    shipper.flush()
    shipper.add("out", "second")
    shipper.flush()
    assert [key for key, _ in store.puts][:2] == [store.puts[0][0]] * 2 and store.puts[0][1] == store.puts[1][1]
    assert len(store.puts) == 3 and b"second" in store.puts[2][1]


def test_a_local_follower_finds_new_chunks_by_name_without_listing_a_replacement_nodes_too(tmp_path, monkeypatch):
    info = RunInfo(run_id="r1", backend="local", work_dir=str(tmp_path / "wd"), nodes=["a"], spec_file="",
                   spec_digest="", created_at=0)
    shipper = LogShipper(WorkDir(info.run_url), "a")
    out = io.StringIO()
    follower = LogFollower(info, out)
    shipper.add_many([("out", "first", 0)])
    shipper.flush()
    assert follower.poll() == 1
    monkeypatch.setattr(follower.run, "find", lambda prefix: pytest.fail("listed the whole log"))
    shipper.add_many([("out", "second", 0)])
    shipper.flush()
    replacement = LogShipper(WorkDir(info.run_url), "a", continues=True)  # the node, started again
    replacement.add_many([("out", "third", 0)])
    replacement.flush()
    assert follower.poll() == 2
    assert out.getvalue().splitlines() == ["[a r0] first", "[a r0] second", "[a r0] third"]


def _followed_run(tmp_path, nodes: int) -> tuple[RunInfo, dict[str, LogShipper]]:
    """A run of ``nodes`` nodes on a local work dir, each with a log shipper (flushed by hand) and its first line."""
    names = [f"n{i}" for i in range(nodes)]
    info = RunInfo(run_id="r1", backend="local", work_dir=str(tmp_path / f"wd{nodes}"), nodes=names, spec_file="",
                   spec_digest="", created_at=0)
    shippers = {name: LogShipper(WorkDir(info.run_url), name) for name in names}
    for rank, shipper in enumerate(shippers.values()):
        shipper.add_many([("out", "line 0", rank)])
        shipper.flush()
    return info, shippers


def _counting_gets(follower: LogFollower) -> list[int]:
    """The follower's store, counting its reads (the list's one item)."""
    counted, reads = follower.run.get, [0]

    def get(key: str) -> bytes | None:
        reads[0] += 1
        return counted(key)

    follower.run.get = get
    return reads


def test_a_local_follower_looks_at_a_bounded_number_of_nodes_a_second_whatever_their_number(tmp_path):
    """Issue 41: following 64 nodes costs no more reads a second than following 8."""
    totals = {}
    for nodes in (8, 64):
        info, _ = _followed_run(tmp_path, nodes)
        now = [0.0]
        follower = LogFollower(info, io.StringIO(), probes_per_second=80, clock=lambda: now[0])  # 4 per 0.05 s
        assert follower.poll() == nodes  # the first poll lists: every node's first line
        reads = _counting_gets(follower)
        for _ in range(40):  # 2 s, nothing written: every look is a failed open
            now[0] += follower.poll_seconds
            follower.poll()
        assert reads[0] <= 4 + 80 * 2, reads  # what was allowed at first, and 80 a second since
        totals[nodes] = reads[0]
    assert totals[64] <= totals[8] + 4, totals


def test_a_follower_given_no_bound_looks_at_every_node_each_poll(tmp_path):
    """The ui's log page reads once per question, with a follower made for it: every node's new lines, at once."""
    info, shippers = _followed_run(tmp_path, 64)
    follower = LogFollower(info, io.StringIO())
    assert follower.poll() == 64
    for rank, shipper in enumerate(shippers.values()):
        shipper.add_many([("out", "line 1", rank)])
        shipper.flush()
    assert follower.poll() == 64


def test_a_bounded_follower_shows_every_line_once_in_order_per_node(tmp_path):
    info, shippers = _followed_run(tmp_path, 64)
    out = io.StringIO()
    now = [0.0]
    follower = LogFollower(info, out, probes_per_second=80, clock=lambda: now[0])
    written = {name: ["line 0"] for name in shippers}
    for poll in range(1, 60):
        now[0] += follower.poll_seconds
        for index, (name, shipper) in enumerate(shippers.items()):
            if (index * 7 + poll) % (1 + index % 5) == 0:  # nodes writing at different paces, some every poll
                written[name].append(f"line {poll}")
                shipper.add_many([("out", f"line {poll}", index)])
                shipper.flush()
        follower.poll()
    follower.poll(final=True)
    shown: dict[str, list[str]] = {}
    for line in out.getvalue().splitlines():
        node, _rank, text = PREFIX.match(line).groups()
        shown.setdefault(node, []).append(text)
    assert shown == written


def test_a_follower_on_an_object_store_reads_by_name_a_bounded_number_a_second_and_lists_only_at_the_end(
        s3_bucket, monkeypatch):
    """On S3 a listing of logs/ returns every chunk the run ever wrote (1,000 keys a request): listed each poll,
    following a long or large run cost more requests each minute. `watch` lists once, then reads by name."""
    names = [f"n{i}" for i in range(8)]
    info = RunInfo(run_id="r1", backend="local", work_dir=f"s3://{s3_bucket}/runs", nodes=names, spec_file="",
                   spec_digest="", created_at=0)
    shippers = {name: LogShipper(WorkDir(info.run_url), name) for name in names}
    written: dict[str, list[str]] = {name: [] for name in names}

    def write(line: str) -> None:
        for rank, (name, shipper) in enumerate(shippers.items()):
            shipper.add_many([("out", line, rank)])
            shipper.flush()
            written[name].append(line)

    write("line 0")
    out, now = io.StringIO(), [0.0]
    follower = LogFollower(info, out, probes_per_second=PROBES_PER_SECOND, clock=lambda: now[0])
    assert follower.probes_per_second == STORE_PROBES_PER_SECOND
    assert follower.poll() == 8  # the first poll lists: every node's first line
    monkeypatch.setattr(follower.run, "find", lambda prefix: pytest.fail("listed the whole log"))
    reads = _counting_gets(follower)
    for poll in range(1, 41):  # 10 s of polls, every node writing a chunk each second
        now[0] += follower.poll_seconds
        if poll % 4 == 0:
            write(f"line {poll}")
        follower.poll()
    # a look that misses (what was allowed at first, and 20 a second since), and a read per chunk written (80);
    # looking at every node each poll would read 40 x 8 + 80
    assert reads[0] <= 5 + STORE_PROBES_PER_SECOND * 10 + 80, reads
    monkeypatch.undo()  # the last poll lists: whatever the bound left unread is shown
    follower.poll(final=True)
    shown: dict[str, list[str]] = {name: [] for name in names}
    for line in out.getvalue().splitlines():
        node, text = re.fullmatch(r"\[(\S+)\s+r\d+\] (.*)", line).groups()
        shown[node].append(text)
    assert shown == written
