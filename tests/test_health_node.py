"""The node side of run health (issue 39): the sampler on real processes, GPUs through stand-ins for NVML and
nvidia-smi, the ranks' progress on a real local run (real torchrun, real optimizers), and the rank side outside
launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster import write_spec
from clirun import info_of, run_id_from
from conftest import REPO, run_cli
from launcher.data import rankprogress
from launcher.node.diagnosis.stacks import HOOKS_DIR
from launcher.node.health.gpus import GpuReader, parse_smi
from launcher.node.health.procfs import throttled_s
from launcher.node.health.ranks import RankWindows
from launcher.gpus import Gpu
from launcher.node.health.sampler import SAMPLE_VAR, WINDOW_VAR, HealthSampler, seconds_from_env, start_sampler
from launcher.protocol.health import MAX_SAMPLES, HealthRecord, read_series
from launcher.protocol.status import StatusRecord, status_key
from launcher.protocol.store import WorkDir

MIB = 1 << 20
SMI_LISTING = ("0, NVIDIA H100 80GB HBM3, 87, 40960, 81559, 312.45, 61\n"
               "1, NVIDIA H100 80GB HBM3, 3, 1024, 81559, [N/A], 35\n")
FAKE_SMI = f"""#!/bin/sh
case "$1" in --query-gpu=index,name,utilization.gpu,*) printf '{SMI_LISTING}' ;; *) exit 9 ;; esac
"""
# A stand-in for nvidia-ml-py: two GPUs; FAKE_NVML_FAIL makes nvmlInit fail as it does without a driver;
# FAKE_NVML_PIDS ("gpu:pid,...") says which processes compute on which GPU; FAKE_NVML_BROKEN ("count", "handleN")
# makes that query fail as it does once a GPU falls off the bus.
FAKE_PYNVML = '''
import os
from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


def nvmlInit():
    if os.environ.get("FAKE_NVML_FAIL"):
        raise NVMLError("Driver Not Loaded")


def nvmlDeviceGetCount():
    if os.environ.get("FAKE_NVML_BROKEN") == "count":
        raise NVMLError("GPU is lost")
    return 2


def nvmlDeviceGetHandleByIndex(index):
    if os.environ.get("FAKE_NVML_BROKEN") == f"handle{index}":
        raise NVMLError("GPU is lost")
    return index


def nvmlDeviceGetName(handle):
    return b"NVIDIA A100-SXM4-40GB"


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=[95, 40][handle], memory=10)


def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(used=(handle + 1) * 2**30, total=40 * 2**30, free=0)


def nvmlDeviceGetPowerUsage(handle):
    if handle == 1:
        raise NVMLError("Not Supported")
    return 250500


def nvmlDeviceGetTemperature(handle, sensor):
    return 50 + handle


def nvmlDeviceGetComputeRunningProcesses(handle):
    pairs = [item.split(":") for item in os.environ.get("FAKE_NVML_PIDS", "").split(",") if item]
    return [SimpleNamespace(pid=int(pid), usedGpuMemory=0) for gpu, pid in pairs if int(gpu) == handle]
'''


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """A directory for a fake nvidia-smi first on PATH and one for a fake pynvml first on the import path."""
    tools, modules = tmp_path / "bin", tmp_path / "modules"
    tools.mkdir()
    modules.mkdir()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    return tools, modules


def add_fake_smi(tools: Path) -> None:
    smi = tools / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)


def test_nvml_reports_each_given_gpu_and_which_process_uses_it(stand_ins, monkeypatch):
    tools, modules = stand_ins
    (modules / "pynvml.py").write_text(FAKE_PYNVML)
    add_fake_smi(tools)  # present, and not used: NVML answers
    monkeypatch.setenv("FAKE_NVML_PIDS", "0:111,1:222")
    reader = GpuReader()
    assert reader.source == "nvml"
    gpus, users = reader.read()
    assert gpus == [
        {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "util_percent": 95.0, "mem_used_bytes": 2**30,
         "mem_total_bytes": 40 * 2**30, "power_watts": 250.5, "temp_c": 50},
        {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "util_percent": 40.0, "mem_used_bytes": 2 * 2**30,
         "mem_total_bytes": 40 * 2**30, "power_watts": None, "temp_c": 51}]
    assert users == {111: 0, 222: 1}
    given = GpuReader(allowed=["1"])  # CUDA_VISIBLE_DEVICES=1: the machine's GPU 1 only, first in the list
    gpus, users = given.read()
    assert [gpu["index"] for gpu in gpus] == [1] and users == {222: 1}  # the GPU by its index, as the rank entries name it


def test_a_failing_nvml_falls_back_to_nvidia_smi(stand_ins, monkeypatch):
    tools, modules = stand_ins
    (modules / "pynvml.py").write_text(FAKE_PYNVML)
    add_fake_smi(tools)
    monkeypatch.setenv("FAKE_NVML_FAIL", "1")
    reader = GpuReader()
    assert reader.source == "nvidia-smi"
    gpus, users = reader.read()
    assert gpus == parse_smi(SMI_LISTING) == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_percent": 87.0, "mem_used_bytes": 40960 * MIB,
         "mem_total_bytes": 81559 * MIB, "power_watts": 312.45, "temp_c": 61.0},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "util_percent": 3.0, "mem_used_bytes": 1024 * MIB,
         "mem_total_bytes": 81559 * MIB, "power_watts": None, "temp_c": 35.0}]
    assert users == {}  # nvidia-smi's query cannot tell
    assert [gpu["index"] for gpu in GpuReader(allowed=["0"]).read()[0]] == [0]


def test_a_driver_that_stops_answering_gives_fewer_figures_not_an_error(stand_ins, monkeypatch):
    tools, modules = stand_ins
    (modules / "pynvml.py").write_text(FAKE_PYNVML)
    reader = GpuReader()
    monkeypatch.setenv("FAKE_NVML_BROKEN", "handle0")
    assert [gpu["index"] for gpu in reader.read()[0]] == [1]
    monkeypatch.setenv("FAKE_NVML_BROKEN", "count")
    assert reader.read() == ([], {})
    monkeypatch.setenv("FAKE_NVML_FAIL", "1")
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Unable to determine the device handle for GPU0000:01:00.0: Unknown Error'\n"
                   "exit 15\n")
    smi.chmod(0o755)
    fallen_back = GpuReader()
    assert fallen_back.source == "nvidia-smi" and fallen_back.read() == ([], {})


def test_the_node_samples_only_the_gpus_it_was_given_at_the_interval_its_env_asks(stand_ins, tmp_path):
    _, modules = stand_ins
    (modules / "pynvml.py").write_text(FAKE_PYNVML)
    store = WorkDir(str(tmp_path / "wd"))
    status = StatusRecord(store, "node-a", "run-1")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1f", SAMPLE_VAR: "0.1"}  # a UUID's prefix: the machine's GPU 1
    said: list[str] = []
    sampler = start_sampler(store, status, "node-a", 0, lambda: ("", {}), [Gpu("1", "GPU-1f00")], said.append, env)
    deadline = time.monotonic() + 30
    while not sampler.record.samples:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sampler.stop()
    assert sampler.interval == 1.0 and sampler.window == 60.0  # no faster than the ranks write their progress
    assert said == ["LAUNCHER_HEALTH_SAMPLE='0.1' is below 1 s, how often training processes write their progress: "
                    "using 1"]
    assert [gpu["index"] for gpu in read_series(store, "node-a")["samples"][0]["gpus"]] == [1]
    everything = start_sampler(store, status, "node-a", 0, lambda: ("", {}), [Gpu("1")], print, {})
    everything.stop()
    assert [gpu["index"] for gpu in everything.gpus.read()[0]] == [0, 1]  # CUDA_VISIBLE_DEVICES unset: all


def test_without_nvml_or_nvidia_smi_there_are_no_gpus_and_none_is_looked_for_again(stand_ins, monkeypatch):
    tools, _ = stand_ins
    monkeypatch.setenv("PATH", str(tools))  # no nvidia-smi anywhere on it, and no pynvml to import
    reader = GpuReader()
    assert reader.source is None and reader.read() == ([], {})
    add_fake_smi(tools)  # one appearing later is not looked for at every sample
    assert reader.read() == ([], {})


def start_rank_process(stacks: Path, local: int, body: str) -> subprocess.Popen:
    """A process as torchrun starts a training process (rank hooks first on PYTHONPATH), running ``body``, which
    prints "ready" once it is what the test measures."""
    env = {**os.environ, "LAUNCHER_STACKS_DIR": str(stacks), "LOCAL_RANK": str(local), "RANK": str(10 + local),
           "PYTHONPATH": f"{HOOKS_DIR}{os.pathsep}{REPO}"}
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(body)], env=env, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


BUSY = """
    print("ready", flush=True)
    while True:
        pass
