"""Threads per training process: each gets its share of the cores its machine lets it use, set before its warm
interpreter imports torch, unless the user chose. Real local runs with real torchrun; the rule and the cgroup
reading on their own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cluster import write_spec
from conftest import run_cli
from launcher.backends.local import LocalBackend
from launcher.backends.slurm import SlurmBackend
from launcher.node.settings import SettingsError, from_env
from launcher.node.threads import MACHINE_NODES_VAR, cgroup_quota, share_threads, usable_cores
from launcher.spec import load_spec
from test_warm_start import PROBE, facts_of

SETTINGS = {"LAUNCHER_RUN_ID": "r", "LAUNCHER_WORK_DIR": "/tmp/wd", "LAUNCHER_ENTRYPOINT": "job.py",
            "LAUNCHER_NODE_NAME": "t-main", "LAUNCHER_NODE_GROUPS": json.dumps([["t-main", 1], ["t-worker", 1]])}


@pytest.mark.parametrize("user_chose", [False, True])
def test_nodes_sharing_a_machine_each_run_their_share_of_its_cores_warm_unless_the_user_chose(tmp_path, user_chose):
    cores = usable_cores()  # the nodes run here, with this process's affinity and cgroup
    share = max(1, cores // 2)
    # not the share, and no more than the cores (torch takes no more threads than those)
    user_threads = ("1" if share > 1 else "2") if user_chose else None
    env = [{"name": "OMP_NUM_THREADS", "value": user_threads}] if user_threads else []
    spec = write_spec(tmp_path, PROBE, nodes=2, env=env, extra_cluster={"processesPerNode": 1})
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=300,
                   env={**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = (tmp_path / "wd").iterdir()
    facts = facts_of(run)
    assert sorted(facts) == [0, 1] and all(said["warm"] for said in facts.values()), facts
    expected = int(user_threads) if user_threads else share
    assert all(said["threads"] == int(said["omp"]) == expected for said in facts.values()), facts
    start_line = (f"OMP_NUM_THREADS={user_threads} as set" if user_threads else
                  f"{expected} thread{'s' if expected > 1 else ''} per process ({cores} core{'s' if cores > 1 else ''}"
                  " / 2 processes); set OMP_NUM_THREADS to choose")
    assert done.stdout.count(start_line) == 2, done.stdout


@pytest.mark.parametrize("given, processes, machine_nodes, cores, threads, words", [
    ({}, 1, 2, 8, "4", "4 threads per process (8 cores / 2 processes); set OMP_NUM_THREADS to choose"),
    ({}, 2, 1, 8, "4", "4 threads per process (8 cores / 2 processes); set OMP_NUM_THREADS to choose"),
    ({}, 2, 3, 2, "1", "1 thread per process (2 cores / 6 processes); set OMP_NUM_THREADS to choose"),
    ({}, 1, 1, 1, "1", "1 thread per process (1 core / 1 process); set OMP_NUM_THREADS to choose"),
    ({"OMP_NUM_THREADS": "6"}, 2, 2, 8, "6", "OMP_NUM_THREADS=6 as set"),
    ({"OMP_NUM_THREADS": ""}, 1, 2, 8, "4", "4 threads per process (8 cores / 2 processes); set OMP_NUM_THREADS "
                                            "to choose"),
])
def test_the_share_is_the_cores_over_the_processes_on_the_machine(given, processes, machine_nodes, cores, threads,
                                                                  words):
    env = dict(given)
    assert share_threads(env, processes, machine_nodes, cores) == words
    assert env["OMP_NUM_THREADS"] == threads


def cgroups(tmp_path: Path, own: str, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for directory, limit in limits.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "cpu.max").write_text(limit + "\n")
    (tmp_path / "self").write_text(own)
    return tmp_path / "self", root


@pytest.mark.parametrize("own, limits, cores", [
    ("0::/a/b\n", {"": "max 100000", "a": "150000 100000", "a/b": "max 100000"}, 1.5),  # a parent's quota holds
    ("0::/a/b\n", {"a": "400000 100000", "a/b": "200000 100000"}, 2.0),  # the smallest of them
    ("0::/\n", {"": "300000 100000"}, 3.0),  # a container's own namespace: its cgroup is the root
    ("0::/a\n", {"a": "max 100000"}, None),  # no quota
    ("0::/a\n", {"a": "garbled"}, None),
    ("12:cpu,cpuacct:/a\n", {"a": "200000 100000"}, None),  # cgroup v1: not read
])
def test_the_cgroup_quota_is_the_smallest_on_the_way_to_the_root(tmp_path, own, limits, cores):
    assert cgroup_quota(*cgroups(tmp_path, own, limits)) == cores


def test_without_a_cgroup_file_there_is_no_quota(tmp_path):
    assert cgroup_quota(tmp_path / "absent", tmp_path) is None


def test_the_backends_that_put_every_node_on_one_machine_say_how_many(tmp_path):
    spec = load_spec(write_spec(tmp_path, "pass", nodes=3))
    plan, _ = LocalBackend().plan(spec)
    assert {node.env[MACHINE_NODES_VAR] for node in plan.nodes} == {"3"}
    slurm, _ = SlurmBackend().plan(spec)  # one node per machine: the node's own cores are its machine's
    assert not any(MACHINE_NODES_VAR in node.env for node in slurm.nodes)


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_malformed_machine_node_count_is_a_settings_error_naming_it(value):
    with pytest.raises(SettingsError, match=f"{MACHINE_NODES_VAR} must be >= 1, not '{value}'"):
        from_env({**SETTINGS, MACHINE_NODES_VAR: value})
    assert from_env({**SETTINGS, MACHINE_NODES_VAR: "2"}).machine_nodes == 2
