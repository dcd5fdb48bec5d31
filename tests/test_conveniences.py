"""Command-line overrides, entry points beyond a script, maxRuntime in the OCI bodies, and `clean`
(issue 9, items 5-8), through the real CLI with real torchrun."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import yaml

from clirun import info_of, run_id_from
from cluster import write_spec
from conftest import SEED_004, run_cli
from launcher.protocol.outputs import OutputsSync, tidy_temporary
from launcher.protocol.store import WorkDir

QUICK = """
import os, sys
print("hello from", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "args", sys.argv[1:],
      "A", os.environ.get("A"), flush=True)
"""


def test_overrides_change_the_spec_and_are_validated_like_it(tmp_path):
    spec = write_spec(tmp_path, QUICK, nodes=1, args=["--from-file"])
    done = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", "--nodes", "4", "--env", "A=1",
                   "--set", "spec.cluster.spec.rendezvousTimeout=30", "--", "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    dry = json.loads(done.stdout)
    assert len(dry["nodes"]) == 4
    for node in dry["nodes"]:
        env = node["env"]
        assert env["A"] == "1" and env["LAUNCHER_RDZV_TIMEOUT"] == "30"
        assert json.loads(env["LAUNCHER_ARGS"]) == ["--lr", "0.1"]
    assert dry["overrides"] == ["--set spec.cluster.spec.rendezvousTimeout=30", "--env A=1", "--nodes 4",
                                "-- --lr 0.1"]
    assert dry["effective_spec"]["spec"]["cluster"]["spec"]["worker"]["replicas"] == 3
    bad = run_cli("run", "-f", str(spec), "--dry-run", "--set", "spec.cluster.spec.port=99999",
                  "--set", "spec.cluster.spec.prot=1")
    assert bad.returncode == 2
    assert ("--set spec.cluster.spec.port=99999: spec.cluster.spec.port: must be an integer from 0 to 65535"
            in bad.stderr)
    assert "--set spec.cluster.spec.prot=1: spec.cluster.spec.prot: unknown key 'prot'; did you mean 'port'?" \
        in bad.stderr
    assert run_cli("run", "-f", str(spec), "--dry-run", "--set", "no-equals-sign").returncode == 2
    assert "only for launcher run" in run_cli("validate", "-f", str(spec), "--", "x").stderr


def test_secret_overrides_are_masked_everywhere_they_are_shown(tmp_path, launcher_home):
    spec = write_spec(tmp_path, QUICK, nodes=1)
    done = run_cli("run", "-f", str(spec), "--dry-run", "--env", "HF_TOKEN=hf_abcdef", "--", "--api-key", "k123")
    assert done.returncode == 0
    assert "hf_abcdef" not in done.stdout and "k123" not in done.stdout


def test_a_run_with_overrides_records_the_effective_spec(tmp_path, launcher_home):
    spec = write_spec(tmp_path, QUICK, nodes=1)
    done = run_cli("run", "-f", str(spec), "--nodes", "2", "--env", "A=7", "--", "--x", "y", cwd=tmp_path,
                   timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "hello from" in line)
    assert lines == ["hello from 0 of 2 args ['--x', 'y'] A 7", "hello from 1 of 2 args ['--x', 'y'] A 7"]
    info = info_of(launcher_home, run_id_from(done.stdout))
    assert info["overrides"] == ["--env A=7", "--nodes 2", "-- --x y"]
    assert info["effective_spec"]["spec"]["runtime"]["spec"]["args"] == ["--x", "y"]


def test_module_and_executable_entry_points(tmp_path, launcher_home):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import os\nprint('module on rank', os.environ['RANK'], flush=True)\n")
    spec = write_spec(tmp_path, QUICK, nodes=2)
    data = yaml.safe_load(spec.read_text())
    data["spec"]["runtime"]["spec"] = {"module": "pkg.train"}
    spec.write_text(yaml.safe_dump(data))
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("module on rank") == 2

    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho \"shell on rank $RANK with $1\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    data["spec"]["runtime"]["spec"] = {"entryPoint": "run.sh", "args": ["it's"]}
    spec.write_text(yaml.safe_dump(data))
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shell on rank 1 with it's" in done.stdout


def test_entry_point_checks(tmp_path, launcher_home):
    spec = write_spec(tmp_path, QUICK, nodes=2)
    data = yaml.safe_load(spec.read_text())
    data["spec"]["runtime"]["spec"]["entryPoint"] = "jbo.py"
    spec.write_text(yaml.safe_dump(data))
    checked = run_cli("validate", "-f", str(spec))
    assert checked.returncode == 0 and "'jbo.py' is not a file in the code directory" in checked.stderr
    assert "did you mean 'job.py'?" in checked.stderr
    refused = run_cli("run", "-f", str(spec), cwd=tmp_path)
    assert refused.returncode == 2 and "did you mean 'job.py'?" in refused.stderr
    assert "jbo.py" not in refused.stdout  # said once, as the error, not also as a note before it
    (tmp_path / "go.sh").write_text("#!/bin/sh\necho hi\n")
    data["spec"]["runtime"]["spec"]["entryPoint"] = "go.sh"
    spec.write_text(yaml.safe_dump(data))
    assert "not executable: chmod +x" in run_cli("validate", "-f", str(spec)).stderr
    data["spec"]["runtime"]["spec"]["module"] = "pkg.train"
    spec.write_text(yaml.safe_dump(data))
    both = run_cli("validate", "-f", str(spec))
    assert both.returncode == 2 and "use either entryPoint (a file) or module (python -m), not both" in both.stderr
    # Specs for the cloud whose code lives in the image still validate (a warning, not an error).
    assert run_cli("validate", "-f", str(SEED_004)).returncode == 0


def test_max_runtime_reaches_the_oci_job_bodies():
    dry = run_cli("run", "-f", str(SEED_004), "--dry-run", "--output", "json", "--set",
                  "spec.cluster.spec.maxRuntime=90m")
    job = json.loads(dry.stdout)["requests"][0]["body"]
    assert job["jobNodeConfigurationDetails"]["maximumRuntimeInMinutes"] == 90
    dry = run_cli("run", "-f", str(SEED_004), "--dry-run", "--output", "json", "--set",
                  "spec.cluster.spec.maxRuntime=90m", "--set", "spec.infrastructure.spec.launchMode=perNode")
    job = json.loads(dry.stdout)["requests"][0]["body"]
    assert job["jobConfigurationDetails"]["maximumRuntimeInMinutes"] == 90


def test_clean_removes_old_runs_and_keeps_running_ones(tmp_path, launcher_home):
    spec = write_spec(tmp_path, QUICK, nodes=1)
    finished = run_id_from(run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120).stdout)
    slow = write_spec(tmp_path, "import time\nprint('working', flush=True)\ntime.sleep(120)\n", nodes=1)
    running = run_id_from(run_cli("run", "-f", str(slow), "--detach", cwd=tmp_path).stdout)
    temporary = Path(tempfile.gettempdir()) / "launcher" / finished
    temporary.mkdir(parents=True, exist_ok=True)  # what a crashed node would have left
    try:
        preview = run_cli("clean", "--older-than", "0", "--work-dir", "--dry-run")
        assert preview.returncode == 0, preview.stderr
        assert f"would remove {launcher_home / 'runs' / finished}" in preview.stdout
        assert f"kept {running}: it is running" in preview.stdout or f"kept {running}: it is pending" in preview.stdout
        assert (launcher_home / "runs" / finished).is_dir() and temporary.is_dir()
        cleaned = run_cli("clean", "--older-than", "0", "--work-dir")
        assert cleaned.returncode == 0, cleaned.stdout
        assert not (launcher_home / "runs" / finished).exists() and not temporary.exists()
        assert not (tmp_path / "wd" / finished).exists()
        assert (launcher_home / "runs" / running).is_dir() and (tmp_path / "wd" / running).is_dir()
        assert finished not in run_cli("list").stdout
        assert run_cli("clean").stdout.startswith("removed 0 runs older than 7d")
    finally:
        run_cli("cancel", running, timeout=60)
    assert os.path.isdir(tmp_path)



WRITES_OUTPUT = """
import os, pathlib
pathlib.Path(os.environ["LAUNCHER_OUTPUTS_DIR"], "model.txt").write_text("weights")
"""


def test_clean_keeps_local_outputs_the_work_dir_never_got_unless_forced(tmp_path, launcher_home):
    spec = write_spec(tmp_path, WRITES_OUTPUT, nodes=1)
    run_id = run_id_from(run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120).stdout)
    (node,) = [path.name for path in (tmp_path / "wd" / run_id / "outputs").iterdir()]
    manifest = json.loads((tmp_path / "wd" / run_id / "outputs" / node / ".manifest.json").read_text())
    # What a node leaves when the store fails at its end: its temporary outputs, some synced, some never.
    leftovers = Path(tempfile.gettempdir()) / "launcher" / run_id / node / "outputs"
    leftovers.mkdir(parents=True)
    synced = leftovers / "model.txt"
    synced.write_text("weights")
    os.utime(synced, (manifest["model.txt"][1], manifest["model.txt"][1]))
    (leftovers / "final.pt").write_text("only here")
    stale = leftovers.parents[1] / "other-node" / "outputs" / "model.txt"  # an older copy restored there once
    stale.parent.mkdir(parents=True)
    stale.write_text("old weights")
    os.utime(stale, (manifest["model.txt"][1] - 100, manifest["model.txt"][1] - 100))
    kept = run_cli("clean", run_id)  # model.txt as synced, and an older copy of it, are not counted
    assert kept.returncode == 3, kept.stdout
    assert f"kept {run_id}: 1 output file in {leftovers.parents[1]} never reached its work dir ({node}/final.pt)" \
        in kept.stdout
    assert (leftovers / "final.pt").exists() and (launcher_home / "runs" / run_id).is_dir()
    forced = run_cli("clean", run_id, "--force")
    assert forced.returncode == 0, forced.stdout
    assert not leftovers.exists() and not (launcher_home / "runs" / run_id).exists()


def test_a_nodes_temporary_outputs_go_at_its_end_but_never_files_the_work_dir_did_not_get(tmp_path):
    directory = tmp_path / "launcher" / "r" / "n" / "outputs"
    (directory / "checkpoints").mkdir(parents=True)  # what a node that failed before writing anything leaves
    sync = OutputsSync(WorkDir(str(tmp_path / "wd" / "r")), "n", str(directory))
    assert tidy_temporary(sync) == [] and not (tmp_path / "launcher" / "r").exists()
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "model.pt").write_text("synced")
    assert sync.sync() == 1
    (directory / "checkpoints" / "late.pt").write_text("never synced")
    (directory / "logs").mkdir()
    assert tidy_temporary(sync) == ["checkpoints/late.pt"]
    assert (directory / "checkpoints" / "late.pt").exists() and not (directory / "logs").exists()
    assert sync.sync() == 1 and tidy_temporary(sync) == [] and not (tmp_path / "launcher" / "r").exists()