"""
IDLE = """
    import time
    print("ready", flush=True)
    time.sleep(600)
"""
BIG = """
    import time
    data = b"1" * (200 << 20)  # every page written: resident
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def rank_processes(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    started = []
    try:
        for local, body in enumerate((BUSY, IDLE, BIG)):
            started.append(start_rank_process(stacks, local, body))
        yield stacks, started
    finally:
        for process in started:
            process.kill()
            process.wait()


def await_progress_files(stacks: Path, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(list(stacks.glob("*.progress"))) < count:
        assert time.monotonic() < deadline, f"no progress files in {stacks}: {os.listdir(stacks)}"
        time.sleep(0.05)  # the writer threads give no signal but their files


def test_the_sampler_sees_each_ranks_cpu_and_memory_on_real_processes(tmp_path, rank_processes, stand_ins,
                                                                      monkeypatch):
    stacks, (busy, idle, big) = rank_processes
    _, modules = stand_ins
    (modules / "pynvml.py").write_text(FAKE_PYNVML)
    monkeypatch.setenv("FAKE_NVML_PIDS", f"1:{busy.pid}")
    await_progress_files(stacks, 3)
    store = WorkDir(str(tmp_path / "wd"))
    status = StatusRecord(store, "node-a", "run-1")
    record = HealthRecord(store, "node-a", interval=1.0)
    sampler = HealthSampler(record, status, lambda: (str(stacks), {10: 1234.5}), cores=2, gpus=GpuReader(),
                            interval=1.0, window=60.0)
    first = sampler.sample()
    assert "cpu_percent" not in first  # nothing to compare with yet
    time.sleep(2)  # the interval CPU use is measured over
    sample = sampler.sample()
    ranks = sample["ranks"]
    assert sorted(ranks) == ["10", "11", "12"]  # keyed by global rank
    assert [ranks[key]["pid"] for key in ("10", "11", "12")] == [busy.pid, idle.pid, big.pid]
    # on a loaded machine the busy process may get well under a core: compared, not required to be 100
    assert ranks["10"]["cpu_percent"] > ranks["11"]["cpu_percent"] + 20, ranks
    assert sample["cpu_percent"] >= ranks["10"]["cpu_percent"]  # the node's tree holds its ranks
    assert ranks["12"]["rss_bytes"] >= 200 * MIB > ranks["11"]["rss_bytes"]
    assert sample["rss_bytes"] >= sum(rank["rss_bytes"] for rank in ranks.values())
    assert 0 < sample["mem_available_bytes"] <= sample["mem_total_bytes"]
    assert ranks["10"]["gpu"] == 1 and "gpu" not in ranks["11"]  # NVML named the busy one's GPU
    assert ranks["10"]["last_line_at"] == 1234.5 and "last_line_at" not in ranks["11"]
    assert ranks["11"]["steps"] == 0 and ranks["11"]["step_source"] is None
    assert sample["window_seconds"] == 60.0 and len(sample["gpus"]) == 2


def test_samples_reach_the_record_and_ride_on_the_next_heartbeat(tmp_path, rank_processes):
    stacks, _ = rank_processes
    store = WorkDir(str(tmp_path / "wd"))
    status = StatusRecord(store, "node-a", "run-1")
    status.update(state="running")
    record = HealthRecord(store, "node-a", interval=0.2)
    sampler = HealthSampler(record, status, lambda: (str(stacks), {}), cores=2, gpus=GpuReader(allowed=[]),
                            interval=0.2, window=60.0).start()
    deadline = time.monotonic() + 30
    while len(record.samples) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sampler.stop()
    written = store.get_record(status_key("node-a"))
    assert "health" not in written  # noted, not written: the sample costs no write of its own
    status.heartbeat()
    assert store.get_record(status_key("node-a"))["health"] == record.latest
    series = read_series(store, "node-a")
    assert series["samples"] == record.samples and series["interval"] == 0.2


def progress(pid: int, steps: dict, cpu_s: float, wait_s: float, samples: int = 0) -> dict:
    return {"pid": pid, "steps": steps, "samples": samples, "cpu_s": cpu_s, "data_wait_s": wait_s, "metrics": {}}


def test_work_per_step_is_measured_over_the_window_and_report_counts_first():
    windows = RankWindows(window=10.0)
    starting = windows.figures(progress(7, {}, 0.9, 0.0), now=95.0)  # imports and set-up: not a step's work
    assert starting["steps"] == 0 and starting["step_source"] is None and "work_per_step_s" not in starting
    assert windows.figures(progress(7, {"loader": 10}, 1.0, 0.5, 320), now=100.0)["step_source"] == "loader"
    for now, steps, cpu in ((105.0, 20, 3.0), (110.0, 30, 5.0)):
        figures = windows.figures(progress(7, {"loader": steps, "optimizer": steps}, cpu, 0.5 + (now - 100) / 10,
                                           samples=32 * steps), now=now)
    # over 100..110: 20 steps, 4 s of CPU and 1 s waiting for data
    assert figures["step_source"] == "optimizer" and figures["steps"] == 30
    assert figures["window_s"] == 10.0 and figures["work_per_step_s"] == pytest.approx(0.25)
    assert figures["data_wait_fraction"] == pytest.approx(0.1)
    assert figures["steps_per_s"] == 2.0 and figures["samples_per_s"] == 64.0
    later = windows.figures(progress(7, {"report": 4, "optimizer": 40}, 7.0, 1.5), now=115.0)
    assert later["step_source"] == "report" and later["steps"] == 4
    assert later["window_s"] == 10.0  # the window moved on: it starts at the newest snapshot a window old


def test_the_share_of_the_window_a_cpu_quota_held_a_rank_back_is_measured():
    windows = RankWindows(window=10.0)
    windows.figures(progress(7, {"loader": 10}, 1.0, 0.0), now=100.0, throttled_s=3.0)
    figures = windows.figures(progress(7, {"loader": 20}, 1.2, 0.0), now=110.0, throttled_s=11.0)
    assert figures["throttled_fraction"] == pytest.approx(0.8)  # held back 8 s of 10
    assert "throttled_fraction" not in RankWindows(10.0).figures(progress(8, {"loader": 1}, 1.0, 0.0), now=5.0)


@pytest.mark.parametrize("layout", ["v2", "v2 beside v1", "v1"])
def test_a_cgroups_throttled_time_is_read_with_its_ancestors_in_either_version(tmp_path, layout):
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    if layout == "v1":
        (proc / "42" / "cgroup").write_text("5:memory:/job\n2:cpu,cpuacct:/job/rank\n0::/\n")
        stats = {cgroups / "cpu,cpuacct" / "job" / "rank": "throttled_time 2000000000",
                 cgroups / "cpu,cpuacct" / "job": "nr_throttled 3\nthrottled_time 500000000"}
    else:
        (proc / "42" / "cgroup").write_text("0::/job/rank\n")
        mount = cgroups if layout == "v2" else cgroups / "unified"
        stats = {mount / "job" / "rank": "usage_usec 9\nthrottled_usec 2000000", mount / "job": "throttled_usec 500000"}
    for directory, text in stats.items():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.stat").write_text(text + "\n")
    assert throttled_s(42, proc, cgroups) == pytest.approx(2.5)
    assert throttled_s(43, proc, cgroups) is None  # gone


def test_a_real_cpu_quota_shows_as_throttled_time(tmp_path):
    """A busy process in a cgroup of its own held to 10% of a core (v1 cpu.cfs_quota_us or v2 cpu.max, where this
    machine lets the tests make one)."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    group = (v1 if (v1 / "cgroup.procs").exists() else v2) / f"launcher-test-{os.getpid()}"
    try:
        group.mkdir()
        if (group / "cpu.cfs_quota_us").exists():
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("10000")
        else:
            (group / "cpu.max").write_text("10000 100000")
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup with a CPU quota here: {exc}")
    busy = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()\nwhile True: pass"],
                            stdin=subprocess.PIPE, text=True)
    try:
        (group / "cgroup.procs").write_text(str(busy.pid))
        before = throttled_s(busy.pid)
        busy.stdin.write("go\n")
        busy.stdin.flush()
        time.sleep(1.5)  # the quota's effect is measured over time: there is no event to wait for
        after = throttled_s(busy.pid)
        assert before is not None and after is not None and after - before > 0.5, (before, after)
    finally:
        busy.kill()
        busy.wait()
        group.rmdir()


def test_env_overrides_and_what_a_bad_value_says():
    said = []
    assert seconds_from_env({SAMPLE_VAR: "2.5"}, SAMPLE_VAR, 5.0, said.append, minimum=1.0) == 2.5
    assert seconds_from_env({}, WINDOW_VAR, 60.0, said.append) == 60.0
    assert said == []
    assert seconds_from_env({SAMPLE_VAR: "0.01"}, SAMPLE_VAR, 5.0, said.append, minimum=1.0, why=" (why)") == 1.0
    assert seconds_from_env({WINDOW_VAR: "soon"}, WINDOW_VAR, 60.0, said.append) == 60.0
    assert seconds_from_env({SAMPLE_VAR: "-1"}, SAMPLE_VAR, 5.0, said.append) == 5.0
    assert said == ["LAUNCHER_HEALTH_SAMPLE='0.01' is below 1 s (why): using 1",
                    "LAUNCHER_HEALTH_WINDOW='soon' is not a number of seconds above 0: using 60",
                    "LAUNCHER_HEALTH_SAMPLE='-1' is not a number of seconds above 0: using 5"]


OUTSIDE = """
import os, sys, threading
import launcher.data
launcher.data.report(3, loss=0.5)
launcher.data.report("three", loss=object())
launcher.data.report(-1, **{"x" * 500: 1.0})
assert threading.active_count() == 1, threading.enumerate()
print("fine")
"""


def test_report_outside_launcher_is_a_no_op(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("LAUNCHER_STACKS_DIR", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", OUTSIDE], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "fine\n", done.stderr
    assert list(tmp_path.iterdir()) == []


def test_report_never_raises_into_training_when_its_file_cannot_be_written(tmp_path):
    env = {**os.environ, "LAUNCHER_STACKS_DIR": str(tmp_path / "gone"), "LOCAL_RANK": "0",
           "PYTHONPATH": f"{HOOKS_DIR}{os.pathsep}{REPO}"}
    script = "import launcher.data\nfor step in range(3): launcher.data.report(step, loss=1.0)\nprint('fine')"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "fine\n", done.stderr


@pytest.mark.parametrize("elastic", [False, True])
def test_every_dataloader_counts_batches_samples_and_waits(elastic):
    torch = pytest.importorskip("torch")
    from launcher.data import ElasticLoader, ElasticSampler

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, index):
            time.sleep(0.005)  # the data it waits for
            return torch.tensor([float(index)])

    assert rankprogress.hook_loaders() and rankprogress.hook_loaders()  # once, however often asked
    before = rankprogress.counters.snapshot()
    loader = (ElasticLoader(Slow(), batch_size=8, sampler=ElasticSampler(40, 8, records=False, rank=0, world_size=1))
              if elastic else torch.utils.data.DataLoader(Slow(), batch_size=8))
    assert sum(len(batch) for batch in loader) == 40
    after = rankprogress.counters.snapshot()
    assert after["steps"]["loader"] - before["steps"].get("loader", 0) == 5
    assert after["samples"] - before["samples"] == 40
    waited = after["data_wait_s"] - before["data_wait_s"]
    assert waited >= 40 * 0.005 > after["data_cpu_s"] - before["data_cpu_s"]  # it slept: waited, not computed


def test_a_batchs_samples_are_its_first_tensors_first_dimension():
    torch = pytest.importorskip("torch")
    assert rankprogress.batch_samples(torch.zeros(6, 3)) == 6
    assert rankprogress.batch_samples((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert rankprogress.batch_samples({"input_ids": torch.zeros(4, 128), "label": torch.zeros(4)}) == 4
    assert rankprogress.batch_samples([["a", "b", "c"], torch.zeros(3)]) == 3
    assert rankprogress.batch_samples(torch.tensor(1.0)) == 1
    assert rankprogress.batch_samples(None) == 0 and rankprogress.batch_samples([]) == 0


OPTIMIZER_ONLY = """
import sys
import time

print("warm" if "torch" in sys.modules else "cold", "start", flush=True)  # a warm interpreter imported it already
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(STEPS):
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    time.sleep(0.01)
    if step % 100 == 0:
        print(f"step {step}", flush=True)
dist.destroy_process_group()
"""
REPORTING = """
import time
import launcher.data

for step in range(1, STEPS + 1):
    time.sleep(0.01)
    launcher.data.report(step, loss=1.0 / step, **{f"extra_{i}_" + "x" * 100: i for i in range(40)})
"""


def trained_samples(tmp_path: Path, script: str, launcher_home: Path,
                    **env_vars: str) -> tuple[list[dict], list[dict], str]:
    """Run ``script`` on 2 local nodes of 2 processes each, sampled every second; (every node's health record,
    every node's final status record, the run's output)."""
    spec = write_spec(tmp_path, script.replace("STEPS", "600"), nodes=2, extra_cluster={"processesPerNode": 2})
    env = {**os.environ, SAMPLE_VAR: "1", WINDOW_VAR: "3", "PYTHONPATH": str(REPO), **env_vars}
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    info = info_of(launcher_home, run_id)
    store = WorkDir(str(Path(info["work_dir"]) / run_id))
    statuses = [store.get_record(status_key(node)) for node in info["nodes"]]
    return [read_series(store, node) for node in info["nodes"]], statuses, done.stdout


def all_ranks(series: list[dict]) -> dict[str, dict]:
    """Each rank's figures in the newest sample that has it counting steps."""
    found = {}
    for record in series:
        for sample in record["samples"]:
            for rank, figures in sample["ranks"].items():
                if figures.get("steps"):
                    found[rank] = figures
    return found


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_local_run_counts_every_ranks_optimizer_steps(tmp_path, launcher_home, start):
    """Warm interpreters (torch imported before the rank is known, launcher.node.torchrun.warm_interpreter) and
    fresh ones alike."""
    series, statuses, output = trained_samples(tmp_path, OPTIMIZER_ONLY, launcher_home,
                                               LAUNCHER_WARM_START="1" if start == "warm" else "0")
    assert output.count(f"{start} start") == 4, output
    ranks = all_ranks(series)
    assert sorted(ranks) == ["0", "1", "2", "3"]
    assert {figures["step_source"] for figures in ranks.values()} == {"optimizer"}
    for record in series:
        moving = [(rank, figures) for sample in record["samples"] for rank, figures in sample["ranks"].items()
                  if figures.get("steps_per_s", 0) > 0]
        assert len({rank for rank, _ in moving}) == 2, record["node"]  # both of its ranks
        assert any(figures.get("work_per_step_s", 0) > 0 for _, figures in moving)
        assert len(record["samples"]) <= MAX_SAMPLES and record["interval"] == 1.0
    for record, status in zip(series, statuses):  # the final status carries the last sample
        assert status["state"] == "succeeded" and status["health"] == record["latest"]


def test_a_local_run_carries_what_the_script_reports(tmp_path, launcher_home):
    series, _, _ = trained_samples(tmp_path, REPORTING, launcher_home)
    ranks = all_ranks(series)
    assert sorted(ranks) == ["0", "1", "2", "3"]
    for figures in ranks.values():
        assert figures["step_source"] == "report" and 0 < figures["steps"] <= 600
        metrics = figures["metrics"]
        assert metrics["loss"] == pytest.approx(1.0 / figures["steps"])
        assert len(metrics) == rankprogress.MAX_METRICS  # bounded, however many the script sends
        assert max(len(name) for name in metrics) <= rankprogress.MAX_METRIC_NAME
    assert max(len(json.dumps(sample)) for record in series for sample in record["samples"]) < 8000
