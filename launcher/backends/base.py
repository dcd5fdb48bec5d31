"""The backend interface: plan -> request (pure, printable) -> schedule (side effects).

As in TorchX, ``submit = dryrun + schedule``: what ``--dry-run`` prints is the
very value :meth:`Backend.schedule` sends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

from launcher.errors import BackendError, BadInput
from launcher.plan import Plan, image_tag, make_plan
from launcher.runs.state import RunInfo
from launcher.spec.model import Spec


@dataclass(frozen=True)
class Request:
    """One call the backend makes: e.g. ``create_job``, ``create_job_run``, ``containers.create``, ``spawn``."""

    operation: str
    target: str
    body: dict[str, Any]


@dataclass(frozen=True)
class NodeFate:
    """A node as its backend sees it, independent of the work dir: running, or gone and how."""

    running: bool
    exit_code: int | None = None
    reason: str | None = None
    console_log: str | None = None  # where the node's own output went, for the user to read
    ended_at: float | None = None
    last_output: tuple[str, ...] = ()  # its last lines as the backend holds them (e.g. a cloud log service)
    never_started: bool = False  # gone before the backend ever gave it a machine (a job cancelled while it waited)


@dataclass(frozen=True)
class DryRun:
    backend: str
    plan: Plan
    requests: tuple[Request, ...]
    notes: tuple[str, ...] = field(default=())
    runs_images: bool = True  # False: the nodes run the code directory (local, Slurm): no image to build or name

    def to_dict(self) -> dict[str, Any]:
        image = self.plan.image if self.runs_images else None
        return {
            "backend": self.backend,
            "run_id": self.plan.run_id,
            "work_dir": self.plan.work_dir,
            "notes": list(self.notes),
            "image_build": None if image is None else {
                "context": image.context, "dockerfile": image.dockerfile, "build_args": dict(image.build_args),
                "tag": image.tag},
            "requests": [{"operation": r.operation, "target": r.target, "body": r.body} for r in self.requests],
            "nodes": [{"name": n.name, "image": n.image if self.runs_images else None, "command": list(n.command),
                       "env": dict(n.env)}
                      for n in self.plan.nodes],
            **({"overrides": list(self.plan.spec.overrides), "effective_spec": self.plan.spec.data}
               if self.plan.spec.overrides else {}),
        }


class Backend(ABC):
    name: str
    node_command: tuple[str, ...]

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        """The work dir the nodes will use, and notes to show the user about the choice."""
        if not spec.cluster.work_dir:
            raise BadInput(f"spec.cluster.spec.workDir is required for the {self.name} backend "
                           "(a directory, s3://bucket/prefix or oci://bucket@namespace/prefix)")
        return spec.cluster.work_dir, []

    def client_work_dir(self, plan: Plan) -> str:
        """The work dir as this machine reaches it (the nodes may see it elsewhere, e.g. mounted)."""
        return plan.work_dir

    def node_env_extra(self, spec: Spec) -> dict[str, str]:
        return {}

    one_machine = False  # whether all nodes run on one machine (their training processes share its cores)

    def _machine_env(self, spec: Spec) -> dict[str, str]:
        """How many nodes share each node's machine, where this backend knows (launcher.node.threads)."""
        from launcher.node.threads import MACHINE_NODES_VAR

        return {MACHINE_NODES_VAR: str(spec.cluster.node_count)} if self.one_machine else {}

    def built_image(self, spec: Spec) -> str | None:
        """What "@image" names: the image `launcher build` recorded for this spec file (None: not built)."""
        from launcher.image import records

        record = records.load(spec.source)
        return record.reference if record else None

    def node_devices(self, spec: Spec) -> tuple[list[dict[str, str]] | None, list[str]]:
        """Per-node env giving each node its devices (None: the nodes' own), and notes about it."""
        return None, []

    def plan(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> tuple[Plan, list[str]]:
        work_dir, notes = self.work_dir(spec)
        devices, device_notes = self.node_devices(spec)
        plan = make_plan(spec, work_dir=work_dir, node_command=self.node_command, run_id=run_id,
                         resume_from=resume_from, extra_env={**self.node_env_extra(spec), **self._machine_env(spec)},
                         node_extra_env=devices,
                         built_image=self.built_image(spec))
        notes = notes + device_notes + [f"warning: {warning}" for warning in spec.warnings]
        if plan.image and plan.image.tag == image_tag(spec) and self.runs_images:
            notes.append(f'"@image" has not been built for this spec yet: `launcher build -f {spec.source or "SPEC"}` '
                         "builds it")
        if spec.cluster.processes_per_node is None:
            notes.append("processesPerNode: auto is decided on each node (one training process per GPU it "
                         "sees, 1 without GPUs); WORLD_SIZE follows")
        return plan, notes

    def dryrun(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> DryRun:
        plan, notes = self.plan(spec, run_id=run_id, resume_from=resume_from)
        return DryRun(self.name, plan, tuple(self.requests(plan)), tuple(notes), self.runs_images)

    runs_images = True  # whether the nodes run in the image (the local backend runs the code directory)

    def check(self, dryrun: DryRun) -> list[str]:
        """Refuse, before anything starts, a request this backend cannot carry out (raise BadInput); return
        warnings about one it can (e.g. an image older than the code)."""
        return []

    def manifest(self, dryrun: DryRun) -> str | None:
        """The requests as a document the engine's own tool applies (Kubernetes: YAML for ``kubectl apply -f -``);
        None where there is none."""
        return None

    @abstractmethod
    def requests(self, plan: Plan) -> list[Request]:
        """The exact requests :meth:`schedule` will send for ``plan``. Pure: no I/O."""

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        """Send the requests; return backend facts for ``info.yaml`` (ids, process ids, ...)."""
        raise self._not_yet("run")

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        """What the backend itself knows of each node (running, or ended how); {} when it cannot tell."""
        return {}

    # How old an answer of the engine (a batch system's job states) may be when the backend gives it: a reader that
    # sees the run end looks again once that long after, so that the engine's own end of a job (a time limit) is
    # recorded before the run's result is said.
    engine_answer_seconds = 0.0

    def engine_state(self, info: RunInfo) -> str | None:
        """The engine's own one-line view of the run beside the work dir's (a batch job waiting and why); None
        where the backend has none to add."""
        return None

    def release(self, info: RunInfo, *, discard: bool = False) -> list[str]:
        """The run has ended (as `run`, `watch` or `cancel` saw it): free what the backend still holds for
        it, and with ``discard`` (``clean``) also what the run keeps on purpose; return what was freed."""
        return []

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        """Force-stop what is left after ``grace`` seconds (the cancel marker asked first); return what was forced."""
        raise self._not_yet("cancel")

    def scale_problem(self, info: RunInfo) -> str | None:
        """Why :meth:`scale` cannot start nodes in the running run ``info`` (None: it can). Asked before
        ``launcher scale`` records anything."""
        return (f"the {self.name} backend cannot scale a running run yet in this version (the local backend "
                "can)")

    def scale(self, info: RunInfo, add: Sequence[str]) -> list[str]:
        """Start the nodes ``add`` in the running elastic run ``info``: new names continuing the worker group's
        numbering (:func:`launcher.node_names.added`), each told the groups that include it
        (:func:`launcher.node_names.including`) and the env of the group's nodes. Each joins as a replacement
        does: it ends the latest round with a join and trains from the next. Return what was started, once it
        is recorded where :meth:`node_fates`, :meth:`stop` and :meth:`release` find it. Nodes that leave need
        nothing of the backend: they are asked through the work dir (``control/leave.{node}.json``) and exit
        on their own, ``left``."""
        raise BackendError(self.scale_problem(info) or f"the {self.name} backend cannot scale")

    def _not_yet(self, verb: str) -> Exception:
        return BackendError(f"the {self.name} backend cannot {verb} yet in this version (--dry-run works)")
