"""The run's summary names the exception and the innermost user frame of every kind of failure (issue 15).

Through the real CLI with real torchrun on 2 local nodes, most failing after a gloo process group
exists (torch then prefixes each line of the traceback with ``[rankN]: ``): an exception in a
function, at module level, in a ``@record``-decorated function, an allocation failure; before the
group exists; an ImportError; a SyntaxError in the entry script and in a module imported later; a
``module:`` entry point that does not exist; ``input()`` on a closed stdin (its prompt before the
traceback's header); a refusal of ``launcher.data`` raised under torch's DataLoader (the frame is the user's line, not launcher's or torch's); and, with 2 processes per node, a rank that raised
while the ranks waiting on it (on both nodes) report gloo connection errors. Then the parser on
captured text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from clirun import run_failing, run_id_from
from cluster import write_spec
from conftest import run_cli
from launcher.node.diagnosis.cause import describe, diagnose, from_stderr, library_file
from launcher.node.diagnosis.stacks import Frame, RankStack

RAISES_IN_A_FUNCTION = """
import torch.distributed as dist
dist.init_process_group("gloo")
def load_batch(step):
    if dist.get_rank() == 1 and step == 2:
        raise ValueError(f"corrupt batch at step {step}")
for step in range(3):
    load_batch(step)
    dist.barrier()
"""

RAISES_AT_MODULE_LEVEL = """
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise KeyError("label")
dist.barrier()
"""

# stderr is silenced: only the error file @record writes can tell, and it must be read before
# the node deletes torchrun's log dir.
RAISES_UNDER_RECORD = """
import os
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        raise RuntimeError("loss is nan")
    dist.barrier()

main()
"""

ALLOCATION_FAILS = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    weights = torch.empty(1 << 50, dtype=torch.uint8)
dist.barrier()
"""

RAISES_BEFORE_INIT = """
import os
import torch.distributed as dist
def load_batch(step):
    if os.environ["RANK"] == "1" and step == 2:
        raise ValueError(f"corrupt batch at step {step}")
for step in range(3):
    load_batch(step)
dist.init_process_group("gloo")
"""

IMPORT_ERROR = """
import torch.distributed as dist
from torch.nn import TransformerBlock
"""

SYNTAX_ERROR = """
import torch.distributed as dist
dist.init_process_group("gloo")
print("unclosed"
"""

IMPORTS_A_SYNTAX_ERROR = """
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    import augment
dist.barrier()
"""

# Raised in launcher's own library (launcher/data/sampler.py), called from torch's DataLoader, called from
# the user's loop: the summary points at the loop (issue 26), not at launcher's `raise` or torch's frames.
PLAIN_DATALOADER_WITH_ELASTIC_SAMPLER = """
from torch.utils.data import DataLoader
from launcher.data import ElasticSampler
sampler = ElasticSampler(8, records=False)
loader = DataLoader(list(range(8)), sampler=sampler, batch_size=2, num_workers=2)
for batch in loader:
    print(batch)
"""

# input() on a closed stdin: its prompt, written without a newline, begins the traceback's first line, and
# Python 3.11 marks the call with carets under the source line (issue 26).
READS_A_CLOSED_STDIN = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    sys.stdin = open(os.devnull)
    answer = input("Continue training? [y/N] ")
dist.barrier()
"""

# The rank that raised ends last, as one tearing down a CUDA context does: its peers' gloo errors
# reach torchrun first, on its own node as on the other.
RAISES_AND_ENDS_LAST = """
import atexit, time
import torch.distributed as dist
dist.init_process_group("gloo")
def slow_teardown():
    dist.destroy_process_group()
    time.sleep(3)
def step():
    if dist.get_rank() == 2:
        atexit.register(slow_teardown)
        raise ValueError("rank 2 raised first")
    dist.barrier()
