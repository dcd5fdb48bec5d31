"""benchmarks/chaos.py, short: a fixed seed and ten faults on 4 local nodes (every kind but a throttled rank,
which takes longer to be named than this run lasts), so that the soak and what it proves cannot rot: about a
minute and a half alone on 2 cores. The run must succeed with every epoch's ids trained exactly once, no round
with two mains, every fault noticed and trained through, nothing of the run left running, and launcher's own
account of what the faults cost (``launcher status``'s ETTR) near the one the job's ledger gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_a_short_soak_of_faults_of_every_kind_trains_every_sample_once_and_leaves_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "chaos.py"), "--duration", "35", "--rate", "20",
                           "--seed", "11", "--max-faults", "10", "--warmup", "5",
                           "--faults", "kill-node,kill-main,kill-rank,hang-rank,freeze-node,kill-replacement,double"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    shown = json.dumps(result, indent=1) + "\n" + done.stdout[-4000:]
    assert result["faults"] >= 8 and result["exit"] == 0, shown
    assert (result["duplicated"], result["skipped"], result["split_rounds"]) == (0, 0, 0), shown
    assert result["left_running"] == 0 and result["unnoticed"] == 0, shown
    assert result["never_trained_again"] <= 1, shown  # a fault in the run's last seconds may find nothing to resume
    assert result["launcher_incidents"] >= result["faults"] // 2, shown  # two faults may end one round
    # The ledger counts only the committed steps' time; launcher counts training less what each incident cost.
    assert result["launcher_ettr"] == pytest.approx(result["ettr"], abs=0.15), shown
