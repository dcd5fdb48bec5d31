"""Loading specs: the documented ADS specs validate unchanged; every class of bad input gets FILE:LINE:COL."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from conftest import SEED_004, SPECS, run_cli
from launcher.errors import BadInput, SpecError
from launcher.spec import load_spec, yamlsafe
from launcher.spec.conforms import Unsure, conforms
from launcher.spec.schema import load_schema

VALID = """\
kind: distributed
apiVersion: v1.0
spec:
  infrastructure:
    kind: infrastructure
    type: local
  cluster:
    kind: pytorch
    spec:
      workDir: ./wd
      main:
        replicas: 1
      worker:
        replicas: 2
  runtime:
    kind: python
    spec:
      entryPoint: train.py
"""


def write(tmp_path, text: str, name: str = "train.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return caught.value.problems


def test_schema_is_valid_draft_2020_12():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(load_schema())


def test_seed_004_spec_validates_unchanged():
    spec = load_spec(SEED_004)
    assert spec.name == "PyTorch-Distributed"
    assert spec.infra_type == "dataScienceJob"
    assert spec.cluster.node_count == 3
    assert spec.runtime.args[-2:] == ("--timeout", "5")  # the integer 5 becomes the argument "5"
    assert spec.cluster.env[0].name == "NCCL_ASYNC_ERROR_HANDLING"


def test_ads_documentation_pytorch_example_validates_unchanged():
    spec = load_spec(SPECS / "ads_docs_pytorch.yaml")
    assert spec.cluster.node_count == 4
    assert spec.infra.display_name == "PyTorch-Distributed"


@pytest.mark.parametrize("kind", ["pytorch", "PYTORCH", "PyTorch"])
def test_cluster_kind_is_case_insensitive(tmp_path, kind):
    assert load_spec(write(tmp_path, VALID.replace("kind: pytorch", f"kind: {kind}"))).cluster.node_count == 3


@pytest.mark.parametrize("framework", ["dask", "DASK", "horovod", "tensorflow", "ray"])
def test_other_frameworks_get_not_supported(tmp_path, framework):
    problems = problems_of(write(tmp_path, VALID.replace("kind: pytorch", f"kind: {framework}")))
    assert problems == [f"{tmp_path / 'train.yaml'}:8:11: spec.cluster.kind: framework '{framework}' "
                        "is not supported yet; supported: pytorch"]


def test_wrong_type_reports_file_line_column_path_and_rule(tmp_path):
    path = write(tmp_path, VALID.replace("replicas: 2", "replicas: -1"))
    assert problems_of(path) == [
        f"{path}:14:19: spec.cluster.spec.worker.replicas: must be an integer from 0 to 1023 (got -1)"]


@pytest.mark.parametrize("written, got", [('"2"', "string '2'"), ("2", "2"), ("1.5", "number 1.5")])
def test_the_mains_replicas_get_one_message_its_own_rule(tmp_path, written, got):
    path = write(tmp_path, VALID.replace("replicas: 1", f"replicas: {written}"))
    assert problems_of(path) == [
        f"{path}:12:19: spec.cluster.spec.main.replicas: must be an integer equal to 1 (got {got})"]


def test_unknown_key_gets_did_you_mean_at_the_key(tmp_path):
    path = write(tmp_path, VALID.replace("        replicas: 2", "        replica: 2"))
    assert problems_of(path) == [
        f"{path}:14:9: spec.cluster.spec.worker.replica: unknown key 'replica'; did you mean 'replicas'?"]


def test_every_problem_is_reported_in_one_pass_in_file_order(tmp_path):
    text = (VALID.replace("type: local", "type: locl")
            .replace("        replicas: 2", "        replicas: two")
            .replace("entryPoint: train.py", "entrypoint: train.py"))
    problems = problems_of(write(tmp_path, text))
    assert len(problems) == 4, problems
    assert "spec.infrastructure.type: must be one of 'dataScienceJob', 'local', 'docker', 'slurm', 'kubernetes' (got 'locl'); " \
           "did you mean 'local'?" in problems[0]
    assert "spec.cluster.spec.worker.replicas: must be an integer from 0 to 1023 (got string 'two')" in problems[1]
    assert "spec.runtime.spec: missing required key 'entryPoint'" in problems[2]
    assert "unknown key 'entrypoint'; did you mean 'entryPoint'?" in problems[3]
    lines = [int(p.split(":")[1]) for p in problems]
    assert lines == sorted(lines)


def test_duplicate_keys_are_rejected(tmp_path):
    path = write(tmp_path, VALID.replace("      entryPoint: train.py", "      entryPoint: a.py\n      entryPoint: b.py"))
    assert problems_of(path) == [
        f"{path}:19:7: spec.runtime.spec.entryPoint: duplicate key 'entryPoint' (first defined on line 18)"]


def test_tabs_are_explained(tmp_path):
    path = write(tmp_path, VALID.replace("      entryPoint", "\tentryPoint"))
    [problem] = problems_of(path)
    assert problem.startswith(f"{path}:18:1: ")
    assert "tab character: YAML indentation must use spaces, not tabs" in problem


def test_reserved_environment_names_are_rejected(tmp_path):
    text = VALID.replace("      entryPoint: train.py",
                         "      entryPoint: train.py\n      env:\n        - name: WORLD_SIZE\n          value: 8")
    [problem] = problems_of(write(tmp_path, text))
    assert "spec.runtime.spec.env[0].name: is set by launcher on every node" in problem


@pytest.mark.parametrize("value, problem", [
    ("2.5", None), ("0", None), ("'later'", "env[0].value: LAUNCHER_SPARE_AFTER must be a number of seconds, 0 or more"),
    ("-1", "env[0].value: LAUNCHER_SPARE_AFTER must be a number of seconds, 0 or more")])
def test_the_two_launcher_names_a_spec_may_set_are_checked_where_they_have_a_form(tmp_path, value, problem):
    text = VALID.replace("      entryPoint: train.py", "      entryPoint: train.py\n      env:\n        - name: "
                         f"LAUNCHER_WARM_START\n          value: '0'\n        - name: LAUNCHER_SPARE_AFTER\n          value: {value}")
    if problem is None:
        assert [item.name for item in load_spec(write(tmp_path, text)).runtime.env] == [
            "LAUNCHER_WARM_START", "LAUNCHER_SPARE_AFTER"]
        return
    [found] = problems_of(write(tmp_path, text))
    assert problem.replace("[0]", "[1]") in found, found


@pytest.mark.parametrize("value, problem", [
    ("' Off '", None), ("TRUE", None), ("0", None), ("false", None), ("'maybe'", True), ("fasle", True), ("2", True),
    ("''", True)])
def test_the_warm_start_switch_takes_only_the_words_it_reads(tmp_path, value, problem):
    """Anything else would leave warm starts on without a word (a typo of "false" among them)."""
    text = VALID.replace("      entryPoint: train.py", "      entryPoint: train.py\n      env:\n        - name: "
                         f"LAUNCHER_WARM_START\n          value: {value}")
    if problem is None:
        assert [item.name for item in load_spec(write(tmp_path, text)).runtime.env] == ["LAUNCHER_WARM_START"]
        return
    [found] = problems_of(write(tmp_path, text))
    assert "env[0].value: LAUNCHER_WARM_START must be on (1, true, yes, on) or off (0, false, no, off)" in found, found

def test_elastic_bounds_must_contain_the_started_nodes(tmp_path):
    text = VALID.replace("      workDir: ./wd", "      workDir: ./wd\n      elastic:\n        minNodes: 4\n"
                         "        maxNodes: 6")
    [problem] = problems_of(write(tmp_path, text))
    assert "spec.cluster.spec.elastic: the cluster starts 3 nodes" in problem


def test_alias_bomb_is_refused_in_bounded_work_and_memory(tmp_path, monkeypatch):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        levels.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = write(tmp_path, "\n".join(levels) + "\nkind: *a9\n")  # 10**10 values if expanded
    built = []
    build = yamlsafe._Builder.build
    monkeypatch.setattr(yamlsafe._Builder, "build", lambda self, *args: built.append(1) or build(self, *args))
    tracemalloc.start()
    [problem] = problems_of(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert "refusing to expand what looks like an alias bomb" in problem
    # the budget, plus the siblings already in the lists being built when it ran out (10 per level)
    assert len(built) <= yamlsafe.MAX_VALUES + 10 * 10, len(built)
    assert peak < 50 * 2**20, peak


def test_huge_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "w") as handle:
        handle.write(VALID)
        handle.write("#" * (50 * 2**20))
    with pytest.raises(BadInput, match=r"huge.yaml: file is 50.0 MiB; spec files are limited to 1024 KiB"):
        load_spec(path)


def test_not_utf8_and_empty_and_non_mapping(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"kind: distributed\nspec: caf\xe9\n")
    with pytest.raises(BadInput, match=r"latin1.yaml:2: not UTF-8 text \(byte 0xe9 at offset 27\)"):
        load_spec(latin1)
    assert problems_of(write(tmp_path, "", "empty.yaml")) == [f"{tmp_path / 'empty.yaml'}:1:1: the file is empty"]
    assert "the top level must be a mapping" in problems_of(write(tmp_path, "- a\n- b\n", "list.yaml"))[0]


def test_cli_validate_exit_statuses_and_no_traceback(tmp_path):
    good = run_cli("validate", "-f", str(write(tmp_path, VALID)))
    assert good.returncode == 0 and "valid (3 nodes" in good.stdout
    bad = run_cli("validate", "-f", str(write(tmp_path, VALID.replace("replicas: 2", "replicas: x"), "bad.yaml")))
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"{tmp_path / 'bad.yaml'}:14:19: spec.cluster.spec.worker.replicas: "
                                 "must be an integer from 0 to 1023")
    assert "Traceback" not in bad.stderr
    missing = run_cli("validate", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr


def test_defaults_are_applied(tmp_path):
    spec = load_spec(write(tmp_path, VALID))
    cluster = spec.cluster
    assert (spec.name, cluster.main.name, cluster.worker.name) == ("distributed", "distributed-main",
                                                                   "distributed-worker")
    assert (cluster.processes_per_node, cluster.rendezvous_timeout, cluster.port) == (1, 600, 0)
    assert json.dumps(spec.runtime.args) == "[]"


def test_docker_volumes_shm_size_and_network_are_checked(tmp_path):
    docker = VALID.replace("    type: local\n", "    type: docker\n    spec:\n      volumes: ['bad', './data:/data:ro', "
                           "'cache:/root/.cache', 'x:relative']\n      shmSize: banana\n      network: hots\n")
    path = write(tmp_path, docker)
    assert problems_of(path) == [
        f"{path}:8:17: spec.infrastructure.spec.volumes[0]: must be SOURCE:TARGET or SOURCE:TARGET:ro (TARGET an "
        "absolute path in the container; SOURCE a host path or a volume name) (got 'bad')",
        f"{path}:8:65: spec.infrastructure.spec.volumes[3]: must be SOURCE:TARGET or SOURCE:TARGET:ro (TARGET an "
        "absolute path in the container; SOURCE a host path or a volume name) (got 'x:relative')",
        f"{path}:9:16: spec.infrastructure.spec.shmSize: must be a size such as 2g, 512m or 1073741824 (bytes) "
        "(got 'banana')",
        f"{path}:10:16: spec.infrastructure.spec.network: must be one of 'bridge', 'host' (got 'hots'); "
        "did you mean 'host'?"]
    good = write(tmp_path, docker.replace("'bad', ", "").replace(", 'x:relative'", "").replace("banana", "2g")
                 .replace("hots", "host"), "good.yaml")
    assert load_spec(good).infra.volumes == ("./data:/data:ro", "cache:/root/.cache")


def test_validate_reports_schema_and_cross_field_problems_in_one_pass(tmp_path):
    text = (VALID.replace("    type: local\n", "    type: dataScienceJob\n    spec:\n      projectId: p\n"
                          "      compartmentId: c\n      shapeName: VM.Standard.E4.Flex\n      logId: ''\n")
            .replace("      main:\n", "      maxRuntime: 40d\n      hangTimeout: 5x\n      main:\n        name: w-0\n")
            .replace("        replicas: 2", "        name: w\n        replicas: 2\n        replica: 3")
            .replace("entryPoint: train.py", "entryPoint: train.py\n      module: pkg.train"))
    path = write(tmp_path, text)
    done = run_cli("validate", "-f", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:10:18: spec.infrastructure.spec.shapeName: VM.Standard.E4.Flex is a flexible shape: set "
        "shapeConfigDetails (ocpus and memoryInGBs) for it",
        f"{path}:11:14: spec.infrastructure.spec.logId: must be a non-empty string (got '')",
        f"{path}:16:19: spec.cluster.spec.maxRuntime: must be at most 30 days (got '40d')",
        f"{path}:17:20: spec.cluster.spec.hangTimeout: must be a duration: seconds (3600) or a number with s, m, h "
        "or d (90m, 2h), at most 30 days (got '5x')",
        f"{path}:22:15: spec.cluster.spec.worker.name: main group 'w-0' and worker group 'w' give more than one "
        "node the name 'w-0'; choose other group names",
        f"{path}:24:9: spec.cluster.spec.worker.replica: unknown key 'replica'; did you mean 'replicas'?",
        f"{path}:29:15: spec.runtime.spec.module: use either entryPoint (a file) or module (python -m), not both"]


@pytest.mark.parametrize("change, problem", [
    (("{minNodes: 3, maxNodes: 3}", "{minNodes: 2}"), "spec.cluster.spec.elastic: missing required key 'maxNodes'"),
    (("replicas: 2", "replicas: two"), "spec.cluster.spec.worker.replicas: must be an integer"),
    (("worker:\n        replicas: 2", "worker: [2]"), "spec.cluster.spec.worker: must be a mapping"),
])
def test_a_cross_field_rule_skips_values_the_schema_refused(tmp_path, change, problem):
    elastic = VALID.replace("      workDir: ./wd\n", "      workDir: ./wd\n      elastic: {minNodes: 3, maxNodes: 3}\n")
    [reported] = problems_of(write(tmp_path, elastic.replace(*change)))
    assert problem in reported


def test_the_quick_schema_check_compares_as_jsonschema_and_is_unsure_of_keywords_it_does_not_evaluate():
    assert conforms({"a": 1}, {"type": "object", "properties": {"a": {"type": "integer"}}}) is True
    assert [conforms(value, {"enum": [1, [0]]}) for value in (1.0, True, [0.0], [False])] == [True, False, True, False]
    for schema in ({"uniqueItems": True}, {"additionalProperties": False, "patternProperties": {"^a": {}}}):
        with pytest.raises(Unsure):
            conforms({"a": 1}, schema)
