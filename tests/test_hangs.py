"""Hangs and limits through the real CLI on 2 local nodes with real torchrun and gloo: the summary names the
rank the others wait for (from every rank's Python stack, taken without stopping it), and a run that reaches
its maxRuntime is reported as the run's limit, not as one node's failure."""

from __future__ import annotations

import json

import pytest

from clirun import processes_started_with, run_failing, run_id_from
from cluster import write_spec
from conftest import run_cli

pytestmark = pytest.mark.slow

# The silence the watchdog measures starts at the line printed after the (slow) import of torch.
IMPORTED = "import os, time, torch, torch.distributed as dist\nprint('imported', flush=True)\n"
HANG_TIMEOUT = {"hangTimeout": 20}  # above the time a loaded machine takes to import torch (over 10 s at load 15)


def test_a_rank_stuck_outside_any_collective_is_the_cause_and_the_waiting_rank_its_victim(tmp_path, launcher_home):
    # Rank 1 goes silent 3 s after rank 0, so rank 0's node reaches its hangTimeout first and shows its stack
    # (then waits for the culprit's node to name itself). When both went silent at once, the node that looked
    # first won: rank 1's named it and stopped the run before rank 0's node had looked (seen once in 2 runs).
    script = IMPORTED + ("dist.init_process_group('gloo')\n"
                         "def load_next_batch():\n    time.sleep(600)\n"
                         "if dist.get_rank() == 1:\n    time.sleep(3)\n    print('loading', flush=True)\n"
                         "    load_next_batch()\n"
                         "dist.all_reduce(torch.ones(1))\n")
    output, summary = run_failing(tmp_path, script, extra_cluster=HANG_TIMEOUT)
    assert "cause: hung: rank 1 made no progress for 20s outside any collective, at" in summary, summary
    assert "job.py:5 in load_next_batch" in summary  # the sleep, in the function that never returned
    assert "stopped because of it: node t-main" in summary
    # every rank's stack is shown, the waiting one inside torch.distributed
    assert "rank 0 waits in a collective; its stack" in output and "in all_reduce" in output
    assert "rank 1 is not in any collective; its stack" in output


def test_a_rank_that_goes_silent_with_the_waiting_rank_is_still_the_cause(tmp_path, launcher_home):
    # The report of a regression: rank 1 prints a line right after init_process_group and sleeps outside any
    # collective while rank 0 waits in its all_reduce; both go silent at about the same time, so either node may
    # reach its hangTimeout first: the rank outside a collective is named whichever does.
    script = IMPORTED + ("dist.init_process_group('gloo')\n"
                         "if dist.get_rank() == 1:\n    print('loading', flush=True)\n    time.sleep(600)\n"
                         "dist.all_reduce(torch.ones(1))\n")
    output, summary = run_failing(tmp_path, script, extra_cluster=HANG_TIMEOUT)
    assert "cause: hung: rank 1 made no progress for 20s outside any collective, at" in summary, summary
    assert "job.py:6 in <module>" in summary, summary  # the sleep
    assert "rank 1 is not in any collective; its stack" in output, output


def test_a_frozen_rank_is_the_cause_and_is_not_left_behind(tmp_path, launcher_home):
    # A stopped process cannot run the handler that writes its stack: /proc says what it is. torch starts each rank
    # in a session of its own, so once torchrun is gone a stopped rank would stay (SIGTERM waits while it is stopped).
    script = IMPORTED + ("import signal\ndist.init_process_group('gloo')\n"
                         "if dist.get_rank() == 1:\n    print('freezing', flush=True)\n"
                         "    os.kill(os.getpid(), signal.SIGSTOP)\n"
                         "dist.all_reduce(torch.ones(1))\n")
    output, summary = run_failing(tmp_path, script, extra_cluster=HANG_TIMEOUT)
    assert ("cause: hung: rank 1 made no progress for 20s: its process is stopped (SIGSTOP, or a job-control "
            "stop)") in summary, summary
    assert "rank 1's process is stopped (SIGSTOP, or a job-control stop): it cannot show a stack" in output
    assert "1 training process outlived torchrun's stop (stopped, or ignoring SIGTERM): sending SIGKILL" in output
    assert processes_started_with(LAUNCHER_RUN_ID=run_id_from(output)) == {}


def test_a_node_that_returned_early_is_named_by_the_rank_left_waiting(tmp_path, launcher_home):
    script = IMPORTED + ("if os.environ['RANK'] == '1':\n    raise SystemExit(0)  # returns before init_process_group\n"
                         "dist.init_process_group('gloo')\nprint('never reached', flush=True)\n")
    _, summary = run_failing(tmp_path, script, extra_cluster=HANG_TIMEOUT)
    assert ("cause: hung: rank 0 waited 20s in a collective for t-worker-0, whose training processes ended with "
            "exit status 0") in summary, summary


def test_max_runtime_is_the_runs_limit_not_a_nodes_failure(tmp_path, launcher_home):
    spec = write_spec(tmp_path, "import time\nprint('working', flush=True)\ntime.sleep(120)\n", nodes=2,
                      extra_cluster={"maxRuntime": "4s"})
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout
    run_id = run_id_from(done.stdout)
    assert done.stdout[done.stdout.rindex("\nrun "):].strip() == \
        f"run {run_id} failed: the run exceeded its maxRuntime (4s); every node was stopped"
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "failed" and status["first_failure"] is None
    assert {node["exit_code"] for node in status["nodes"].values()} == {124}
