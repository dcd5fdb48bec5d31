"""GPU nodes on CPU-only machines: a fake `nvidia-smi` on PATH stands in for 0, 1, 4 and 8 GPUs.

Covers counting (no torch import), CUDA_VISIBLE_DEVICES filtering, sharing one machine's GPUs
out among local nodes (in the plan, so the dry-run shows it), `processesPerNode: auto` decided
on each node, the early failure on too few GPUs, and what `status` shows.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clirun import run_id_from
from cluster import write_spec
from conftest import run_cli
from launcher.backends.docker.containers import added_node_spec, gpu_request
from launcher.gpus import Gpu, accelerator_report, describe, partition, visible_gpus
from launcher.runs.additions import added_node_gpus, request_nodes, write_added_record
from launcher.runs.supervision import ProcessRef

FAKE_SMI = """#!/bin/sh
# A stand-in for nvidia-smi: FAKE_GPU_COUNT GPUs, answering the queries launcher makes.
n=${FAKE_GPU_COUNT:-0}
case "$1" in
  --query-gpu=*)
    i=0
    while [ "$i" -lt "$n" ]; do
      echo "$i, GPU-fake-$i, NVIDIA H100 80GB HBM3, 81559, 580.65.06"
      i=$((i + 1))
    done ;;
  -L)
    i=0
    while [ "$i" -lt "$n" ]; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-fake-$i)"; i=$((i + 1)); done ;;
  *)
    echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0 |" ;;
esac
"""

REPORT = """
import os
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "local", os.environ["LOCAL_RANK"],
      "of", os.environ["LOCAL_WORLD_SIZE"], "devices", repr(os.environ.get("CUDA_VISIBLE_DEVICES")),
      "torch_nccl", os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"),
      "old_name_set", "NCCL_ASYNC_ERROR_HANDLING" in os.environ, flush=True)
"""


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """Put a fake nvidia-smi first on PATH (for this process and every process it starts)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def set_count(count: int) -> None:
        monkeypatch.setenv("FAKE_GPU_COUNT", str(count))

    return set_count


@pytest.mark.parametrize("count", [0, 1, 4, 8])
def test_counting_gpus_without_torch(fake_gpus, count):
    fake_gpus(count)
    gpus = visible_gpus()
    assert [gpu.index for gpu in gpus] == [str(i) for i in range(count)]
    assert all(gpu.name == "NVIDIA H100 80GB HBM3" and gpu.memory_mib == 81559 for gpu in gpus)


