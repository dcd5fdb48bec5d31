"""Warm starts: training processes that are interpreters started (torch imported) before their round, handed their
script by the spare torchrun. Real local runs with real torchrun: each script reports from inside what it sees,
and a warm start must see what a fresh `python -u job.py` (LAUNCHER_WARM_START=0) sees."""

from __future__ import annotations

import gzip
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import write_spec
from clirun import run_id_from, wait_until
from conftest import run_cli
from launcher.node.torchrun.spare import Spare
from launcher.node.threads import usable_cores
from launcher.node.torchrun.warmstart import differing, entry_of, warm_starts_on

# Written before `import torch`: whether torch was there already says whether this process started warm.
PROBE = """
names_at_start = sorted(globals())
import signal, sys
warm = "torch" in sys.modules
import atexit, os, random
import torch

def annotated(x: int) -> None: ...

def open_fds():
    # less the progress record launcher's counting thread may be writing at this moment (under its stacks dir)
    own = os.environ["LAUNCHER_STACKS_DIR"]
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own fd, closed by now
            pass
    return [target for target in targets if not target.startswith(own)]

rank = int(os.environ["RANK"])
facts = {
    "warm": warm, "name": __name__, "argv": sys.argv, "orig_argv": sys.orig_argv[1:], "path": sys.path,
    "spec": repr(__spec__), "file": __file__, "loader": type(__loader__).__name__,
    "main_is_me": sys.modules["__main__"].__dict__ is globals(), "own_session": os.getsid(0) == os.getpid(),
    "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"), "cwd": os.getcwd(),
    "stack_file": hasattr(sys, "launcher_stack_file"), "annotation": repr(annotated.__annotations__["x"]),
    "stdout": [sys.stdout is sys.__stdout__, sys.stdout.line_buffering, sys.stdout.write_through,
               sys.stderr.errors, sys.stdout.encoding],
    "open_fds": len(open_fds()), "stdin_at_end": sys.stdin.read(), "flags": repr(sys.flags),
    "random": random.random(), "hash": hash("same text"), "names_at_start": names_at_start,
    "signals": [str(signal.getsignal(s)) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGPIPE)]
               + [signal.getsignal(signal.SIGINT) is signal.default_int_handler],
    "mp_main": sys.modules.get("__mp_main__", sys.modules["__main__"]) is sys.modules["__main__"],
    "launcher_imported": "launcher" in sys.modules,
}
out = os.environ["LAUNCHER_OUTPUTS_DIR"]
left_open = open(os.path.join(out, f"left-open-{rank}.txt"), "w")  # never closed, never flushed by the script
left_open.write("x" * 100 + "\\n")
atexit.register(lambda: open(os.path.join(out, f"atexit-{rank}.txt"), "w").write("ran"))
with open(os.path.join(out, f"facts-{rank}.json"), "w") as handle:
    handle.write(__import__("json").dumps(facts))
print(f"rank {rank} warm={warm}", flush=True)
if os.environ.get("EXIT_WITH") and rank == 1:
    sys.exit(int(os.environ["EXIT_WITH"]))
"""

# Programs that broke training processes forked from torchrun's process (an earlier design): each must run as
# it does from a fresh start.
PROGRAMS = """
import concurrent.futures, dataclasses, gzip, multiprocessing, os, threading, time
import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i): return torch.full((8,), float(i * i))

class Note:  # defined in __main__: a spawned child must unpickle it, so it must import this script as __mp_main__
    def __init__(self, text): self.text = text

def read_note(note): return note.text.upper()

@dataclasses.dataclass
class Answer:  # defined in __main__ and sent back from a spawned child: it must unpickle here too
    value: int

def answer(x): return Answer(x * 10)

if __name__ == "__main__":
    out, rank = os.environ["LAUNCHER_OUTPUTS_DIR"], os.environ["RANK"]
    total = sum(float(batch.sum()) for batch in DataLoader(Squares(), batch_size=4, num_workers=2))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawned = pool.apply(read_note, (Note("from main"),))
        answers = [item.value for item in pool.map(answer, [1, 2])]
    with open(os.path.join(out, f"result-{rank}.json"), "w") as handle:
        handle.write(__import__("json").dumps({"total": total, "spawned": spawned, "answers": answers}))
    left = gzip.open(os.path.join(out, f"left-open-{rank}.gz"), "wt")  # never closed: finalisation ends it
    left.write("compressed " * 1000)
    def later():
        time.sleep(0.3)  # still working when the script's last line has run: the interpreter waits for it
        open(os.path.join(out, f"thread-{rank}.txt"), "w").write("finished")
    threading.Thread(target=later).start()
    executor = concurrent.futures.ThreadPoolExecutor(1)
    executor.submit(lambda: open(os.path.join(out, f"executor-{rank}.txt"), "w").write("finished"))
"""

