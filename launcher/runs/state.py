"""The client's record of each run: ``{LAUNCHER_HOME or ~/.launcher}/runs/{run_id}/info.yaml``."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from launcher.backend_names import BACKENDS
from launcher.errors import BackendError, BadInput
from launcher.fileio import atomic_write
from launcher.wording import quoted

if TYPE_CHECKING:
    from launcher.protocol.store import WorkDir


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # what a run id may be: a name for a directory and a prefix


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
    submission_error: str = ""  # why `run` failed to start it (the backend's refusal, as it was shown)
    overrides: list[str] = field(default_factory=list)  # command-line options that changed the spec
    effective_spec: dict[str, Any] = field(default_factory=dict)  # the spec as run, secrets masked
    backend_ids: dict[str, Any] = field(default_factory=dict)
    path: str = ""

    @property
    def run_url(self) -> str:
        return f"{self.work_dir.rstrip('/')}/{self.run_id}"

    @property
    def recorded(self) -> bool:
        """Whether this machine records the run (its info.yaml); not so for a run opened from its work dir."""
        return bool(self.path)

    @property
    def state_dir(self) -> Path:
        """This machine's directory of the run's process facts; for a run it does not record, a directory
        that holds none (run ids never start with a dot), so no backend acts on another run's."""
        return Path(self.path).parent if self.recorded else runs_dir() / ".not-recorded"


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

    try:  # libyaml's parser where PyYAML has it: listing a thousand runs reads a thousand of these
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        info = RunInfo(**data, path=str(path))
        if not (isinstance(info.nodes, list) and all(isinstance(n, str) for n in info.nodes) and info.nodes
                and isinstance(info.run_id, str) and isinstance(info.work_dir, str)
                and isinstance(info.backend_ids, dict) and isinstance(info.created_at, (int, float))):
            raise TypeError("fields of the wrong type")
        return info
    except (OSError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise BadInput(f"{path}: not a launcher info.yaml ({exc})") from None


def reread(info: RunInfo) -> RunInfo:
    """The run's record as this machine holds it now, else ``info`` itself: another command (``scale``, another
    follower) may have changed it since ``info`` was read, which saving ``info`` whole would undo."""
    if not info.recorded:
        return info
    try:
        return load(Path(info.path))
    except BadInput:  # gone or damaged: what this command holds is all there is
        return info


def all_runs(reader: Callable[[Path], RunInfo] = load) -> list[RunInfo]:
    """Every recorded run, newest first; each record read by ``reader`` (one that keeps what it read, say)."""
    found = []
    for path in runs_dir().glob("*/info.yaml"):
        try:
            found.append(reader(path))
        except BadInput:
            continue
    return sorted(found, key=lambda info: info.created_at, reverse=True)


def _slurm_jobs(ids: dict[str, Any]) -> set[str]:
    """The Slurm jobs a run's record names."""
    attempt = ids.get("attempt") or {}
    return {ids.get("job_id"), *(ids.get("added") or {}).values(), *(attempt.get("units") or {}).values()} - {None}


def recorded_run(run_id: str) -> RunInfo:
    """The run this machine records under ``run_id``, a run id and nothing else (no path, URL or prefix): for a
    caller that takes the id from someone else (the ``ui``'s URLs)."""
    if not RUN_ID.fullmatch(run_id):
        raise BadInput(f"{quoted(run_id)} is not a run id (1-100 letters, digits, '.', '_' or '-')")
    path = runs_dir() / run_id / "info.yaml"
    if not path.is_file():
        raise BadInput(f"no run '{run_id}' in {runs_dir()}")
    return load(path)


def _path_kind(path: Path) -> str | None:
    """"dir", "file", or None where ``path`` is neither or cannot be a path at all (too long a name: a reference
    that was never meant as a path raises no error for it)."""
    try:
        return "dir" if path.is_dir() else "file" if path.is_file() else None
    except OSError:
        return None


def resolve_run(ref: str | None) -> RunInfo:
    """A run id (or a unique prefix), a path to an info.yaml (or its directory), a run's work-dir URL or
    directory (``s3://bucket/prefix/RUN``, ``./work_dir/RUN``), an OCI job or job run OCID, a Slurm job id, a
    Kubernetes ``namespace/job-name``, or None for the latest run."""
    if not ref:
        runs = all_runs()
        if not runs:
            raise BadInput(f"no runs recorded in {runs_dir()}; start one with: launcher run -f train.yaml")
        return runs[0]
    candidate = Path(ref)
    kind = _path_kind(candidate)
    if kind == "dir" and _path_kind(candidate / "info.yaml") == "file":
        candidate, kind = candidate / "info.yaml", "file"
    if kind == "file":
        return load(candidate)
    by_id = runs_dir() / ref / "info.yaml"
    if _path_kind(by_id) == "file":
        return load(by_id)
    if ref.count("/") == 1 and "://" not in ref and kind is None:  # a Kubernetes namespace/job-name
        owners = [info for info in all_runs() if info.backend == "kubernetes"
                  and ref == f"{info.backend_ids.get('namespace')}/{info.backend_ids.get('job')}"]
        if owners:
            return owners[0]
    if "://" in ref or kind == "dir":
        return from_work_dir(ref)
    if ref.startswith("ocid1."):  # a job or job run OCID of an OCI run
        owners = [info for info in all_runs() if ref == info.backend_ids.get("job")
                  or ref in (info.backend_ids.get("job_runs") or {}).values()]
        if owners:
            return owners[0]
    if ref.isdigit():  # a Slurm job id: the run's own, a node's `launcher scale` added, its current attempt's
        owners = [info for info in all_runs() if ref in _slurm_jobs(info.backend_ids)]
        if owners:
            return owners[0]
    matches = [info for info in all_runs() if info.run_id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BadInput(f"{quoted(ref)} matches {len(matches)} runs: {', '.join(m.run_id for m in matches[:5])}")
    raise BadInput(f"no run {quoted(ref)} (not a run id in {runs_dir()}, an info.yaml path, nor a run's work dir)")


def from_work_dir(ref: str) -> RunInfo:
    """The run whose work dir is ``ref`` (``{work dir}/{run id}``): this machine's record of it when it has
    one, else a record built from what the work dir holds, with the backend's process facts unknown."""
    url = ref.rstrip("/") if "://" in ref else str(Path(ref).resolve())
    run_id = url.rpartition("/")[2]
    local = runs_dir() / run_id / "info.yaml"
    if local.is_file():
        info = load(local)
        if _same_place(info.run_url, url):
            return info
    info, expected = _info_from_records(url)
    missing = len(info.nodes) < expected
    sys.stderr.write(f"note: run {info.run_id} is not recorded on this machine; read from its work dir "
                     f"(the {info.backend} backend's own view of its processes is not available here)"
                     + (f"; {len(info.nodes)} of its {expected} nodes have registered so far" if missing else "")
                     + "\n")
    return info


def _same_place(first: str, second: str) -> bool:
    return first.removeprefix("file://").rstrip("/") == second.removeprefix("file://").rstrip("/")


def _info_from_records(url: str) -> tuple[RunInfo, int]:
    """A run's record rebuilt from its work dir (run.json, the decision, statuses and registrations), and
    how many nodes run.json says it has."""
    from launcher.protocol.rendezvous import DECISION_KEY
    from launcher.runs.preflight import RUN_RECORD, reading_work_dir

    run = reading_work_dir(url)
    record = run.get_record(RUN_RECORD)
    decision = run.get_record(DECISION_KEY)
    nodes = _node_names(run, decision.get("ranks"))
    if not nodes:
        what = "no node of it has registered yet" if record else f"it holds no {RUN_RECORD} and no node records"
        raise BadInput(f"no run to show at {url}: {what} (a run's work dir is WORK_DIR/RUN_ID)")
    processes = decision.get("processes_per_node")
    created = record.get("created_at")
    work_dir, _, run_id = url.rpartition("/")
    backend, backend_ids = _backend_of(record.get("backend"))
    info = RunInfo(run_id=run_id, work_dir=work_dir, nodes=nodes, spec_file="", spec_digest="", backend=backend,
                   created_at=float(created) if isinstance(created, (int, float)) else 0.0,
                   processes_per_node=processes if isinstance(processes, int) else "auto", backend_ids=backend_ids)
    expected = record.get("nodes")
    return info, expected if isinstance(expected, int) else len(nodes)


def _backend_of(recorded: Any) -> tuple[str, dict[str, Any]]:
    """The backend that run.json names, and the facts it implies: docker-compose's runs are docker runs
    whose containers are compose's to remove (``docker-compose down``), not a watcher's."""
    if recorded == "compose":
        return "docker", {"compose": "-"}
    return (recorded if recorded in BACKENDS else "local"), {}


def _node_names(run: WorkDir, ranks: Any) -> list[str]:
    """The nodes a run's work dir names (decision, statuses, registrations), in rank order where decided."""
    from launcher.protocol.rendezvous import NODES_PREFIX, parse_node_key
    from launcher.protocol.status import STATUS_PREFIX

    ranks = {name: rank for name, rank in ranks.items() if isinstance(rank, int)} if isinstance(ranks, dict) else {}
    names = set(ranks) | {key.removesuffix(".json") for key in run.list(STATUS_PREFIX) if key.endswith(".json")}
    names |= {listed.name for key in run.list(NODES_PREFIX) if (listed := parse_node_key(key))}
    return sorted(names, key=lambda name: (ranks.get(name, len(names)), name))