def test_cuda_visible_devices_is_applied_as_cuda_would(fake_gpus):
    fake_gpus(8)
    assert [g.index for g in visible_gpus({"CUDA_VISIBLE_DEVICES": "6,2"})] == ["6", "2"]
    assert [g.index for g in visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-fake-3"})] == ["3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert [g.index for g in visible_gpus({"CUDA_VISIBLE_DEVICES": "1,9,2"})] == ["1"]  # stops at 9


def test_no_nvidia_smi_and_no_driver_means_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("launcher.gpus.PROC_GPUS", tmp_path / "no-driver")
    assert visible_gpus({}) == []


@pytest.mark.parametrize("nodes, processes, gpus, shares, note", [
    (2, None, 8, ["0,1,2,3", "4,5,6,7"], "8 GPUs here: 4 per node"),
    (2, 4, 8, ["0,1,2,3", "4,5,6,7"], "8 GPUs here: 4 per node"),
    (2, 1, 8, ["0", "1"], "8 GPUs here: 1 per node"),
    (3, None, 8, ["0,1", "2,3", "4,5"], "8 GPUs here: 2 per node"),
    (1, None, 1, ["0"], "1 GPU here: 1 per node"),
    (2, None, 1, ["", ""], "2 processes but 1 GPU: running on CPU"),
    (2, 1, 1, ["", ""], "2 processes but 1 GPU: running on CPU"),
    (2, 4, 4, ["", ""], "8 processes but 4 GPUs: running on CPU"),
    (2, None, 0, None, None),
])
def test_partition(nodes, processes, gpus, shares, note):
    assert partition(nodes, processes, [str(i) for i in range(gpus)]) == (shares, note)


@pytest.mark.parametrize("count, devices, note", [
    (0, [None, None], None),
    (1, ["", ""], "2 processes but 1 GPU: running on CPU"),
    (4, ["0,1", "2,3"], "4 GPUs here: 2 per node"),
    (8, ["0,1,2,3", "4,5,6,7"], "8 GPUs here: 4 per node"),
])
def test_the_dry_run_shows_each_local_nodes_gpus(tmp_path, fake_gpus, count, devices, note):
    fake_gpus(count)
    spec = write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": "auto"})
    done = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json")
    assert done.returncode == 0, done.stderr
    dry = json.loads(done.stdout)
    assert [node["env"].get("CUDA_VISIBLE_DEVICES") for node in dry["nodes"]] == devices
    device_notes = [n for n in dry["notes"] if "here:" in n or "running on CPU" in n]
    assert device_notes == ([note] if note else [])
    assert any("decided on each node" in n for n in dry["notes"])
    text = run_cli("run", "-f", str(spec), "--dry-run").stdout
    assert not note or note in text


@pytest.mark.parametrize("count, devices", [(0, [None, None]), (1, [None, None]), (4, [["0", "1"], ["2", "3"]])])
def test_docker_nodes_get_the_same_share_as_device_requests(tmp_path, fake_gpus, launcher_home, count, devices):
    """Containers get host GPUs by device request (renumbered from 0 inside), never by a host index in env."""
    fake_gpus(count)
    spec = write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": "auto",
                                                                "image": "launcher-test/gpu-node:1"})
    done = run_cli("run", "-f", str(spec), "--backend", "docker", "--dry-run", "--output", "json")
    assert done.returncode == 0, done.stderr
    dry = json.loads(done.stdout)
    requests = [request["body"].get("device_requests") for request in dry["requests"]
                if request["operation"] == "containers.create"]
    assert requests == [None if ids is None else [{"Driver": "nvidia", "DeviceIDs": ids, "Capabilities": [["gpu"]]}]
                        for ids in devices]
    assert all("CUDA_VISIBLE_DEVICES" not in node["env"] for node in dry["nodes"])
    compose = tmp_path / "compose.yaml"
    assert run_cli("compose", "-f", str(spec), "-o", str(compose)).returncode == 0
    services = yaml.safe_load(compose.read_text())["services"].values()
    assert [s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices") for s in services] == \
        [None if ids is None else [{"driver": "nvidia", "device_ids": ids, "capabilities": ["gpu"]}]
         for ids in devices]


def test_a_node_added_to_a_running_run_gets_gpus_of_its_own_or_none_saying_so(tmp_path, fake_gpus, capsys):
    fake_gpus(3)
    running = {"t-main": "0", "t-worker-0": "1"}
    assert added_node_gpus("t-worker-1", "1", running) == ("2", None)  # never the GPUs of the node it copies
    assert added_node_gpus("t-worker-1", "1", {**running, "t-worker-2": "2"}) == \
        ("", "node t-worker-1 gets no GPU: it would need 1 GPU, and the run's nodes hold the 3 GPUs here (t-main: 0; "
             "t-worker-0: 1; t-worker-2: 2); its training processes run on CPU")
    gpus, note = added_node_gpus("t-worker-1", "0,1", {"t-main": "0,1"})  # two wanted, one free: none
    assert gpus == "" and "it would need 2 GPUs" in note
    assert added_node_gpus("t-worker-1", None, running) == (None, None)  # the spec pins the devices: left alone
    assert added_node_gpus("t-worker-1", "", running) == ("", None)  # the run runs on CPU: so does the new node
    template = {"name": "r-t-worker-0", "environment": {"LAUNCHER_NODE_GROUPS": '[["t-main", 1], ["t-worker", 1]]'},
                "labels": {}, "device_requests": [gpu_request("1")]}
    assert added_node_spec(template, "r", "t-worker-1", "2")["device_requests"] == [gpu_request("2")]
    assert "device_requests" not in added_node_spec(template, "r", "t-worker-1", "")
    assert added_node_spec(template, "r", "t-worker-1")["device_requests"] == [gpu_request("1")]

    # `launcher scale` shows what the supervisor noted for a node it added
    write_added_record(tmp_path, "t-worker-1", "", "node t-worker-1 gets no GPU: ...")
    supervisor = subprocess.Popen([sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGUSR1, "
                                   "signal.SIG_IGN); print(flush=True); sys.stdin.read()"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        supervisor.stdout.readline()  # it ignores SIGUSR1 from here on
        assert request_nodes(tmp_path, ProcessRef.of(supervisor.pid), ["t-worker-1"], lambda: ["t-worker-1"], 1.0) \
            == ["t-worker-1"]
    finally:
        supervisor.kill()
        supervisor.wait()
    assert "note: node t-worker-1 gets no GPU: ...\n" in capsys.readouterr().err


def test_a_spec_that_pins_devices_is_left_alone(tmp_path, fake_gpus):
    fake_gpus(8)
    spec = write_spec(tmp_path, REPORT, nodes=2, env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "7"}])
    dry = json.loads(run_cli("run", "-f", str(spec), "--dry-run", "--output", "json").stdout)
    assert [node["env"]["CUDA_VISIBLE_DEVICES"] for node in dry["nodes"]] == ["7", "7"]
    assert not any("here:" in note or "running on CPU" in note for note in dry["notes"])


