"""launcher init: offline, from files in the package; never overwrites without --force."""

from __future__ import annotations

import importlib.util
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

from conftest import run_cli

EXPECTED = ["artifacts/pytorch/v1/Dockerfile", "artifacts/pytorch/v1/node_entry.py",
            "artifacts/pytorch/v1/requirements.txt", "train.py", "train.yaml"]


def written(directory) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_init_writes_a_valid_spec_example_and_artifacts(tmp_path):
    done = run_cli("init", "--framework", "pytorch", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert written(tmp_path) == EXPECTED
    for rel in EXPECTED:
        assert f"wrote {tmp_path / rel}" in done.stdout
    assert run_cli("validate", "-f", str(tmp_path / "train.yaml")).returncode == 0
    dockerfile = (tmp_path / "artifacts/pytorch/v1/Dockerfile").read_text()
    assert "ARG BASE_IMAGE" in dockerfile and "FROM ${BASE_IMAGE}" in dockerfile
    assert "ElasticSampler" in (tmp_path / "train.py").read_text()


def test_init_says_what_to_type_next_from_where_the_user_is(tmp_path):
    elsewhere = run_cli("init", "--framework", "pytorch", "--dir", "my project", cwd=tmp_path)
    assert elsewhere.stderr.endswith("next: cd 'my project' && launcher run -f train.yaml\n"), elsewhere.stderr
    (tmp_path / "fresh").mkdir()
    here = run_cli("init", "--framework", "pytorch", cwd=tmp_path / "fresh")
    assert here.stderr.endswith("\nnext: launcher run -f train.yaml\n"), here.stderr


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path):
    (tmp_path / "train.py").write_text("my own work\n")
    done = run_cli("init", "--framework", "pytorch", "--dir", str(tmp_path))
    assert done.returncode == 2 and "train.py" in done.stderr and "--force" in done.stderr
    assert written(tmp_path) == ["train.py"]
    assert (tmp_path / "train.py").read_text() == "my own work\n"
    forced = run_cli("init", "--framework", "pytorch", "--dir", str(tmp_path), "--force")
    assert forced.returncode == 0 and written(tmp_path) == EXPECTED
    assert (tmp_path / "train.py").read_text() != "my own work\n"


def test_init_unknown_framework(tmp_path):
    done = run_cli("init", "--framework", "dask", "--dir", str(tmp_path))
    assert done.returncode == 2 and "framework 'dask' is not supported yet" in done.stderr
    assert written(tmp_path) == []


def test_the_example_reads_scikit_learns_digits_without_importing_it(tmp_path, monkeypatch):
    """The example reads the CSV scikit-learn bundles (its import would cost every training process about a second
    of CPU); where the file is not found it falls back on scikit-learn's loader. Both give load_digits' data."""
    train_py = Path(__file__).resolve().parents[1] / "templates" / "pytorch" / "train.py"
    code = f"import runpy, sys; runpy.run_path({str(train_py)!r})['read_digits'](); print('sklearn' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False", imported.stdout + imported.stderr
    example = runpy.run_path(str(train_py))
    expected = load_digits()
    for found in (importlib.util.find_spec, lambda name: None):
        monkeypatch.setattr(importlib.util, "find_spec", found)
        pixels, labels = example["read_digits"]()
        assert np.array_equal(pixels, expected.data) and np.array_equal(labels, expected.target)
        assert labels.dtype == np.int64
