"""``launcher compose``: the docker backend's containers as a docker-compose file, recorded as a run.

The file names images only; compose never builds. A node image from ``"@image"`` is built here
first when the code changed since `launcher build` (or was never built), so ``up`` runs the
current code. Writing the file records the run like ``run`` does, so ``status``, ``watch``,
``cancel`` and ``clean`` see it once ``docker-compose up`` starts it. The spec's command-line
overrides (``--set``, ``--env``, ``--nodes``, ``-- ARGS``) are ``run``'s, applied as it applies them
(``load_spec``): a spec can be composed for a local test (``--set spec.cluster.spec.workDir=./wd``)
without editing the file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from launcher import render
from launcher.backends import backend_for
from launcher.backends.docker.containers import unreachable_s3_endpoint
from launcher.compose import compose_document, compose_header
from launcher.errors import BadInput
from launcher.fileio import write_new_file
from launcher.gpus import node_gpu_shares
from launcher.runs import state
from launcher.runs.preflight import check_work_dir
from launcher.runs.submit import new_run_info
from launcher.spec import Overrides, load_spec
from launcher.spec.model import Spec
from launcher.wording import plural


def ensure_current_image(spec: Spec, file: str) -> None:
    """Build the spec's "@image" when no build is recorded or the code changed since (progress on stderr); the
    image is built for ``spec`` as given (overrides applied: a local work dir they name is kept out of it)."""
    from launcher.commands.build import build
    from launcher.image import records
    from launcher.image.identity import current_identity

    record = records.load(spec.source)
    if record is not None and record.identity == current_identity(spec, record.build_args):
        return
    why = "has not been built" if record is None else "is older than the code"
    print(f"note: \"@image\" {why}: building it first", file=sys.stderr)
    args = [f"{name}={value}" for name, value in (record.build_args if record else {}).items()]
    build(file, tag=None, push=False, build_args=args, no_cache=False, verbose=False, out=sys.stderr, spec=spec)


def write_compose(file: str, output: str, *, force: bool, overrides: Overrides | None = None) -> int:
    spec = load_spec(file, overrides)
    if output != "-" and Path(output).exists() and not force:
        raise BadInput(f"{output} exists; use --force to overwrite it")
    backend = backend_for("docker", spec.infra_type)
    plan, notes = backend.plan(spec)
    if plan.image and plan.image.tag in {node.image for node in plan.nodes}:
        ensure_current_image(spec, file)
        plan, notes = backend.plan(spec)
    problem = unreachable_s3_endpoint(plan, os.environ)
    if problem:
        raise BadInput(problem)
    shares, _ = node_gpu_shares(spec)
    text = compose_header(plan.run_id, plan.spec.overrides) + render.to_yaml(compose_document(plan, shares, os.environ))
    info = new_run_info(backend, plan)
    info.backend_ids = {"compose": "-" if output == "-" else str(Path(output).resolve())}
    check_work_dir(info.work_dir, plan.run_id, {"run_id": plan.run_id, "backend": "compose",
                                                "nodes": len(plan.nodes), "created_at": info.created_at})
    state.save(info)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if output == "-":
        sys.stdout.write(text)
    else:
        write_new_file(output, text, force=True)
        print(f"wrote {output} ({plural(len(plan.nodes), 'service')}) for run {plan.run_id}\n"
              f"start it:  docker-compose -f {output} up --abort-on-container-exit\n"
              f"follow it: launcher watch {plan.run_id}\n"
              f"after it:  docker-compose -f {output} down", file=sys.stderr)
    return 0
