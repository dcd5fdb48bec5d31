"""Typed spec objects, built from validated data. Every default is applied here and nowhere else."""

from __future__ import annotations

import difflib
import functools
import hashlib
import itertools
import json
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from launcher import node_names
from launcher.spec.schema import Problem
from launcher.wording import plural

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
class Recovery:
    max_restarts: int
    retry_on: tuple[str | int, ...]  # "lost", "failure", or exit codes
    replacement_wait: int = 30  # seconds a round waits for a lost node's replacement (launcher.protocol.rounds)


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


@dataclass(frozen=True)
class SlurmInfra:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    time: str | None = None  # Slurm's time format; a number is minutes
    time_limit_notice: int = 120  # seconds before the time limit the nodes are told to save and stop (capped)
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    memory: str | None = None
    exclusive: bool = False
    python: str | None = None  # the nodes' interpreter (None: the client's, or python3 after setup)
    sbatch_options: tuple[str, ...] = ()
    setup: str = ""  # shell lines, run on each node before its bootstrap


@dataclass(frozen=True)
class KubernetesInfra:
    """The Job's and pods' settings; tolerations and affinity are the API's own objects, passed through."""

    namespace: str | None = None
    context: str | None = None
    service_account: str | None = None
    cpu: str | None = None
    memory: str | None = None
    gpus: int | None = None
    extended: dict[str, int] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    image_pull_secrets: tuple[str, ...] = ()
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    queue_name: str | None = None
    secrets: tuple[str, ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()  # {claimName, mountPath, readOnly}
    shm_size: str | None = None
    ttl_seconds_after_finished: int | None = None


Infra = DataScienceJobInfra | LocalInfra | DockerInfra | SlurmInfra | KubernetesInfra


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
    recovery: Recovery | None = None  # None: fail fast (no restarts, no elastic rounds)

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
    infra_type: str  # dataScienceJob | local | docker | slurm | kubernetes
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


DataPath = tuple  # keys and list indexes into the spec data
CLUSTER: DataPath = ("spec", "cluster", "spec")
RUNTIME: DataPath = ("spec", "runtime", "spec")
INFRA: DataPath = ("spec", "infrastructure")
_GROUP_READS = (("spec", "name"), CLUSTER + ("name",), CLUSTER + ("main", "name"), CLUSTER + ("main", "replicas"),
                CLUSTER + ("worker", "name"), CLUSTER + ("worker", "replicas"))
Rule = Callable[[dict], list[Problem]]
_RULES: list[tuple[tuple[DataPath, ...], Rule]] = []


def problems(data: dict, invalid: Iterable[DataPath]) -> list[Problem]:
    """The cross-field problems the schema cannot express, also in data the schema refused.

    ``invalid`` holds the paths of the schema's problems; a rule runs when every value it reads is
    absent or passed the schema, so ``validate`` reports both kinds in one pass.
    """
    invalid = tuple(invalid)
    found: list[Problem] = []
    for reads, rule in _RULES:
        if all(_intact(data, path, invalid) for path in reads):
            found += [replace(problem, reads=reads) for problem in rule(data)]
    return found


def _rule(*reads: DataPath) -> Callable[[Rule], Rule]:
    """Register a cross-field rule with the paths of the values it reads."""
    def register(rule: Rule) -> Rule:
        _RULES.append((reads, rule))
        return rule
    return register


def _intact(data: dict, path: DataPath, invalid: tuple[DataPath, ...]) -> bool:
    """Whether the value at ``path`` is absent or passed the schema, with mappings all the way to it."""
    if any(bad[:len(path)] == path for bad in invalid):
        return False
    node: Any = data
    for part in path[:-1]:
        if part not in node:
            return True
        node = node[part]
        if not isinstance(node, dict):
            return False
    return True


def _at(data: dict, path: DataPath) -> Any:
    """The value at ``path`` in data whose rule reads are intact; None when absent."""
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _job_name(data: dict) -> str:
    return _at(data, ("spec", "name")) or _at(data, CLUSTER + ("name",)) or DEFAULT_NAME


def _groups(data: dict) -> tuple[NodeGroup, NodeGroup]:
    name = _job_name(data)
    return (_group(_at(data, CLUSTER + ("main",)) or {}, f"{name}-main", 1),
            _group(_at(data, CLUSTER + ("worker",)) or {}, f"{name}-worker", 0))


@_rule(*_GROUP_READS)
def _node_name_clash(data: dict) -> list[Problem]:
    main, worker = _groups(data)
    clash = node_names.duplicates(node_names.expand([(main.name, main.replicas), (worker.name, worker.replicas)]))
    if not clash:
        return []
    return [Problem(CLUSTER + ("worker", "name"), f"main group '{main.name}' and worker group '{worker.name}' give "
                    f"more than one node the name {', '.join(repr(n) for n in clash[:3])}; choose other group names")]


@_rule(CLUSTER + ("elastic",), *_GROUP_READS)
def _elastic_bounds(data: dict) -> list[Problem]:
    elastic = _at(data, CLUSTER + ("elastic",))
    total = sum(group.replicas for group in _groups(data))
    if elastic is None or elastic["minNodes"] <= total <= elastic["maxNodes"]:
        return []
    return [Problem(CLUSTER + ("elastic",), f"the cluster starts {plural(total, 'node')} (main + worker replicas), "
                    f"which must lie within minNodes..maxNodes ({elastic['minNodes']}..{elastic['maxNodes']})")]


def _duration_limit(key: str, data: dict) -> list[Problem]:
    value = _at(data, CLUSTER + (key,))
    if value is None or parse_duration(value) <= MAX_DURATION_SECONDS:
        return []
    return [Problem(CLUSTER + (key,), f"must be at most 30 days (got {value!r})")]


_rule(CLUSTER + ("maxRuntime",))(functools.partial(_duration_limit, "maxRuntime"))
_rule(CLUSTER + ("hangTimeout",))(functools.partial(_duration_limit, "hangTimeout"))


@_rule(RUNTIME + ("module",), RUNTIME + ("entryPoint",))
def _module_or_entry_point(data: dict) -> list[Problem]:
    runtime = _at(data, RUNTIME) or {}
    if "module" in runtime and "entryPoint" in runtime:
        return [Problem(RUNTIME + ("module",), "use either entryPoint (a file) or module (python -m), not both")]
    return []


@_rule(INFRA + ("type",), *(INFRA + ("spec", key) for key in ("shapeName", "shapeConfigDetails", "launchMode",
                                                               "subnetId")), *_GROUP_READS)
def _oci_problems(data: dict) -> list[Problem]:
    """What OCI Data Science would refuse, or let fail, minutes after submission."""
    if _at(data, INFRA + ("type",)) != "dataScienceJob":
        return []
    spec = _at(data, INFRA + ("spec",)) or {}
    shape = spec.get("shapeName") or ""
    nodes = sum(group.replicas for group in _groups(data))
    path = INFRA + ("spec",)
    found = []
    if shape.endswith(".Flex") and not spec.get("shapeConfigDetails"):
        found.append(Problem(path + ("shapeName",), f"{shape} is a flexible shape: set shapeConfigDetails "
                             "(ocpus and memoryInGBs) for it"))
    if spec.get("launchMode") == "perNode" and nodes > 1 and not spec.get("subnetId"):
        found.append(Problem(path + ("launchMode",), f"perNode runs {nodes} separate job runs, which reach "
                             "each other only on a subnet of yours: set subnetId (a subnet that allows traffic "
                             "between its hosts), or use launchMode: native"))
    return found


def _recovery(data: dict | None, elastic: Elastic | None) -> Recovery | None:
    """Runs recover when they ask to (``recovery``) or are elastic (membership rounds); else fail fast."""
    if data is None and elastic is None:
        return None
    data = data or {}
    restarts = data.get("maxRestarts", elastic.max_restarts if elastic else 0)
    return Recovery(restarts, tuple(data.get("retryOn") or ("lost",)), data.get("replacementWait", 30))


def build(data: dict, source: Path | None = None) -> Spec:
    """Turn data that passed the schema and :func:`problems` into a :class:`Spec`."""
    top = data["spec"]
    infra_data = top["infrastructure"]
    cluster_data = top["cluster"]["spec"]
    runtime_data = top["runtime"]["spec"]
    infra_spec = infra_data.get("spec") or {}
    name = _job_name(data)
    config = cluster_data.get("config") or {}
    main, worker = _groups(data)
    elastic_data = cluster_data.get("elastic")
    elastic = Elastic(elastic_data["minNodes"], elastic_data["maxNodes"],
                      elastic_data.get("maxRestarts", 0)) if elastic_data else None
    recovery = _recovery(cluster_data.get("recovery"), elastic)
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
        max_runtime=_seconds(cluster_data.get("maxRuntime")),
        recovery=recovery,
        hang_timeout=_seconds(cluster_data.get("hangTimeout")),
    )
    entry = runtime_data.get("module") or runtime_data["entryPoint"]
    kind = "module" if "module" in runtime_data else ("script" if entry.endswith(".py") else "executable")
    runtime = Runtime(
        entry_point=entry,
        args=tuple(as_text(a) for a in runtime_data.get("args") or ()) + tuple(_kwargs(runtime_data.get("kwargs"))),
        env=_env(runtime_data.get("env")),
        kind=kind,
    )
    base_dir = source.parent if source else Path.cwd()
    warnings = tuple(entry_point_problems(runtime, base_dir))
    return Spec(name=name, infra_type=infra_data["type"], infra=_infra(infra_data["type"], infra_spec, name),
                cluster=cluster, runtime=runtime, source=source, digest=digest(data), warnings=warnings, data=data)


