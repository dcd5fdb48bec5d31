"""``launcher build``: the node image of a spec, built (and pushed) by the Docker engine, with progress."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from launcher.errors import BackendError, BadInput
from launcher.plan import image_build
from launcher.spec import load_spec
from launcher.spec.model import Spec, slug


LARGE_CONTEXT_BYTES = 500 << 20


def parse_build_args(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise BadInput(f"--build-arg {pair!r}: expected NAME=VALUE")
        result[name] = value
    return result


def build(file: str, *, tag: str | None, push: bool, build_args: list[str], no_cache: bool, verbose: bool,
          out: TextIO = sys.stdout, spec: Spec | None = None) -> int:
    """Build ``file``'s node image; ``spec``: that file as already loaded (with a command's overrides applied)."""
    from launcher.dockerengine import api_error_text, connect
    from launcher.image import records
    from launcher.image.context import build_context
    from launcher.image.identity import build_args_of, local_paths_kept_out
    from launcher.image.progress import BuildProgress, PushProgress

    spec = spec or load_spec(file)
    extra_args = parse_build_args(build_args)
    started = time.monotonic()
    context = build_context(spec.base_dir, keep_out=local_paths_kept_out(spec))
    dockerfile = image_build(spec).dockerfile
    build_args = build_args_of(spec, extra_args)
    identity = context.identity(dockerfile, build_args)
    tag = tag or f"launcher/{slug(spec.name)}:{identity[:12]}"
    client = connect()
    kept_out = f"; kept out: {', '.join(context.excluded)}" if context.excluded else ""
    out.write(f"building {tag} from {spec.base_dir} ({context.files} files, {context.size / 2**20:.1f} MiB"
              f"{kept_out})\n")
    if context.withheld:
        out.write(f"note: never sent, whatever .dockerignore says: {', '.join(context.withheld)}\n")
    if context.size > LARGE_CONTEXT_BYTES:
        out.write(f"note: the build context is {context.size / 2**20:.0f} MiB: every byte goes into the image; "
                  "keep data sets and checkpoints out with a .dockerignore\n")
    progress = BuildProgress(out, verbose)
    import docker.errors

    try:
        for chunk in client.api.build(fileobj=context.archive, custom_context=True, dockerfile=dockerfile,
                                      tag=tag, buildargs=build_args, nocache=no_cache,
                                      rm=True, forcerm=True, decode=True):
            progress.feed(chunk)
    except docker.errors.APIError as exc:
        progress.error = api_error_text(exc)
    finally:
        progress.finish()
        context.archive.close()
    if progress.error:
        raise BackendError(progress.failure())
    image = client.images.get(tag)
    spec_file = spec.source or spec.base_dir / "train.yaml"
    record = records.save(spec_file, tag, image.id, identity, extra_args)
    total, _ = progress.steps
    out.write(f"built {tag} ({image.short_id}) in {time.monotonic() - started:.1f} s; "
              f"{progress.cached} of {total} steps from cache\n")
    if push:
        pushing = PushProgress(out)
        out.write(f"pushing {tag}\n")
        try:
            for chunk in client.api.push(tag, stream=True, decode=True):
                pushing.feed(chunk)
        except docker.errors.APIError as exc:
            pushing.error = api_error_text(exc)
        finally:
            pushing.finish()
        if pushing.error or not pushing.digest:
            raise BackendError(f"push of {tag} refused: {pushing.error or 'the registry returned no digest'} "
                               "(the image is built and recorded, not pushed)")
        repository = tag.rsplit(":", 1)[0] if ":" in tag.rsplit("/", 1)[-1] else tag
        record = records.save(spec_file, tag, image.id, identity, extra_args,
                              pushed=f"{repository}@{pushing.digest}")
        out.write(f"pushed {record.pushed}\n")
    out.write(f'"@image" in {file} now means {record.reference}\n')
    return 0