step()
"""


@dataclass(frozen=True)
class Row:
    script: str
    exception: str
    frame: str | None  # FILE:LINE..., FILE relative to the code directory; None: no frame to name
    rank: int | None = 1  # None: every rank fails by itself, any may be first
    files: dict[str, str] = field(default_factory=dict)  # more files in the code directory
    entry: dict | None = None


ROWS = {
    "after init, in a function": Row(RAISES_IN_A_FUNCTION, "ValueError: corrupt batch at step 2",
                                     'job.py:6 in load_batch: raise ValueError(f"corrupt batch at step {step}")'),
    "after init, at module level": Row(RAISES_AT_MODULE_LEVEL, "KeyError: 'label'",
                                       'job.py:5 in <module>: raise KeyError("label")'),
    "after init, @record": Row(RAISES_UNDER_RECORD, "RuntimeError: loss is nan",
                               'job.py:11 in main: raise RuntimeError("loss is nan")'),
    "after init, allocation failure": Row(ALLOCATION_FAILS, "DefaultCPUAllocator: can't allocate memory",
                                          "job.py:5 in <module>: weights = torch.empty(1 << 50, dtype=torch.uint8)"),
    "before init": Row(RAISES_BEFORE_INIT, "ValueError: corrupt batch at step 2",
                       'job.py:6 in load_batch: raise ValueError(f"corrupt batch at step {step}")'),
    "ImportError at the top": Row(IMPORT_ERROR, "ImportError: cannot import name 'TransformerBlock'",
                                  "job.py:3 in <module>: from torch.nn import TransformerBlock", rank=None),
    "SyntaxError in the entry script": Row(SYNTAX_ERROR, "SyntaxError: '(' was never closed",
                                           'job.py:4: print("unclosed"', rank=None),
    "SyntaxError in a module imported later": Row(
        IMPORTS_A_SYNTAX_ERROR, "SyntaxError: '[' was never closed", "augment.py:2: return image[:, ::-1",
        files={"augment.py": "def flip(image):\n    return image[:, ::-1\n"}),
    "launcher.data refusal under torch's DataLoader": Row(
        PLAIN_DATALOADER_WITH_ELASTIC_SAMPLER, "RuntimeError: ElasticSampler with 2 training processes",
        "job.py:6 in <module>: for batch in loader:", rank=None),
    "input() on a closed stdin": Row(READS_A_CLOSED_STDIN, "EOFError: EOF when reading a line",
                                     'job.py:7 in <module>: answer = input("Continue training? [y/N] ")'),
    "module entry point that does not exist": Row(
        "", "Error while finding module specification for 'trainer.main' "
            "(ModuleNotFoundError: No module named 'trainer')", None, rank=None, entry={"module": "trainer.main"}),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_the_summary_names_the_exception_and_the_user_frame(tmp_path, launcher_home, row):
    for name, text in row.files.items():
        (tmp_path / name).write_text(text)
    _, summary = run_failing(tmp_path, row.script, entry=row.entry)
    cause = summary.split("  cause: ", 1)[1]
    ranks = [row.rank] if row.rank is not None else [0, 1]
    assert any(cause.startswith(f"rank {rank}: ") for rank in ranks), summary
    assert row.exception in cause.splitlines()[0], summary
    if row.frame:
        assert f"\n    at {tmp_path}/{row.frame}\n" in summary, summary
    else:
        assert "\n    at " not in summary, summary


def test_with_two_processes_per_node_the_rank_that_raised_is_the_cause_not_its_victims(tmp_path, launcher_home):
    output, summary = run_failing(tmp_path, RAISES_AND_ENDS_LAST, extra_cluster={"processesPerNode": 2})
    assert len(re.findall(r"Connection (closed|reset) by peer", output)) >= 3  # ranks 0, 1 and 3 lost their peer
    assert "failed: node t-worker-0 exited" in summary
    assert "cause: rank 2: ValueError: rank 2 raised first" in summary
    assert f"at {tmp_path}/job.py:11 in step: raise ValueError" in summary
    assert "stopped because of it: node t-main" in summary
    status = json.loads(run_cli("status", run_id_from(output), "--json").stdout)
    cause = status["first_failure"]["cause"]
    assert (cause["local_rank"], cause["signal"]) == (0, "SIGTERM")  # torchrun saw a victim end first


# The parser on captured text.

TORCHRUN_REPORT = """\
Failures:
[1]:
  time      : 2026-11-23_09:01:10
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 4445)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4445
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_09:01:10
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 4446)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
""".splitlines()

GLOO_ERROR = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/code/train.py", line 9, in <module>
[rank2]:     dist.barrier()
[rank2]:   File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 5356, in barrier
[rank2]:     work.wait()
[rank2]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:11155.""".splitlines()

