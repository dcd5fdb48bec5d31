"""``launcher init``: write a spec, an example training script and the image artifacts, offline."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from launcher.errors import BadInput
from launcher.fileio import write_new_file
from launcher.resources import data_dir

FRAMEWORKS = ("pytorch",)


def files_for(framework: str, name: str) -> dict[str, bytes]:
    """Relative path -> content of every file ``init`` writes."""
    import jinja2

    templates = data_dir("templates") / framework
    artifacts = data_dir("artifacts") / framework / "v1"
    spec = jinja2.Template((templates / "train.yaml.j2").read_text(encoding="utf-8"), keep_trailing_newline=True)
    files = {
        "train.yaml": spec.render(name=name, workers=1).encode(),
        "train.py": (templates / "train.py").read_bytes(),
    }
    for item in sorted(artifacts.iterdir()):
        if item.is_file():
            files[f"artifacts/{framework}/v1/{item.name}"] = item.read_bytes()
    return files


def init(framework: str, directory: str, *, force: bool, name: str = "pytorch-ddp") -> int:
    if framework.lower() not in FRAMEWORKS:
        raise BadInput(f"framework '{framework}' is not supported yet; supported: {', '.join(FRAMEWORKS)}")
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise BadInput(f"--dir {target} is not a directory")
    files = files_for(framework.lower(), name)
    existing = [rel for rel in files if (target / rel).exists()]
    if existing and not force:
        raise BadInput(f"not overwriting existing files in {target} (use --force): {', '.join(existing)}")
    for rel, content in files.items():
        try:
            write_new_file(target / rel, content, force=True, mode=0o644)
        except OSError as exc:
            raise BadInput(f"cannot write {target / rel}: {exc.strerror or exc}") from None
        print(f"wrote {target / rel}")
    enter = "" if target.resolve() == Path.cwd().resolve() else f"cd {shlex.quote(str(target))} && "
    print(f"\nnext: {enter}launcher run -f train.yaml", file=sys.stderr)
    return 0
