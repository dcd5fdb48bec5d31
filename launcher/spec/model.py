"""Typed spec objects, built from validated data. Every default is applied here and nowhere else."""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import node_names
from launcher.spec.schema import Problem

DEFAULT_NAME = "distributed"
DEFAULT_RENDEZVOUS_TIMEOUT = 600
DEFAULT_OUTPUTS_SYNC_INTERVAL = 30
DEFAULT_BLOCK_STORAGE_GB = 50
BUILT_IMAGE = "@image"  # "the image `launcher build` made"
AUTO = "auto"

@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True)
class NodeGroup:
    name: str
    image: str | None
    replicas: int
    env: tuple[EnvVar, ...]


@dataclass(frozen=True)
class Elastic:
    min_nodes: int
    max_nodes: int
    max_restarts: int


@dataclass(frozen=True)
class DataScienceJobInfra:
    project_id: str
    compartment_id: str
    shape_name: str
    display_name: str
    block_storage_gb: int
    log_group_id: str | None = None
    log_id: str | None = None
    subnet_id: str | None = None
    ocpus: float | None = None
    memory_gb: float | None = None
    launch_mode: str = "auto"  # auto | native | perNode
    delete_job: bool = False
    endpoints: tuple[tuple[str, str], ...] = ()  # (service, base URL): dataScience, objectStorage, logging


@dataclass(frozen=True)
class LocalInfra:
    work_dir: str | None = None


@dataclass(frozen=True)
class DockerInfra:
    network: str = "bridge"  # "bridge": a network of the run's own; "host": the engine machine's
    volumes: tuple[str, ...] = ()
    shm_size: str | None = None


Infra = DataScienceJobInfra | LocalInfra | DockerInfra


@dataclass(frozen=True)
class Cluster:
    image: str | None
    work_dir: str | None
    ephemeral: bool
    env: tuple[EnvVar, ...]
    start_options: tuple[str, ...]
    main: NodeGroup
    worker: NodeGroup
    processes_per_node: int | None  # None: "auto", one per GPU each node sees (decided on the node)
    elastic: Elastic | None
    rendezvous_timeout: int
    port: int
    outputs_dir: str | None
    outputs_sync_interval: int
    max_runtime: int | None = None  # seconds
    hang_timeout: int | None = None  # seconds

    @property
    def groups(self) -> tuple[NodeGroup, NodeGroup]:
        return (self.main, self.worker)

    @property
    def node_count(self) -> int:
        return self.main.replicas + self.worker.replicas

    @property
    def group_sizes(self) -> list[tuple[str, int]]:
        """``[(main name, replicas), (worker name, replicas)]``: what :func:`node_names.expand` takes."""
        return [(group.name, group.replicas) for group in self.groups]

    @property
    def node_names(self) -> list[str]:
        return node_names.expand(self.group_sizes)


@dataclass(frozen=True)
class Runtime:
    entry_point: str  # a script or executable path, or the module name when kind is "module"
    args: tuple[str, ...]
    env: tuple[EnvVar, ...]
    kind: str = "script"  # script (python FILE) | module (python -m NAME) | executable (run as it is)