USER_ERROR = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/code/train.py", line 7, in <module>
[rank3]:     raise ValueError("bad shard")
[rank3]: ValueError: bad shard""".splitlines()


def test_a_victim_that_torchrun_saw_end_first_gives_way_to_the_rank_that_raised():
    cause = diagnose(TORCHRUN_REPORT, {0: GLOO_ERROR, 1: USER_ERROR})
    assert (cause.rank, cause.local_rank, cause.signal) == (3, 1, "SIGTERM")
    assert (cause.exception, cause.frame) == ("ValueError: bad shard", '/code/train.py:7 in <module>: '
                                              'raise ValueError("bad shard")')
    victims_only = diagnose(TORCHRUN_REPORT, {0: GLOO_ERROR, 1: GLOO_ERROR})
    assert victims_only.rank == 2 and "Connection closed by peer" in victims_only.exception


def test_the_root_cause_stands_when_it_raised_something_of_its_own():
    cause = diagnose(TORCHRUN_REPORT, {0: [line.replace("rank3", "rank2") for line in USER_ERROR], 1: GLOO_ERROR})
    assert cause.rank == 2 and cause.exception == "ValueError: bad shard"


@pytest.mark.parametrize("prefix", ["", "[rank3]: ", "[default1]:", "2026-11-23 09:01:10,123 "])
def test_a_traceback_is_read_whatever_its_prefix(prefix):
    lines = ["step 1", *(prefix + line[len("[rank3]: "):] for line in USER_ERROR), prefix]
    assert from_stderr(lines) == ("ValueError: bad shard", '/code/train.py:7 in <module>: raise ValueError("bad shard")')


def test_a_traceback_that_lost_its_top_still_names_the_exception():
    assert from_stderr(GLOO_ERROR[1:]) == (GLOO_ERROR[-1][len("[rank2]: "):], "/code/train.py:9 in <module>: "
                                                                             "dist.barrier()")


# input() on a closed stdin, as a rank's interleaved stdout and stderr hold it: the prompt (stdout, no newline, no
# prefix) stands before the header; Python 3.11 marks the call with carets.
READS_A_CLOSED_STDIN_OUTPUT = """\
Continue training? [y/N] PREFIXTraceback (most recent call last):
PREFIX  File "/code/train.py", line 7, in <module>
PREFIX    answer = input("Continue training? [y/N] ")
PREFIX             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
PREFIXEOFError: EOF when reading a line""".splitlines()


@pytest.mark.parametrize("prefix", ["", "[rank1]: "])
def test_output_before_the_header_on_its_line_does_not_hide_the_exception(prefix):
    lines = [line.replace("PREFIX", prefix) for line in READS_A_CLOSED_STDIN_OUTPUT]
    assert from_stderr(lines) == ("EOFError: EOF when reading a line",
                                  '/code/train.py:7 in <module>: answer = input("Continue training? [y/N] ")')


def test_a_line_of_carets_is_never_the_exception():
    lines = ["Traceback (most recent call last):", '  File "/code/train.py", line 3, in <module>',
             "    total = ratio[0] / ratio[1]", "^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^", "~~~~~~~~^~~~~~~~~~",
             "ZeroDivisionError: division by zero"]
    assert from_stderr(lines)[0] == "ZeroDivisionError: division by zero"


# As rank 1 printed it (the run above), launcher installed in another place than this test's: in an
# image's copy, and as a relative path (a checkout on PYTHONPATH as ".").
LIBRARY_REFUSAL = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/code/train.py", line 31, in <module>
[rank1]:     main()
[rank1]:   File "/code/train.py", line 24, in main
[rank1]:     for batch in loader:
[rank1]:   File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 494, in __iter__
[rank1]:     return self._get_iterator()
[rank1]:            ^^^^^^^^^^^^^^^^^^^^
[rank1]:   File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 715, in _next_index
[rank1]:     return next(self._sampler_iter)  # may raise StopIteration
[rank1]:            ^^^^^^^^^^^^^^^^^^^^^^^^
[rank1]:   File "/venv/lib/python3.11/site-packages/torch/utils/data/sampler.py", line 334, in __iter__
[rank1]:     sampler_iter = iter(self.sampler)
[rank1]:                    ^^^^^^^^^^^^^^^^^^
[rank1]:   File "LAUNCHER/data/sampler.py", line 131, in __iter__
[rank1]:     raise RuntimeError(
[rank1]: RuntimeError: ElasticSampler with 2 training processes must be read through launcher.data.ElasticLoader""".splitlines()


@pytest.mark.parametrize("launcher_dir", ["/opt/node/.launcher/launcher", "launcher", "/work/src/launcher"])
def test_a_frame_in_launchers_own_library_or_torchs_is_not_the_users(launcher_dir):
    lines = [line.replace("LAUNCHER", launcher_dir) for line in LIBRARY_REFUSAL]
    assert from_stderr(lines) == ("RuntimeError: ElasticSampler with 2 training processes must be read through "
                                  "launcher.data.ElasticLoader", "/code/train.py:24 in main: for batch in loader:")
    torch_elsewhere = [line.replace("/venv/lib/python3.11/site-packages/torch", "/opt/pytorch/torch") for line in lines]
    assert from_stderr(torch_elsewhere)[1] == "/code/train.py:24 in main: for batch in loader:"