MAX_DURATION_SECONDS = 30 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: int | str) -> int:
    """``3600``, ``"90m"``, ``"2h"`` -> seconds (schema-valid input)."""
    if isinstance(value, int):
        return value
    text = value.strip()
    return max(1, round(float(text[:-1]) * _UNITS[text[-1]]))


def _seconds(value: int | str | None) -> int | None:
    return None if value is None else parse_duration(value)


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
    if kind == "slurm":
        setup = spec.get("setup") or ""
        return SlurmInfra(
            partition=spec.get("partition"), account=spec.get("account"), qos=spec.get("qos"),
            reservation=spec.get("reservation"), constraint=spec.get("constraint"),
            time=None if spec.get("time") is None else str(spec["time"]),
            time_limit_notice=parse_duration(spec.get("timeLimitNotice", 120)), gpus_per_node=spec.get("gpusPerNode"),
            cpus_per_node=spec.get("cpusPerNode"), memory=None if spec.get("memory") is None else str(spec["memory"]),
            exclusive=bool(spec.get("exclusive", False)), python=spec.get("python"),
            sbatch_options=tuple(spec.get("sbatchOptions") or ()),
            setup=setup if isinstance(setup, str) else "\n".join(setup))
    if kind == "kubernetes":
        resources = spec.get("resources") or {}
        return KubernetesInfra(
            namespace=spec.get("namespace"), context=spec.get("context"), service_account=spec.get("serviceAccountName"),
            cpu=None if resources.get("cpu") is None else str(resources["cpu"]), memory=resources.get("memory"),
            gpus=resources.get("gpus"), extended=dict(resources.get("extended") or {}),
            node_selector=dict(spec.get("nodeSelector") or {}), tolerations=tuple(spec.get("tolerations") or ()),
            affinity=spec.get("affinity"), image_pull_secrets=tuple(spec.get("imagePullSecrets") or ()),
            priority_class=spec.get("priorityClassName"), labels=dict(spec.get("labels") or {}),
            annotations=dict(spec.get("annotations") or {}), queue_name=spec.get("queueName"),
            secrets=tuple(spec.get("secrets") or ()), volumes=tuple(spec.get("volumes") or ()),
            shm_size=spec.get("shmSize"), ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"))
    return LocalInfra(work_dir=spec.get("workDir"))


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(text: str) -> str:
    return _SAFE.sub("-", text).strip("-.").lower() or DEFAULT_NAME
