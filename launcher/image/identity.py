"""Which image "@image" is for a spec: what decides it (context, Dockerfile, build args) and whether the
recorded build still matches the code directory."""

from __future__ import annotations

from typing import Mapping

from launcher.image import records
from launcher.image.context import build_context
from launcher.plan import image_build
from launcher.spec.model import Spec
from launcher.workdirs import resolve_local, scheme


def local_paths_kept_out(spec: Spec) -> list[str]:
    """The run's local directories (work dir, outputs): data, never image content.

    Without a ``workDir`` the docker backend uses ``./work_dir`` beside the spec, whatever the
    spec's infrastructure says (``run --backend docker`` works on any spec), so it is always kept out.
    """
    from launcher.backends.docker.containers import DEFAULT_WORK_DIR

    wanted = [spec.cluster.work_dir or DEFAULT_WORK_DIR, spec.cluster.outputs_dir]
    return [resolve_local(url, spec.base_dir) for url in wanted if url and scheme(url) == "file"]


def build_args_of(spec: Spec, extra: Mapping[str, str]) -> dict[str, str]:
    return {**image_build(spec).build_args, **extra}


def current_identity(spec: Spec, extra_args: Mapping[str, str]) -> str:
    """The identity the image would have if it were built now (reads the whole code directory)."""
    context = build_context(spec.base_dir, keep_out=local_paths_kept_out(spec))
    context.archive.close()
    return context.identity(image_build(spec).dockerfile, build_args_of(spec, extra_args))


def stale_note(spec: Spec) -> str | None:
    """A warning when the code directory changed since `launcher build` made the recorded image."""
    record = records.load(spec.source)
    if record is None or record.identity == current_identity(spec, record.build_args):
        return None
    return (f"the code directory changed since {record.tag} was built: the nodes run the old code; "
            f"`launcher build -f {spec.source}` builds the current one")
