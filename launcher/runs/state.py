"""The client's record of each run: ``{LAUNCHER_HOME or ~/.launcher}/runs/{run_id}/info.yaml``."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import BackendError, BadInput
from launcher.fileio import atomic_write


def home() -> Path:
    return Path(os.environ.get("LAUNCHER_HOME") or Path.home() / ".launcher")


def runs_dir() -> Path:
    return home() / "runs"


@dataclass
class RunInfo:
    run_id: str
    backend: str
    work_dir: str
    nodes: list[str]
    spec_file: str
    spec_digest: str
    created_at: float
    processes_per_node: int | str = 1  # a number, or "auto" (each node decides; the decision records it)
    submission: str = "submitted"  # submitting | submitted | failed: how far `run` got
    overrides: list[str] = field(default_factory=list)  # command-line options that changed the spec
    effective_spec: dict[str, Any] = field(default_factory=dict)  # the spec as run, secrets masked
    backend_ids: dict[str, Any] = field(default_factory=dict)
    path: str = ""

    @property
    def run_url(self) -> str:
        return f"{self.work_dir.rstrip('/')}/{self.run_id}"

    @property
    def state_dir(self) -> Path:
        return Path(self.path).parent


def save(info: RunInfo) -> Path:
    import yaml

    path = runs_dir() / info.run_id / "info.yaml"
    info.path = str(path)
    data = {k: v for k, v in asdict(info).items() if k != "path"}
    try:
        atomic_write(path, "# Written by launcher; any verb accepts this file's path as RUN.\n"
                     + yaml.safe_dump(data, sort_keys=False))
    except OSError as exc:
        raise BackendError(f"cannot write the run record {path}: {exc.strerror or exc}; set LAUNCHER_HOME "
                           "to a writable directory") from None
    return path


def load(path: Path) -> RunInfo:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
        info = RunInfo(**data, path=str(path))
        if not (isinstance(info.nodes, list) and all(isinstance(n, str) for n in info.nodes) and info.nodes
                and isinstance(info.run_id, str) and isinstance(info.work_dir, str)
                and isinstance(info.backend_ids, dict) and isinstance(info.created_at, (int, float))):
            raise TypeError("fields of the wrong type")
        return info
    except (OSError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise BadInput(f"{path}: not a launcher info.yaml ({exc})") from None


def all_runs() -> list[RunInfo]:
    """Every recorded run, newest first."""
    found = []
    for path in runs_dir().glob("*/info.yaml"):
        try:
            found.append(load(path))
        except BadInput:
            continue
    return sorted(found, key=lambda info: info.created_at, reverse=True)


def resolve_run(ref: str | None) -> RunInfo:
    """A run id (or a unique prefix), a path to an info.yaml (or its directory), an OCI job or job run
    OCID, or None for the latest run."""
    if not ref:
        runs = all_runs()
        if not runs:
            raise BadInput(f"no runs recorded in {runs_dir()}; start one with: launcher run -f train.yaml")
        return runs[0]
    candidate = Path(ref)
    if candidate.is_dir():
        candidate = candidate / "info.yaml"
    if candidate.is_file():
        return load(candidate)
    by_id = runs_dir() / ref / "info.yaml"
    if by_id.is_file():
        return load(by_id)
    if ref.startswith("ocid1."):  # a job or job run OCID of an OCI run
        owners = [info for info in all_runs() if ref == info.backend_ids.get("job")
                  or ref in (info.backend_ids.get("job_runs") or {}).values()]
        if owners:
            return owners[0]
    matches = [info for info in all_runs() if info.run_id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BadInput(f"'{ref}' matches {len(matches)} runs: {', '.join(m.run_id for m in matches[:5])}")
    raise BadInput(f"no run '{ref}' (not a run id in {runs_dir()}, nor an info.yaml path)")

