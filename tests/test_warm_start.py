"""Warm starts: training processes forked from torchrun's process (torch imported), and a spare torchrun kept
ready for the next round. Real local runs with real torchrun: the script checks from inside that it is what a
fresh `python -u job.py` would be."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cluster import write_spec
from clirun import run_id_from
from conftest import run_cli

# Written before `import torch`: whether torch was there already says whether this process was forked warm.
PROBE = """
import sys
warm = "torch" in sys.modules
import atexit, os, random, threading
import torch
rank = int(os.environ["RANK"])
facts = {
    "warm": warm, "name": __name__, "argv": sys.argv, "path0": sys.path[0], "own_session": os.getsid(0) == os.getpid(),
    "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"), "random": random.random(),
    "pythonpath_before_stdlib": sys.path.index(os.path.abspath("extra")) < sys.path.index(os.path.dirname(os.__file__)),
    "stack_file": hasattr(sys, "launcher_stack_file"),
}
out = os.environ["LAUNCHER_OUTPUTS_DIR"]
left_open = open(os.path.join(out, f"left-open-{rank}.txt"), "w")  # never closed, never flushed by the script
left_open.write("x" * 100 + "\\n")
atexit.register(lambda: open(os.path.join(out, f"atexit-{rank}.txt"), "w").write("ran"))
with open(os.path.join(out, f"facts-{rank}.json"), "w") as handle:
    json_text = __import__("json").dumps(facts)
    handle.write(json_text)
print(f"rank {rank} warm={warm}", flush=True)
if os.environ.get("EXIT_WITH") and rank == 1:
    sys.exit(int(os.environ["EXIT_WITH"]))
"""


FORK = [{"name": "LAUNCHER_WARM_START", "value": "fork"}]  # forking training processes is opt-in


def run(tmp_path: Path, script: str, env: list | None = None, *, args: list | None = None):
    (tmp_path / "extra").mkdir(exist_ok=True)
    spec = write_spec(tmp_path, script, nodes=2, args=args, extra_cluster={"processesPerNode": 2},
                      env=[{"name": "PYTHONPATH", "value": str(tmp_path / "extra")}, *(env or [])])
    environment = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")}
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env=environment, timeout=300)
    return done, tmp_path / "wd" / run_id_from(done.stdout)


def facts_of(work: Path) -> dict[int, dict]:
    return {int(path.stem.split("-")[1]): json.loads(path.read_text()) for path in work.glob("outputs/*/facts-*.json")}


def test_training_processes_are_forked_warm_and_are_what_a_fresh_start_would_be(tmp_path):
    done, work = run(tmp_path, PROBE, FORK, args=["--lr", "0.1"])
    assert done.returncode == 0, done.stdout + done.stderr
    facts = facts_of(work)
    assert sorted(facts) == [0, 1, 2, 3]
    for rank, said in facts.items():
        assert said["warm"], f"rank {rank} imported torch itself: it was not forked from torchrun"
        assert said["name"] == "__main__" and said["argv"] == ["job.py", "--lr", "0.1"]
        assert said["path0"] == str(tmp_path) and said["pythonpath_before_stdlib"]
        assert said["own_session"], "torchrun stops a process by its group: each must lead its own"
        assert said["threads"] == int(said["omp"]) == 1, "OMP_NUM_THREADS, which torchrun sets, must hold"
        assert said["stack_file"], "launcher's rank hooks (stacks on a signal) run in a forked process too"
    assert len({said["random"] for said in facts.values()}) == 4, "every process has its own random seed"
    for rank in range(4):
        left_open = next(work.glob(f"outputs/*/left-open-{rank}.txt"))
        assert left_open.read_text() == "x" * 100 + "\n", "a file left open is flushed at the end, as a fresh end does"
        assert next(work.glob(f"outputs/*/atexit-{rank}.txt")).read_text() == "ran"


def test_a_forked_process_exit_status_and_traceback_reach_the_node(tmp_path):
    done, _ = run(tmp_path, PROBE, env=[*FORK, {"name": "EXIT_WITH", "value": "3"}])
    assert done.returncode != 0
    assert "cause: rank 1 exited with status 3" in done.stdout, done.stdout
    raises = "import os\nif os.environ['RANK'] == '2':\n    raise ValueError('bad batch 17')\n"
    done, _ = run(tmp_path, raises, FORK)
    assert done.returncode != 0
    assert "ValueError: bad batch 17" in done.stdout, done.stdout
    assert "job.py:3" in done.stdout, "the cause names the user's own line"


@pytest.mark.parametrize("setting", [None, "0"])
def test_without_fork_every_training_process_starts_afresh(tmp_path, setting):
    done, work = run(tmp_path, PROBE, [{"name": "LAUNCHER_WARM_START", "value": setting}] if setting else [])
    assert done.returncode == 0, done.stdout + done.stderr
    facts = facts_of(work)
    assert sorted(facts) == [0, 1, 2, 3] and not any(said["warm"] for said in facts.values())


@pytest.mark.parametrize("entry", [{"module": "jobmod"}])
def test_a_module_entry_is_forked_as_python_m_runs_it(tmp_path, entry):
    (tmp_path / "jobmod.py").write_text(PROBE)
    (tmp_path / "extra").mkdir()
    spec = write_spec(tmp_path, "", nodes=2, entry=entry, extra_cluster={"processesPerNode": 2},
                      env=[{"name": "PYTHONPATH", "value": str(tmp_path / "extra")}, *FORK])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env={**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")},
                   timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    facts = facts_of(tmp_path / "wd" / run_id_from(done.stdout))
    assert all(said["warm"] and said["name"] == "__main__" and said["path0"] == str(tmp_path)
               for said in facts.values()) and len(facts) == 4
