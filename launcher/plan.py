"""Spec -> plan: the image build and one run config per node. Pure functions, no I/O.

:func:`node_env` is the whole contract between the client and the node
bootstrap (:mod:`launcher.node`); nothing else decides what a node is told.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from launcher.spec.model import BUILT_IMAGE, NodeGroup, Spec, processes_text, slug

DEFAULT_LOCAL_WORK_DIR = "~/.launcher/workdir"
IMAGE_ARTIFACTS = "artifacts/pytorch/v1"
IMAGE_CODE_DIR = "/code"


@dataclass(frozen=True)
class ImageBuild:
    """What ``docker build`` gets: context directory, Dockerfile (relative to it), build args, tag."""

    context: str
    dockerfile: str
    build_args: Mapping[str, str]
    tag: str


@dataclass(frozen=True)
class NodeConfig:
    name: str
    group: str  # "main" or "worker": the spec group the node came from, not its rank or role
    image: str
    env: Mapping[str, str]
    command: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    run_id: str
    spec: Spec
    work_dir: str
    image: ImageBuild | None  # None when every node uses an image named in the spec
    nodes: tuple[NodeConfig, ...]

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]


def new_run_id(spec: Spec, now: float | None = None) -> str:
    """Unique per submission and made by the client, so runs sharing a work dir never meet."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{slug(spec.name)[:40]}-{stamp}-{os.urandom(3).hex()}"


def image_tag(spec: Spec) -> str:
    return f"launcher/{slug(spec.name)}:{spec.digest}"


def resolve_image(spec: Spec, group: NodeGroup, built_image: str | None = None) -> str:
    """The group's image; "@image" is the image `launcher build` made (``built_image``), else its default tag."""
    image = group.image or spec.cluster.image or BUILT_IMAGE
    return (built_image or image_tag(spec)) if image == BUILT_IMAGE else image


def image_build(spec: Spec, tag: str | None = None) -> ImageBuild:
    return ImageBuild(context=str(spec.base_dir), dockerfile=f"{IMAGE_ARTIFACTS}/Dockerfile",
                      build_args={"CODE_DIR": "."}, tag=tag or image_tag(spec))


def node_env(spec: Spec, *, run_id: str, work_dir: str, node: str, group: NodeGroup,
             resume_from: str | None = None) -> dict[str, str]:
    """Every variable a node starts with: the user's env first, then launcher's own, which win.

    The rank variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) are not here: no node's
    rank is known before the nodes meet in the work dir; the bootstrap exports them.
    """
    cluster = spec.cluster
    env = {var.name: var.value for var in (*cluster.env, *group.env, *spec.runtime.env)}
    env.update({
        "LAUNCHER_RUN_ID": run_id,
        "LAUNCHER_WORK_DIR": work_dir,
        "LAUNCHER_NODE_NAME": node,
        "LAUNCHER_NODE_GROUPS": json.dumps(cluster.group_sizes),
        "LAUNCHER_NPROC_PER_NODE": processes_text(cluster.processes_per_node),
        "LAUNCHER_ENTRYPOINT": spec.runtime.entry_point,
        "LAUNCHER_ENTRY_KIND": spec.runtime.kind,
        "LAUNCHER_ARGS": json.dumps(list(spec.runtime.args), ensure_ascii=False),
        "LAUNCHER_START_OPTIONS": json.dumps(list(cluster.start_options), ensure_ascii=False),
        "LAUNCHER_RDZV_TIMEOUT": str(cluster.rendezvous_timeout),
        "LAUNCHER_MASTER_PORT": str(cluster.port),
        "LAUNCHER_OUTPUTS_SYNC_INTERVAL": str(cluster.outputs_sync_interval),
    })
    if cluster.recovery:
        node_count = cluster.node_count
        env["LAUNCHER_RECOVERY"] = json.dumps({
            "minNodes": cluster.elastic.min_nodes if cluster.elastic else node_count,
            **({"maxNodes": cluster.elastic.max_nodes} if cluster.elastic else {}),  # only elastic runs change size
            "maxRestarts": cluster.recovery.max_restarts, "retryOn": list(cluster.recovery.retry_on),
            "replacementWait": cluster.recovery.replacement_wait})
    if cluster.max_runtime:
        env["LAUNCHER_MAX_RUNTIME"] = str(cluster.max_runtime)
    if cluster.hang_timeout:
        env["LAUNCHER_HANG_TIMEOUT"] = str(cluster.hang_timeout)
    if cluster.outputs_dir:
        env["LAUNCHER_OUTPUTS_DIR"] = cluster.outputs_dir
    if resume_from:
        env["LAUNCHER_RESUME_FROM"] = resume_from
    return env


def make_plan(spec: Spec, *, work_dir: str, node_command: Sequence[str], run_id: str | None = None,
              resume_from: str | None = None, extra_env: Mapping[str, str] | None = None,
              node_extra_env: Sequence[Mapping[str, str]] | None = None, built_image: str | None = None) -> Plan:
    """Build the plan. ``extra_env`` holds backend facts for every node (e.g. the local backend's
    loopback address), ``node_extra_env`` per node (e.g. the GPUs each local node may use),
    ``built_image`` what "@image" stands for."""
    run_id = run_id or new_run_id(spec)
    names = spec.cluster.node_names
    groups = [spec.cluster.main] * spec.cluster.main.replicas + [spec.cluster.worker] * spec.cluster.worker.replicas
    nodes = []
    for name, group in zip(names, groups):
        env = node_env(spec, run_id=run_id, work_dir=work_dir, node=name, group=group, resume_from=resume_from)
        env.update(extra_env or {})
        env.update(node_extra_env[len(nodes)] if node_extra_env else {})
        nodes.append(NodeConfig(name=name, group="main" if group is spec.cluster.main else "worker",
                                image=resolve_image(spec, group, built_image), env=env, command=tuple(node_command)))
    built = built_image or image_tag(spec)
    build = image_build(spec, built) if any(node.image == built for node in nodes) else None
    return Plan(run_id=run_id, spec=spec, work_dir=work_dir, image=build, nodes=tuple(nodes))