def test_what_is_a_library_file():
    import launcher

    own = f"{Path(launcher.__file__).parent}/data/sampler.py"
    for path in (own, "launcher/node/main.py", "/elsewhere/launcher/data/loader.py", "<frozen runpy>",
                 "/usr/lib/python3.11/runpy.py", "/venv/lib/python3.11/site-packages/numpy/core/fromnumeric.py",
                 "/opt/pytorch/torch/utils/data/dataloader.py"):
        assert library_file(path), path
    # the user's: their own files, whatever the directory is called, and code run from a string
    for path in ("/code/train.py", "/code/launcher/train.py", "/code/launcher_utils/data/sampler.py",
                 "/code/data/sampler.py", "<string>", "train.py"):
        assert not library_file(path), path


def test_a_hung_ranks_place_is_the_users_line_not_launchers():
    import launcher

    stack = RankStack(0, (Frame(f"{Path(launcher.__file__).parent}/data/store.py", 80, "read"),
                          Frame("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 715, "_next_index"),
                          Frame("/code/train.py", 24, "main"), Frame("/code/train.py", 31, "<module>")))
    assert str(stack.innermost_user_frame) == "/code/train.py:24 in main"


def test_torchrun_killed_from_outside_is_named_with_its_signal():
    """No failure report and no error of torchrun's own: the signal its process ended with is the cause."""
    killed = diagnose(["[launcher] starting", "rank 0: epoch 1"], {}, torchrun_code=-9).to_dict()
    assert describe(killed) == "torchrun killed by SIGKILL (often the out-of-memory killer)"
    assert (killed["exit_code"], killed["torchrun"]) == (137, True)
    assert describe(diagnose([], {}, torchrun_code=1).to_dict()) == "a training process"  # nothing more is known

def test_a_syntax_error_and_a_missing_module():
    caret_block = ['  File "/code/train.py", line 4', '    print("unclosed"', "         ^",
                   "SyntaxError: '(' was never closed"]
    assert from_stderr(["warming up", *caret_block]) == ("SyntaxError: '(' was never closed",
                                                         '/code/train.py:4: print("unclosed"')
    assert from_stderr(["/usr/bin/python3: No module named trainer"]) == ("No module named trainer", None)
    assert from_stderr(["some output", ""]) == (None, None)


def test_an_abort_at_exit_with_threads_running_points_at_the_open_process_group():
    """Seen in CI: every rank printed "done", then rank 0 aborted as it exited with gloo's threads alive."""
    aborted = {"rank": 0, "signal": "SIGABRT", "exit_code": 134,
               "stderr_tail": ["rank 0 of 2 done", "terminate called without an active exception"]}
    assert describe(aborted) == ("rank 0 killed by SIGABRT as it exited, with threads still running (often a process "
                                 "group left open: call dist.destroy_process_group() before the program ends)")
    assert describe({**aborted, "stderr_tail": ["assertion failed"]}) == "rank 0 killed by SIGABRT"


def test_torchrun_failing_itself_is_named_with_its_message(tmp_path, launcher_home):
    """A fixed port that is taken: torchrun on the main cannot open its store; no training process ran."""
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        _, summary = run_failing(tmp_path, "print('never runs', flush=True)\n",
                                 extra_cluster={"port": taken.getsockname()[1]})
    assert "cause: torchrun: " in summary and "EADDRINUSE" in summary, summary


def test_a_node_that_cannot_start_says_why(tmp_path, launcher_home):
    """A broken PYTHONHOME in one group's env: the node process dies before it can report anything."""
    spec = write_spec(tmp_path, "print('fine', flush=True)\n", nodes=2)
    data = yaml.safe_load(spec.read_text())
    data["spec"]["cluster"]["spec"]["worker"]["config"] = {"env": [{"name": "PYTHONHOME", "value": "/nowhere"}]}
    spec.write_text(yaml.safe_dump(data))
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = done.stdout[done.stdout.rindex("\nrun "):]
    assert "node t-worker-0 exited with status 1" in summary, summary
    assert "without reporting: ModuleNotFoundError: No module named 'encodings'" in summary, summary
    assert "its console log is" in summary


def test_nodes_failing_on_their_own_are_also_failed_not_victims(tmp_path, launcher_home):
    script = ("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
              "raise ValueError(f'bad config on rank {dist.get_rank()}')\n")
    _, summary = run_failing(tmp_path, script)
    assert re.search(r"cause: rank (0|1): ValueError: bad config on rank \1", summary), summary
    assert re.search(r"also failed: node t-\S+: rank (0|1): ValueError: bad config", summary), summary
    assert "stopped because of it" not in summary
