"""Command-line overrides (issue 15, item 6): `--set` paths in both syntaxes, a bad path reported against
its option with a did-you-mean, `-- ARGS` replacing args and kwargs, secrets kept out of the option text."""

from __future__ import annotations

import pytest

from conftest import run_cli
from launcher.errors import BadInput, SpecError
from launcher.spec import Overrides, load_spec
from launcher.spec.overrides import parse_path

SPEC = """\
kind: distributed
apiVersion: v1.0
spec:
  infrastructure: {kind: infrastructure, type: local}
  cluster:
    kind: pytorch
    spec:
      workDir: ./wd
      config:
        env:
          - {name: DB_PASSWORD, value: hunter2}
          - {name: PLAIN, value: "1"}
      worker: {replicas: 1}
  runtime:
    kind: python
    spec:
      entryPoint: train.py
      args: [--data, /data]
      kwargs: {epochs: 2}
"""


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(SPEC)
    (tmp_path / "train.py").write_text("")
    return path


def problems_with(path, **overrides) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(path, Overrides(**overrides))
    return caught.value.problems


@pytest.mark.parametrize("dotted, path", [
    ("spec.cluster.spec.config.env[1].value", ("spec", "cluster", "spec", "config", "env", 1, "value")),
    ("spec.cluster.spec.config.env.1.value", ("spec", "cluster", "spec", "config", "env", 1, "value")),
    ("a[0][12]", ("a", 0, 12)),
    ("a.b-c_d", ("a", "b-c_d")),
])
def test_paths_take_list_indexes_in_brackets_or_between_dots(dotted, path):
    assert parse_path(dotted) == path


@pytest.mark.parametrize("dotted", ["a..b", "a.", ".a", "[0]", "a[x]", "a[0", "a]", "a[-1]", "a.[0]"])
def test_malformed_paths_are_refused(dotted):
    with pytest.raises(ValueError):
        parse_path(dotted)


def test_both_path_syntaxes_set_the_same_list_item(spec_file):
    for dotted in ("spec.cluster.spec.config.env[1].value", "spec.cluster.spec.config.env.1.value"):
        spec = load_spec(spec_file, Overrides(sets=(f"{dotted}=7",)))
        assert [(var.name, var.value) for var in spec.cluster.env] == [("DB_PASSWORD", "hunter2"), ("PLAIN", "7")]


def test_trailing_arguments_replace_args_and_kwargs(spec_file):
    assert load_spec(spec_file).runtime.args == ("--data", "/data", "--epochs", "2")
    spec = load_spec(spec_file, Overrides(args=("--epochs", "1")))
    assert spec.runtime.args == ("--epochs", "1")
    assert "kwargs" not in spec.data["spec"]["runtime"]["spec"]  # the effective spec shows what runs
    assert load_spec(spec_file, Overrides(args=())).runtime.args == ()


def test_a_misspelt_key_in_a_set_path_is_reported_against_the_option(spec_file):
    assert problems_with(spec_file, sets=("spec.cluster.spec.wroker.replicas=2",)) == [
        "--set spec.cluster.spec.wroker.replicas=2: spec.cluster.spec.wroker: unknown key 'wroker'; "
        "did you mean 'worker'?"]
    assert problems_with(spec_file, sets=("spec.cluster.spec.elastic.minNodes=2",)) == [
        "--set spec.cluster.spec.elastic.minNodes=2: spec.cluster.spec.elastic: missing required key 'maxNodes'"]


def test_a_file_value_at_odds_with_an_option_names_both(spec_file):
    """The elastic bounds come from the file, the node count from the option: the line is the file's, and the
    option that made it wrong is named beside it; an option that did not take part is not."""
    elastic = "\n      elastic: {minNodes: 2, maxNodes: 3}"
    spec_file.write_text(SPEC.replace("worker: {replicas: 1}", "worker: {replicas: 1}" + elastic))
    bounds = "spec.cluster.spec.elastic: the cluster starts {} (main + worker replicas), which must lie within " \
             "minNodes..maxNodes (2..3)"
    assert problems_with(spec_file, nodes=1, env=("X=1",)) == [
        f"{spec_file}:14:16: {bounds.format('1 node')}; given --nodes 1 (main + workers)"]
    assert problems_with(spec_file, sets=("spec.cluster.spec.worker.replicas=5", "spec.runtime.spec.args=[]")) == [
        f"{spec_file}:14:16: {bounds.format('6 nodes')}; given --set spec.cluster.spec.worker.replicas=5"]
    spec_file.write_text(SPEC.replace("worker: {replicas: 1}", "worker: {replicas: 3}" + elastic))
    assert problems_with(spec_file, env=("X=1",)) == [f"{spec_file}:14:16: {bounds.format('4 nodes')}"]


@pytest.mark.parametrize("item, message", [
    ("spec.cluster.spec.config.env[5].value=1", "spec.cluster.spec.config.env has 2 items; there is no item [5]"),
    ("spec.cluster.spec.config.env.name=X", "spec.cluster.spec.config.env is a list: pick an item by number, "
                                            "e.g. spec.cluster.spec.config.env[0]"),
    ("spec.runtime.spec.entryPoint.x=1", "spec.runtime.spec.entryPoint is not a mapping or list in the spec"),
    ("spec.cluster..spec=1", "'spec.cluster..spec' is not a path"),
])
def test_set_paths_that_cannot_be_followed_name_the_option(spec_file, item, message):
    with pytest.raises(BadInput) as caught:
        load_spec(spec_file, Overrides(sets=(item,)))
    assert str(caught.value).startswith(f"--set {item}: {message}")


def test_a_value_set_into_a_secret_env_entry_is_masked_in_the_option_text(spec_file):
    spec = load_spec(spec_file, Overrides(sets=("spec.cluster.spec.config.env[0].value=s3cret",
                                                "spec.cluster.spec.config.env.1.value=shown")))
    assert spec.overrides == ("--set spec.cluster.spec.config.env[0].value=********",
                              "--set spec.cluster.spec.config.env.1.value=shown")


def test_cli_reports_the_bad_path_against_the_option(spec_file):
    done = run_cli("run", "-f", str(spec_file), "--dry-run", "--set", "spec.cluster.spec.wroker.replicas=2")
    assert done.returncode == 2
    assert done.stderr == ("--set spec.cluster.spec.wroker.replicas=2: spec.cluster.spec.wroker: unknown key "
                           "'wroker'; did you mean 'worker'?\n")