COLD = [{"name": "LAUNCHER_WARM_START", "value": "0"}]


def run(tmp_path: Path, script: str, env: list | None = None, *, args: list | None = None, nodes: int = 2,
        processes: int = 2, linked: bool = False):
    """``linked``: job.py is a symbolic link to the script in another directory."""
    (tmp_path / "extra").mkdir(exist_ok=True)
    spec = write_spec(tmp_path, script, nodes=nodes, args=args, extra_cluster={"processesPerNode": processes},
                      env=[{"name": "PYTHONPATH", "value": str(tmp_path / "extra")}, *(env or [])])
    if linked:
        (tmp_path / "lib").mkdir()
        (tmp_path / "job.py").rename(tmp_path / "lib" / "real_job.py")
        (tmp_path / "job.py").symlink_to(tmp_path / "lib" / "real_job.py")
    environment = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")}
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env=environment, timeout=300)
    return done, tmp_path / "wd" / run_id_from(done.stdout)


def facts_of(work: Path, name: str = "facts") -> dict[int, dict]:
    return {int(path.stem.split("-")[1]): json.loads(path.read_text()) for path in work.glob(f"outputs/*/{name}-*.json")}


def test_training_processes_start_warm_and_see_what_a_fresh_start_sees(tmp_path):
    runs = {}
    for label, env in (("warm", []), ("cold", COLD)):
        (tmp_path / label).mkdir()
        done, work = run(tmp_path / label, PROBE, env, args=["--lr", "0.1"], linked=True)
        assert done.returncode == 0, done.stdout + done.stderr
        runs[label] = facts_of(work)
        assert sorted(runs[label]) == [0, 1, 2, 3]
        for rank in range(4):
            left_open = next(work.glob(f"outputs/*/left-open-{rank}.txt"))
            assert left_open.read_text() == "x" * 100 + "\n", "a file left open is flushed at the end"
            assert next(work.glob(f"outputs/*/atexit-{rank}.txt")).read_text() == "ran"
    warm, cold = runs["warm"], runs["cold"]
    assert all(said["warm"] for said in warm.values()), "a training process imported torch itself: not warm"
    assert not any(said["warm"] for said in cold.values())
    for label, facts in runs.items():
        assert len({said["random"] for said in facts.values()}) == 4, f"{label}: every process has its own seed"
        assert len({said["hash"] for said in facts.values()}) == 4, f"{label}: every process its own hash seed"
    same = {"warm", "random", "hash"}
    for rank in range(4):
        in_warm = {key: value for key, value in warm[rank].items() if key not in same}
        in_cold = {key: value.replace("/cold", "/warm") if isinstance(value, str) else value
                   for key, value in cold[rank].items() if key not in same}
        in_cold["path"] = [entry.replace("/cold", "/warm") for entry in in_cold["path"]]
        in_cold["argv"] = cold[rank]["argv"]
        assert in_warm == in_cold, f"rank {rank}: a warm start differs from a fresh one"
    said = warm[0]
    assert said["name"] == "__main__" and said["argv"] == ["job.py", "--lr", "0.1"] and said["main_is_me"]
    assert said["path"][0] == str(tmp_path / "warm" / "lib"), "sys.path[0] is the linked script's own directory"
    share = max(1, usable_cores() // 4)  # 2 nodes of 2 processes on this machine
    assert said["threads"] == int(said["omp"]) == share, "OMP_NUM_THREADS, which the node sets, must hold"
    assert said["stack_file"], "launcher's rank hooks (stacks on a signal) run in a warm process too"
    assert said["annotation"] == "<class 'int'>", "the script is compiled with its own future imports only"


def test_programs_with_worker_processes_threads_and_open_files_run_warm_as_they_do_fresh(tmp_path):
    done, work = run(tmp_path, PROGRAMS, nodes=2, processes=1)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        result = json.loads(next(work.glob(f"outputs/*/result-{rank}.json")).read_text())
        assert result == {"total": 8.0 * sum(i * i for i in range(64)), "spawned": "FROM MAIN", "answers": [10, 20]}
        with gzip.open(next(work.glob(f"outputs/*/left-open-{rank}.gz")), "rt") as handle:
            assert handle.read() == "compressed " * 1000
        assert next(work.glob(f"outputs/*/thread-{rank}.txt")).read_text() == "finished"
        assert next(work.glob(f"outputs/*/executor-{rank}.txt")).read_text() == "finished"


def test_a_warm_process_exit_status_and_traceback_reach_the_node(tmp_path):
    done, _ = run(tmp_path, PROBE, env=[{"name": "EXIT_WITH", "value": "3"}])
    assert done.returncode != 0
    assert "cause: rank 1 exited with status 3" in done.stdout, done.stdout
    raises = "import os\nif os.environ['RANK'] == '2':\n    raise ValueError('bad batch 17')\n"
    done, _ = run(tmp_path, raises)
    assert done.returncode != 0
    assert "ValueError: bad batch 17" in done.stdout, done.stdout
    assert "job.py:3" in done.stdout, "the cause names the user's own line"
    assert "warm_interpreter" not in done.stdout and "runpy" not in done.stdout, "the traceback is the script's"


def test_ctrl_c_in_a_script_ends_it_as_it_ends_a_fresh_one(tmp_path):
    interrupted = "import os\nif os.environ['RANK'] == '1':\n    raise KeyboardInterrupt\n"
    causes = {}
    for label, env in (("warm", []), ("cold", COLD)):
        (tmp_path / label).mkdir()
        done, _ = run(tmp_path / label, interrupted, env, nodes=1)
        assert done.returncode != 0
        causes[label] = [line.replace(str(tmp_path / label), "") for line in done.stdout.splitlines()
                         if "exit status" in line or "cause:" in line]
    # an uncaught KeyboardInterrupt ends a process by SIGINT (the shell's 128 + 2), after the traceback
    assert causes["warm"] == causes["cold"] and "(exit status 130)" in " ".join(causes["warm"]), causes


def test_a_module_entry_starts_warm_as_python_m_runs_it(tmp_path):
    (tmp_path / "jobmod.py").write_text(PROBE)
    (tmp_path / "extra").mkdir()
    spec = write_spec(tmp_path, "", nodes=2, entry={"module": "jobmod"}, extra_cluster={"processesPerNode": 2},
                      env=[{"name": "PYTHONPATH", "value": str(tmp_path / "extra")}])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env={**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")},
                   timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    facts = facts_of(tmp_path / "wd" / run_id_from(done.stdout))
    assert len(facts) == 4 and all(said["warm"] and said["name"] == "__main__" and said["path"][0] == str(tmp_path)
                                   and said["orig_argv"] == ["-u", "-m", "jobmod"] for said in facts.values())


def test_without_warm_starts_every_training_process_starts_afresh(tmp_path):
    done, work = run(tmp_path, PROBE, COLD)
    assert done.returncode == 0, done.stdout + done.stderr
    facts = facts_of(work)
    assert sorted(facts) == [0, 1, 2, 3] and not any(said["warm"] for said in facts.values())


@pytest.mark.parametrize("imports, imported", [(None, False), ("torch._dynamo", True), ("", False)])
def test_a_warm_interpreter_imports_what_it_is_told_to(tmp_path, imports, imported):
    # DistributedDataParallel imports torch._dynamo as it is constructed: most of a round's start on few cores
    script = "import sys\nprint('dynamo', 'torch._dynamo' in sys.modules, flush=True)\n"
    env = [] if imports is None else [{"name": "LAUNCHER_WARM_IMPORTS", "value": imports}]
    done, _ = run(tmp_path, script, env, nodes=1, processes=1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"dynamo {imported}" in done.stdout, done.stdout


@pytest.mark.parametrize("imports_done", [False, True])
def test_a_taken_spare_says_whether_its_imports_were_done(monkeypatch, imports_done):
    """The timeline's "a spare, its imports done" is the spare's own word: taken at once, it has imported nothing."""
    monkeypatch.delenv("LAUNCHER_WARM_START", raising=False)
    spare = Spare(print)
    spare.prepare(1)
    if imports_done:
        assert select.select([spare.ready], [], [], 120)[0], "the spare never said its imports were done"
    proc, imported = spare.take([sys.executable, "-m", "launcher.node.torchrun.shim", "--", "--help"],
                                dict(os.environ))
    output = proc.stdout.read().decode()  # its stdin is closed: the command went through it
    assert proc.wait(timeout=120) == 0 and "usage: torchrun" in output, output
    proc.stdout.close()
    assert imported is imports_done


def test_a_spares_first_warm_interpreter_is_a_fork_of_it_that_imported_nothing_itself(monkeypatch):
    """The spare forks its first warm interpreter once torch is imported (one import for both) and spawns the others;
    the fork is set up as a spawned one is (own session, stdin from /dev/null, no other descriptor but its socket),
    and ends with the spare."""
    monkeypatch.delenv("LAUNCHER_WARM_START", raising=False)
    spare = Spare(print)
    spare.prepare(2)
    assert select.select([spare.ready], [], [], 120)[0], "the spare never said its imports were done"
    children = [int(pid) for pid in Path(f"/proc/{spare.proc.pid}/task/{spare.proc.pid}/children").read_text().split()]
    forked = [pid for pid in children if b"--spare" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(children) == 2 and len(forked) == 1, children
    [pid] = forked
    ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
    assert sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK") < 0.3, "it imported torch itself (over a second)"
    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert os.getsid(pid) == pid and fds[0] == os.devnull
    assert sorted(fds)[:3] == [0, 1, 2] and len(fds) == 4 and fds[max(fds)].startswith("socket:"), fds
    spare.discard()

    def ended(child: int) -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    assert wait_until(lambda: all(ended(child) for child in children), 30), "a warm interpreter outlived its spare"


def test_only_the_round_names_and_socket_interfaces_of_an_environment_may_differ_from_a_warm_interpreters():
    started = {"PATH": "/bin", "PYTHONPATH": "/hooks", "OMP_NUM_THREADS": "1"}
    rank = {**started, "RANK": "3", "LOCAL_RANK": "1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x",
            "LAUNCHER_STACKS_DIR": "/tmp/s", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert differing(started, rank) == []
    assert differing(started, {**rank, "PYTHONPATH": "/other"}) == ["PYTHONPATH"]
    assert differing(started, {**rank, "LD_PRELOAD": "libx.so"}) == ["LD_PRELOAD"]
    assert differing(started, {key: value for key, value in rank.items() if key != "OMP_NUM_THREADS"}) == \
        ["OMP_NUM_THREADS"]


def test_torch_reads_the_socket_interfaces_when_a_process_group_starts_not_at_import(tmp_path):
    """What allows them to differ: set after the import, gloo still uses the interface they name."""
    code = ("import os, torch, torch.distributed as dist\n"
            "os.environ['GLOO_SOCKET_IFNAME'] = 'no-such-interface'\n"
            "dist.init_process_group('gloo', init_method='file://' + os.sys.argv[1], rank=0, world_size=1)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode != 0 and "no-such-interface" in done.stderr, done.stderr


def test_a_spare_taken_for_a_round_whose_environment_differs_says_so_in_the_nodes_lines(monkeypatch):
    monkeypatch.delenv("LAUNCHER_WARM_START", raising=False)
    said: list[str] = []
    spare = Spare(said.append)
    spare.prepare(1)
    round_env = {**spare.env, "PYTHONHASHSEED": "7", "GLOO_SOCKET_IFNAME": "lo", "RANK": "0"}
    proc, _ = spare.take([sys.executable, "-m", "launcher.node.torchrun.shim", "--", "--help"], round_env)
    proc.stdout.read()
    assert proc.wait(timeout=120) == 0
    proc.stdout.close()
    assert said == ["the training processes start afresh, not warm: the round's environment differs in "
                    "PYTHONHASHSEED from the one the spare torchrun started with"]


@pytest.mark.parametrize("args, entry", [
    ((sys.executable, "-u", "job.py", "--lr", "1"), ("script", "job.py")),
    ((sys.executable, "-u", "-m", "pkg.train"), ("module", "pkg.train")),
    (("./train.sh", "--lr", "1"), None),  # --no-python: a program of its own
    ((sys.executable, "-X", "dev", "job.py"), None),  # interpreter options a warm start could not give
    (("/other/python", "-u", "job.py"), None),
])
def test_only_this_interpreter_running_a_script_or_module_starts_warm(args, entry):
    assert entry_of(args) == entry


def test_a_warm_interpreter_nobody_takes_ends_at_once_when_its_torchrun_does(tmp_path):
    code = ("import os, sys; from launcher.node.torchrun.warmstart import WarmPool; pool = WarmPool(2, os.environ); "
            "print(' '.join(str(w.proc.pid) for w in pool.ready), flush=True); pool.close()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for pid in done.stdout.split():
        assert not Path(f"/proc/{pid}").exists(), "an unused warm interpreter outlived its pool"


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), ("false", False), (" OFF ", False),
                                       ("no", False)])
def test_the_switch_reads_the_usual_words_for_off(value, on):
    assert warm_starts_on({} if value is None else {"LAUNCHER_WARM_START": value}) is on
