"""The spec loader under fuzzing, and the bounds of issue 7 (items 4, 6, 7).

A hypothesis fuzzer mutates valid specs (types, missing and extra keys, unicode, huge and
non-finite numbers, deep nesting, aliases, binary junk, empty files) and asserts that every
case either loads or fails with located problems: never a traceback, always within a time bound.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SEED_004, SPECS, run_cli
from launcher.backends.local import capacity_problem
from launcher.errors import BadInput, SpecError
from launcher.runs import state
from launcher.spec import load_spec
from launcher.spec.conforms import conforms
from launcher.spec.schema import jsonschema_validator, load_schema

VALID = [yaml.safe_load(SEED_004.read_text()), yaml.safe_load((SPECS / "ads_docs_pytorch.yaml").read_text())]
CASES = 3000  # per mutation family; each case is a real load from a file
PER_CASE_SECONDS = 2.0  # of this process's CPU: a load that runs away (a huge number, a deep nesting), not a busy machine

junk_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**18, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.just(1.0), st.just(29500.0), st.just(1e308),
    st.text(max_size=40), st.text(alphabet="\t\n\r\x00\u200b\U0001F600\"':{}[]&*!|>%@`#", max_size=20),
    st.lists(st.integers(), max_size=5), st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=2), max_leaves=200),
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, prefix + (index,))


def _mutate(data, path, how, junk, new_key):
    mutated = copy.deepcopy(data)
    if not path:
        return junk if how == "replace" else mutated
    parent = mutated
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if how == "replace":
        parent[last] = junk
    elif how == "delete":
        del parent[last]
    elif how == "add" and isinstance(parent, dict):
        parent[new_key] = junk
    return mutated


def _check_one(tmp: Path, text: str | bytes) -> None:
    file = tmp / "fuzz.yaml"
    file.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    started = time.process_time()
    try:
        load_spec(file)
    except SpecError as exc:
        for problem in exc.problems:
            assert problem.startswith(f"{file}:"), problem
            line, column = problem[len(str(file)) + 1:].split(":", 2)[:2]
            assert line.isdigit() and column.isdigit(), problem
    except BadInput as exc:
        assert str(file) in str(exc)
    assert time.process_time() - started < PER_CASE_SECONDS


@settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_specs_load_or_fail_with_located_problems(tmp_path_factory, data):
    base = data.draw(st.sampled_from(VALID))
    paths = list(_paths(base))
    path = data.draw(st.sampled_from(paths))
    how = data.draw(st.sampled_from(["replace", "delete", "add"]))
    mutated = _mutate(base, path, how, data.draw(junk_values), data.draw(st.text(min_size=1, max_size=12)))
    try:
        text = yaml.safe_dump(mutated, allow_unicode=True)
    except (yaml.YAMLError, ValueError, RecursionError):
        return
    _check_one(tmp_path_factory.mktemp("fuzz"), text)


# Values that keep a spec valid, or break it in ways only some keywords see (reserved env names, patterns, bounds).
near_miss_values = st.sampled_from([
    "RANK", "LAUNCHER_X", "OK_NAME", "1BAD", "auto", "Auto", "90m", "2x", "s3://b/p", "http://x", "pytorch",
    "PyTorch", "native", "perNode", "./wd", "", 0, 1, 2, 50, 49, 128, 129, 1023, 1024, True, False, None, 1.5,
    ["--x", 1, True], {"env": [{"name": "A", "value": 1}]}, {"replicas": 1}, {"minNodes": 1, "maxNodes": 2}])


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_quick_schema_check_agrees_with_jsonschema(data):
    """Valid specs skip jsonschema (launcher.spec.conforms): its yes must be jsonschema's, and so must its no."""
    base = data.draw(st.sampled_from(VALID))
    mutated = base
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(mutated))))
        how = data.draw(st.sampled_from(["replace", "delete", "add"]))
        value = data.draw(st.one_of(near_miss_values, junk_values))
        mutated = _mutate(mutated, path, how, value, data.draw(st.sampled_from(["name", "spec", "replicas", "x"])))
    assert conforms(mutated, load_schema()) == (not any(jsonschema_validator().iter_errors(mutated)))


_ENV_NAME = ("spec", "cluster", "spec", "config", "env", 0, "name")
_CLUSTER = ("spec", "cluster", "spec")


@pytest.mark.parametrize("path, value", [
    (_ENV_NAME, "RANK"), (_ENV_NAME, "LAUNCHER_X"), (_ENV_NAME, "RANKS"), (_ENV_NAME, "9X"),  # not, anyOf, pattern
    (_CLUSTER + ("processesPerNode",), "auto"), (_CLUSTER + ("processesPerNode",), 1.0),  # anyOf with const
    (_CLUSTER + ("processesPerNode",), True), (_CLUSTER + ("maxRuntime",), "90m"),
    (_CLUSTER + ("worker", "replicas"), 1024), (_CLUSTER + ("main", "replicas"), 2),  # allOf beside properties
    (("spec", "infrastructure", "spec"), None), (("spec", "infrastructure", "type"), "local"),  # if/then
    (("spec", "infrastructure", "spec", "shapeConfigDetails"), {"ocpus": 0}),  # exclusiveMinimum
    (("spec", "runtime", "spec", "kwargs"), {"lr": [1]}), (("spec", "runtime", "spec", "kwargs"), "--lr 1"),
    (("spec", "runtime", "spec", "module"), "pkg.train"), (("kind",), "Distributed"), (_CLUSTER + ("workDir",), ""),
    (_CLUSTER + ("recovery",), {"retryOn": []}), (_CLUSTER + ("recovery",), {"retryOn": [3]}),  # minItems
])
def test_the_quick_schema_check_agrees_with_jsonschema_at_each_keywords_edge(path, value):
    mutated = _mutate(VALID[0], path, "replace", value, "")
    assert conforms(mutated, load_schema()) == (not any(jsonschema_validator().iter_errors(mutated)))


@settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_damaged_spec_text_loads_or_fails_with_located_problems(tmp_path_factory, data):
    text = data.draw(st.sampled_from([SEED_004.read_text(), (SPECS / "ads_docs_pytorch.yaml").read_text()]))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        insert = data.draw(st.one_of(
            st.sampled_from(["\t", "&a ", "*a", "<<: *a\n", "!!python/object:os.system ", "{", "]", ": ", "- ",
                             "\n  ", "%YAML 1.1\n", "---\n", "...\n", "? ", "|", ">", "'", '"', "\x00", "\ufeff"]),
            st.text(max_size=6)))
        cut = data.draw(st.integers(0, 3))
        text = text[:at] + insert + text[at + cut:]
    _check_one(tmp_path_factory.mktemp("damaged"), text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(junk=st.binary(max_size=400))
def test_binary_junk_is_a_clear_error(tmp_path_factory, junk):
    _check_one(tmp_path_factory.mktemp("junk"), junk)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=st.one_of(junk_values, st.dictionaries(st.sampled_from(
    ["run_id", "backend", "work_dir", "nodes", "created_at", "backend_ids", "spec_file", "spec_digest", "x"]),
    junk_values, max_size=9)))
def test_damaged_run_records_are_bad_input(tmp_path_factory, value):
    path = tmp_path_factory.mktemp("info") / "info.yaml"
    try:
        path.write_text(yaml.safe_dump(value))
    except (yaml.YAMLError, ValueError, UnicodeEncodeError):
        return
    try:
        info = state.load(path)
    except BadInput:
        return
    assert isinstance(info.run_id, str) and info.nodes and isinstance(info.backend_ids, dict)


def test_special_inputs(tmp_path):
    for text in ["", "   \n", "---\n...\n", "[]", "null", "a: &a [*a]", "x: " + "[" * 200 + "]" * 200]:
        _check_one(tmp_path, text)
    with pytest.raises(BadInput, match="is a directory"):
        load_spec(tmp_path)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9))
    _check_one(tmp_path, bomb)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (50 << 20))
    with pytest.raises(BadInput, match="limited to"):
        load_spec(big)


def _spec_with(tmp_path: Path, **cluster) -> Path:
    data = copy.deepcopy(VALID[0])
    data["spec"]["cluster"]["spec"].update(cluster)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("field, value, message", [
    ("processesPerNode", 1.0, "must be an integer from 1 to 128, or auto (got 1.0)"),
    ("port", 29500.0, "must be an integer from 0 to 65535 (got number 29500.0)"),
    ("outputsSyncInterval", 1e308, "must be an integer from 1 to 86400"),
    ("rendezvousTimeout", math.inf, "must be an integer from 1 to 86400"),
    ("worker", {"replicas": 100000}, "must be an integer from 0 to 1023 (got 100000)"),
])
def test_integers_are_integers_and_numbers_are_bounded(tmp_path, field, value, message):
    with pytest.raises(SpecError) as raised:
        load_spec(_spec_with(tmp_path, **{field: value}))
    assert message in str(raised.value)


def test_non_finite_numbers_are_refused(tmp_path):
    data = copy.deepcopy(VALID[0])
    data["spec"]["infrastructure"]["spec"]["shapeConfigDetails"] = {"ocpus": math.nan}
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="ocpus: must be a number"):
        load_spec(path)


def test_node_names_that_collide_are_a_spec_error(tmp_path):
    path = _spec_with(tmp_path, main={"name": "w-0", "replicas": 1}, worker={"name": "w", "replicas": 2})
    with pytest.raises(SpecError, match="give more than one node the name 'w-0'"):
        load_spec(path)


def test_planning_is_linear_in_nodes(tmp_path):
    sizes = {}
    for workers in (99, 999):
        path = _spec_with(tmp_path, worker={"replicas": workers})
        done = run_cli("run", "-f", str(path), "--dry-run", "--output", "json", timeout=120)
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)["nodes"]) == workers + 1
        sizes[workers + 1] = len(done.stdout)
    assert sizes[1000] / sizes[100] < 10.5, sizes  # 10x the nodes, 10x the text: no node carries all names


def test_the_local_backend_refuses_what_this_machine_cannot_run():
    assert capacity_problem(2, 2, cpus=2, available_mib=24000) is None
    assert "more than this machine's 2 CPUs" in capacity_problem(64, 1, cpus=2, available_mib=24000)
    assert "MiB available" in capacity_problem(4, 2, cpus=16, available_mib=1000)
    # warm starts keep a spare torchrun per node and a waiting interpreter per training process
    assert "need about 4200 MiB" in capacity_problem(2, 2, cpus=2, available_mib=4000)
    assert capacity_problem(2, 2, cpus=2, available_mib=4000, warm=False) is None


def test_the_local_backend_refusal_is_bad_input_before_anything_starts(tmp_path, launcher_home):
    data = copy.deepcopy(VALID[0])
    data["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "local"}
    data["spec"]["cluster"]["spec"]["worker"]["replicas"] = 1000
    data["spec"]["cluster"]["spec"]["workDir"] = str(tmp_path / "wd")
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(data))
    dry = run_cli("run", "-f", str(path), "--dry-run")
    assert dry.returncode == 0 and "run would refuse" in dry.stdout
    done = run_cli("run", "-f", str(path))
    assert done.returncode == 2 and "training processes" in done.stderr
    assert not (tmp_path / "wd").exists() and not (launcher_home / "runs").exists()

