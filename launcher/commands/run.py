"""``launcher run``: dry-run prints what ``schedule`` would send; a real run sends exactly that."""

from __future__ import annotations

import sys

from launcher import render
from launcher.backends import backend_for
from launcher.errors import BadInput
from launcher.runs.state import RUN_ID
from launcher.secrets_mask import mask
from launcher.spec import Overrides, load_spec
from launcher.wording import quoted


def run(file: str, *, backend: str | None, dry_run: bool, output: str, detach: bool, resume_from: str | None,
        run_id: str | None, verbose: bool, overrides: Overrides | None = None, keep: bool = False) -> int:
    if output != "text" and not dry_run:
        raise BadInput(f"--output {output} is for --dry-run; for a machine-readable view of a run use "
                       "launcher status RUN --json")
    if run_id is not None and not RUN_ID.fullmatch(run_id):
        raise BadInput(f"--run-id {quoted(run_id)}: use 1-100 letters, digits, '.', '_' or '-'")
    spec = load_spec(file, overrides)
    chosen = backend_for(backend, spec.infra_type)
    if output == "pytorchjob" and chosen.name != "kubernetes":
        raise BadInput(f"--output pytorchjob is the run as a Kubeflow PyTorchJob, from the kubernetes backend (this "
                       f"spec runs on {chosen.name}): add --backend kubernetes")
    if keep:
        if not hasattr(chosen, "keep"):
            raise BadInput(f"--keep is for the docker backend (its containers), not {chosen.name}")
        chosen.keep = True
    resume_url = None
    if resume_from:
        from launcher.runs.state import resolve_run

        # The earlier run's own work dir, from its record: it may differ from this spec's.
        resume_url = resolve_run(resume_from).run_url
        if not dry_run:
            from launcher.runs.preflight import resume_source

            resume_source(resume_url)
    request = chosen.dryrun(spec, run_id=run_id, resume_from=resume_url)
    if dry_run and output == "pytorchjob":  # an export of the run for Kubeflow's training operator
        notes, document = chosen.pytorchjob(request)
        sys.stdout.write("".join(f"# note: {note}\n" for note in notes) + document)
        return 0
    if dry_run:
        manifest = chosen.manifest(request) if output != "json" else None
        if manifest is not None:  # what the engine's own tool takes, the notes as its comments
            sys.stdout.write("".join(f"# note: {note}\n" for note in request.notes) if output == "text" else "")
            sys.stdout.write(manifest)
            return 0
        data = mask(request.to_dict())
        if output == "text":
            render.dryrun_text(data)
        else:
            render.dump(data, output)
        return 0
    from launcher.runs.submit import submit

    return submit(chosen, request, detach=detach, verbose=verbose, out=sys.stdout)
