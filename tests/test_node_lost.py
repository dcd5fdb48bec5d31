"""A node stopped from outside where its engine counts lost nodes (a Kubernetes pod deleted: SIGTERM, then SIGKILL
after the grace period) ends "lost", exit 143, so that the Job's podFailurePolicy starts its index again; a
`launcher cancel` (the cancel marker in the work dir before the signal) still ends it "cancelled", exit 130.
Elsewhere (no LAUNCHER_LOST_ON_SIGTERM: local, Docker, Slurm's scancel) a SIGTERM stays a cancel."""

from __future__ import annotations

import signal

import pytest

from cluster import Cluster, write_spec
from launcher.node.sigterm import LOST_ON_SIGTERM, settle_signal
from launcher.protocol.control import request_cancel
from launcher.protocol.exits import EXIT_CANCELLED, EXIT_LOST
from launcher.protocol.store import WorkDir
from test_node import FOREVER


@pytest.mark.parametrize("flag, signum, cancelled, state, code", [
    ("1", signal.SIGTERM, False, "lost", EXIT_LOST),
    ("1", signal.SIGTERM, True, "cancelled", EXIT_CANCELLED),  # launcher cancel asked first
    ("1", signal.SIGINT, False, "cancelled", EXIT_CANCELLED),  # Ctrl-C is a person's cancel
    (None, signal.SIGTERM, False, "cancelled", EXIT_CANCELLED),  # an engine that does not count lost nodes
    ("1", None, False, "cancelled", EXIT_CANCELLED),  # the control marker's cancel, no signal
])
def test_which_stop_is_a_lost_node(tmp_path, monkeypatch, flag, signum, cancelled, state, code):
    if flag:
        monkeypatch.setenv(LOST_ON_SIGTERM, flag)
    else:
        monkeypatch.delenv(LOST_ON_SIGTERM, raising=False)
    run = WorkDir(str(tmp_path / "run"))
    if cancelled:
        request_cancel(run)
    settled = settle_signal(run, signum, "cancelled", "received SIGTERM", EXIT_CANCELLED)
    assert settled[0::2] == (state, code)
    assert settle_signal(run, signum, "failed", "x", 1) == ("failed", "x", 1)  # only a cancel can be a loss


@pytest.mark.slow
def test_a_training_node_stopped_from_outside_is_lost_and_a_cancelled_one_cancelled(tmp_path):
    spec = write_spec(tmp_path, FOREVER, nodes=2)
    cluster = Cluster(spec, env={LOST_ON_SIGTERM: "1"})
    for node in cluster.nodes.values():
        assert node.wait_for_line("step 50")
    worker = cluster.nodes["t-worker-0"]
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=30) == EXIT_LOST
    status = cluster.status("t-worker-0")
    assert (status["state"], status["exit_code"]) == ("lost", EXIT_LOST), status
    assert "received SIGTERM from outside, not from launcher cancel" in status["reason"], status
    assert cluster.nodes["t-main"].proc.wait(timeout=30) not in (0, EXIT_LOST)  # not recovering: the run ends
    (tmp_path / "again").mkdir()
    second = write_spec(tmp_path / "again", FOREVER, nodes=2)
    cluster = Cluster(second, env={LOST_ON_SIGTERM: "1"})
    for node in cluster.nodes.values():
        assert node.wait_for_line("step 50")
    request_cancel(cluster.run)
    for node in cluster.nodes.values():
        node.proc.send_signal(signal.SIGTERM)
    assert cluster.wait(timeout=30) == {name: EXIT_CANCELLED for name in cluster.nodes}
    assert {cluster.status(name)["state"] for name in cluster.nodes} == {"cancelled"}