@dataclass(frozen=True)
class Spec:
    name: str
    infra_type: str  # dataScienceJob | local | docker
    infra: Infra
    cluster: Cluster
    runtime: Runtime
    source: Path | None = None
    digest: str = field(default="", compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    data: dict = field(default_factory=dict, compare=False, repr=False)  # the validated document, overrides applied
    overrides: tuple[str, ...] = field(default=(), compare=False)  # the command-line options that changed it

    @property
    def base_dir(self) -> Path:
        """Directory the spec came from: the code directory for local runs and image builds."""
        return self.source.parent if self.source else Path.cwd()


def as_text(value: Any) -> str:
    """One canonical text form for YAML scalars used as env values and arguments."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _env(items: list | None) -> tuple[EnvVar, ...]:
    return tuple(EnvVar(item["name"], as_text(item.get("value"))) for item in items or ())


def _kwargs(kwargs: Any) -> list[str]:
    if isinstance(kwargs, str):
        return shlex.split(kwargs)
    tokens: list[str] = []
    for key, value in (kwargs or {}).items():
        tokens += [key if key.startswith("-") else f"--{key}", as_text(value)]
    return tokens


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build(data: dict, source: Path | None = None) -> tuple[Spec, list[Problem]]:
    """Turn schema-valid data into a :class:`Spec`; return cross-field problems the schema cannot express."""
    top = data["spec"]
    infra_data = top["infrastructure"]
    cluster_data = top["cluster"]["spec"]
    runtime_data = top["runtime"]["spec"]
    infra_spec = infra_data.get("spec") or {}
    name = top.get("name") or cluster_data.get("name") or DEFAULT_NAME

    problems: list[Problem] = []
    config = cluster_data.get("config") or {}
    main_data = cluster_data.get("main") or {}
    worker_data = cluster_data.get("worker") or {}
    main = _group(main_data, f"{name}-main", 1)
    worker = _group(worker_data, f"{name}-worker", 0)
    clash = node_names.duplicates(node_names.expand([(main.name, main.replicas), (worker.name, worker.replicas)]))
    if clash:
        problems.append(Problem(("spec", "cluster", "spec", "worker", "name"),
                                f"main group '{main.name}' and worker group '{worker.name}' give more than one node "
                                f"the name {', '.join(repr(n) for n in clash[:3])}; choose other group names"))

    elastic = None
    if "elastic" in cluster_data:
        e = cluster_data["elastic"]
        elastic = Elastic(e["minNodes"], e["maxNodes"], e.get("maxRestarts", 0))
        total = main.replicas + worker.replicas
        if not elastic.min_nodes <= total <= elastic.max_nodes:
            problems.append(Problem(("spec", "cluster", "spec", "elastic"),
                                    f"the cluster starts {total} nodes (main + worker replicas), which must lie within "
                                    f"minNodes..maxNodes ({elastic.min_nodes}..{elastic.max_nodes})"))

    cluster = Cluster(
        image=cluster_data.get("image"),
        work_dir=cluster_data.get("workDir"),
        ephemeral=bool(cluster_data.get("ephemeral", True)),
        env=_env(config.get("env")),
        start_options=tuple(as_text(o) for o in config.get("startOptions") or ()),
        main=main,
        worker=worker,
        processes_per_node=_processes(cluster_data.get("processesPerNode", 1)),
        elastic=elastic,
        rendezvous_timeout=cluster_data.get("rendezvousTimeout", DEFAULT_RENDEZVOUS_TIMEOUT),
        port=cluster_data.get("port", 0),
        outputs_dir=cluster_data.get("outputsDir"),
        outputs_sync_interval=cluster_data.get("outputsSyncInterval", DEFAULT_OUTPUTS_SYNC_INTERVAL),
        max_runtime=_duration(cluster_data, "maxRuntime", problems),
        hang_timeout=_duration(cluster_data, "hangTimeout", problems),
    )
    rt_path = ("spec", "runtime", "spec")
    if "module" in runtime_data and "entryPoint" in runtime_data:
        problems.append(Problem(rt_path + ("module",), "use either entryPoint (a file) or module (python -m), not both"))
    entry = runtime_data.get("module") or runtime_data["entryPoint"]
    kind = "module" if "module" in runtime_data else ("script" if entry.endswith(".py") else "executable")
    runtime = Runtime(
        entry_point=entry,
        args=tuple(as_text(a) for a in runtime_data.get("args") or ()) + tuple(_kwargs(runtime_data.get("kwargs"))),
        env=_env(runtime_data.get("env")),
        kind=kind,
    )
    if infra_data["type"] == "dataScienceJob":
        problems += _oci_problems(infra_spec, main.replicas + worker.replicas)
    base_dir = source.parent if source else Path.cwd()
    warnings = tuple(entry_point_problems(runtime, base_dir))
    spec = Spec(name=name, infra_type=infra_data["type"], infra=_infra(infra_data["type"], infra_spec, name),
                cluster=cluster, runtime=runtime, source=source, digest=digest(data), warnings=warnings, data=data)
    return spec, problems


MAX_DURATION_SECONDS = 30 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: int | str) -> int:
    """``3600``, ``"90m"``, ``"2h"`` -> seconds (schema-valid input)."""
    if isinstance(value, int):
        return value
    text = value.strip()
    return max(1, round(float(text[:-1]) * _UNITS[text[-1]]))


def _duration(data: dict, key: str, problems: list[Problem]) -> int | None:
    if key not in data:
        return None
    seconds = parse_duration(data[key])
    if seconds > MAX_DURATION_SECONDS:
        problems.append(Problem(("spec", "cluster", "spec", key), f"must be at most 30 days (got {data[key]!r})"))
    return seconds


def entry_point_problems(runtime: Runtime, code_dir: Path) -> list[str]:
    """Why the entry point file will not start, when it is a relative path in the code directory."""
    if runtime.kind == "module" or Path(runtime.entry_point).is_absolute():
        return []
    path = code_dir / runtime.entry_point
    if not path.is_file():
        nearby = [str(p.relative_to(code_dir)) for p in itertools.islice(code_dir.rglob("*"), 5000) if p.is_file()]
        close = difflib.get_close_matches(runtime.entry_point, nearby, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return [f"spec.runtime.spec.entryPoint: '{runtime.entry_point}' is not a file in the code directory "
                f"{code_dir}{hint}"]
    if runtime.kind == "executable" and not os.access(path, os.X_OK):
        return [f"spec.runtime.spec.entryPoint: '{runtime.entry_point}' is run as a program (it does not end "
                f"in .py) but is not executable: chmod +x {path}, and start it with a #! line"]
    return []


def _processes(value: int | str) -> int | None:
    return None if value == AUTO else int(value)


def processes_text(value: int | None) -> str:
    """How a process count is written in env, records and messages: a number or ``auto``."""
    return AUTO if value is None else str(value)


def _group(data: dict, default_name: str, default_replicas: int) -> NodeGroup:
    return NodeGroup(
        name=data.get("name") or default_name,
        image=data.get("image"),
        replicas=data.get("replicas", default_replicas),
        env=_env((data.get("config") or {}).get("env")),
    )


def _oci_problems(spec: dict, nodes: int) -> list[Problem]:
    """What OCI Data Science would refuse, or let fail, minutes after submission."""
    path = ("spec", "infrastructure", "spec")
    problems = []
    if spec["shapeName"].endswith(".Flex") and not spec.get("shapeConfigDetails"):
        problems.append(Problem(path + ("shapeName",), f"{spec['shapeName']} is a flexible shape: set "
                                "shapeConfigDetails (ocpus and memoryInGBs) for it"))
    if spec.get("launchMode") == "perNode" and nodes > 1 and not spec.get("subnetId"):
        problems.append(Problem(path + ("launchMode",), f"perNode runs {nodes} separate job runs, which reach "
                                "each other only on a subnet of yours: set subnetId (a subnet that allows traffic "
                                "between its hosts), or use launchMode: native"))
    return problems


def _infra(kind: str, spec: dict, name: str) -> Infra:
    if kind == "dataScienceJob":
        shape = spec.get("shapeConfigDetails") or {}
        return DataScienceJobInfra(
            project_id=spec["projectId"], compartment_id=spec["compartmentId"], shape_name=spec["shapeName"],
            display_name=spec.get("displayName") or name,
            block_storage_gb=spec.get("blockStorageSize", DEFAULT_BLOCK_STORAGE_GB),
            log_group_id=spec.get("logGroupId"), log_id=spec.get("logId"), subnet_id=spec.get("subnetId"),
            ocpus=shape.get("ocpus"), memory_gb=shape.get("memoryInGBs"),
            launch_mode=spec.get("launchMode", "auto"), delete_job=bool(spec.get("deleteJob", False)),
            endpoints=tuple(sorted((spec.get("endpoints") or {}).items())),
        )
    if kind == "docker":
        return DockerInfra(network=spec.get("network", "bridge"), volumes=tuple(spec.get("volumes", ())),
                           shm_size=spec.get("shmSize"))
    return LocalInfra(work_dir=spec.get("workDir"))


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(text: str) -> str:
    return _SAFE.sub("-", text).strip("-.").lower() or DEFAULT_NAME