def test_auto_runs_one_process_per_gpu_each_node_sees(tmp_path, launcher_home, fake_gpus):
    fake_gpus(4)
    spec = write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": "auto"},
                      env=[{"name": "NCCL_ASYNC_ERROR_HANDLING", "value": "1"}])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "] rank " in line)
    assert lines == [f"rank {r} of 4 local {r % 2} of 2 devices '{'0,1' if r < 2 else '2,3'}' torch_nccl 1 "
                     "old_name_set False" for r in range(4)]
    run_id = run_id_from(done.stdout)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    main = status["nodes"]["t-main"]
    assert main["processes"] == 2 and main["rank"] == 0  # the main group's node is rank 0
    report = main["accelerators"]
    assert report["count"] == 2 and report["driver"] == "580.65.06" and report["cuda"] == "13.0"
    assert report["torch"]
    table = run_cli("status", run_id).stdout
    assert "t-main: 2 x NVIDIA H100 80GB HBM3 (81559 MiB), driver 580.65.06, CUDA 13.0" in table
    assert "WORLD_SIZE:   4 (2 processes per node)" in run_cli("show-config", run_id).stdout


def test_too_few_gpus_fail_at_once_before_torchrun(tmp_path, launcher_home, fake_gpus):
    fake_gpus(1)
    spec = write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": 2},
                      env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "processesPerNode is 2 but this node sees 1 GPU" in done.stdout
    assert "starting:" not in done.stdout  # torchrun never started
    status = json.loads(run_cli("status", run_id_from(done.stdout), "--json").stdout)
    assert {node["exit_code"] for node in status["nodes"].values()} <= {1, 2}
    assert "processesPerNode is 2" in status["first_failure"]["reason"]


def test_the_cpu_fallback_note_reaches_the_user_of_run(tmp_path, launcher_home, fake_gpus):
    fake_gpus(1)
    spec = write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": "auto"})
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "note: 2 processes but 1 GPU: running on CPU" in done.stdout
    assert sorted(line.split("] ", 1)[1].split(" devices")[0] for line in done.stdout.splitlines()
                  if "] rank " in line) == ["rank 0 of 2 local 0 of 1", "rank 1 of 2 local 0 of 1"]


def test_describe_reports():
    gpu = Gpu("0", "GPU-x", "NVIDIA A10", 24564, "550.1")
    report = {**accelerator_report([]), "gpus": [vars(gpu)], "count": 1, "driver": "550.1", "cuda": "12.4"}
    assert describe(report) == "1 x NVIDIA A10 (24564 MiB), driver 550.1, CUDA 12.4"
    assert describe(accelerator_report([])) == "CPU only"


def test_the_scaffold_uses_auto_and_the_current_nccl_variable(tmp_path):
    assert run_cli("init", "--framework", "pytorch", "--dir", str(tmp_path)).returncode == 0
    text = (tmp_path / "train.yaml").read_text()
    assert "processesPerNode: auto" in text and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in text
    assert "- name: NCCL_ASYNC_ERROR_HANDLING" not in text
    script = (tmp_path / "train.py").read_text()
    assert "device=device" in script and "map_location=device" in script
    assert Path(tmp_path / "train.py").is_file()
