"""Load a spec file: read it within bounds, parse, validate, build typed objects.

All problems are reported at once as ``FILE:LINE:COL: path: message`` in a :class:`SpecError`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from launcher.errors import BadInput, SpecError
from launcher.spec import model, schema, yamlsafe
from launcher.spec.overrides import Overrides, option_for, options_touching
from launcher.spec.overrides import apply as apply_overrides


def load_spec(path: str | os.PathLike, overrides: Overrides | None = None) -> model.Spec:
    """The spec in ``path`` with command-line ``overrides`` applied, validated as one."""
    file = Path(path)
    text = _read(file)
    label = str(path)
    try:
        located = yamlsafe.parse_text(text)
    except yamlsafe.YamlProblems as exc:
        raise SpecError([f"{label}:{p.line}:{p.column}: {schema.format_path(p.path) + ': ' if p.path else ''}"
                         f"{p.message}" for p in exc.problems]) from None
    return spec_from_located(located, label, file.resolve(), overrides)


def spec_from_located(located: yamlsafe.Located, label: str, source: Path | None,
                      overrides: Overrides | None = None) -> model.Spec:
    if not isinstance(located.data, dict):
        raise SpecError([f"{label}:1:1: the top level must be a mapping with kind, apiVersion and spec"])
    changed = apply_overrides(located.data, overrides) if overrides else {}
    problems = schema.check(located.data)
    problems += model.problems(located.data, (problem.path for problem in problems))
    if not problems:
        spec = model.build(located.data, source)
        return dataclasses.replace(spec, overrides=tuple(overrides.as_options(spec.data))) if overrides else spec
    lines = []
    for problem in problems:
        option = option_for(problem.path, changed)
        if option:  # an overridden value: point at the option, not at a line it replaced
            lines.append((0, 0, f"{option}: {schema.format_path(problem.path)}: {problem.message}"))
            continue
        line, col = located.where(problem.path, key=problem.at_key)
        given = options_touching(problem.reads, changed)  # the file's value, at odds with an option's
        also = f"; given {', '.join(given)}" if given else ""
        lines.append((line, col, f"{label}:{line}:{col}: {schema.format_path(problem.path)}: {problem.message}{also}"))
    raise SpecError([text for _, _, text in sorted(lines, key=lambda item: item[:2])])


def _read(file: Path) -> str:
    try:
        size = file.stat().st_size
        if size > yamlsafe.MAX_BYTES:
            raise BadInput(f"{file}: file is {size / 2**20:.1f} MiB; spec files are limited to "
                           f"{yamlsafe.MAX_BYTES // 1024} KiB")
        with open(file, "rb") as handle:
            raw = handle.read(yamlsafe.MAX_BYTES + 1)
    except FileNotFoundError:
        raise BadInput(f"{file}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{file}: is a directory, not a spec file") from None
    except PermissionError:
        raise BadInput(f"{file}: permission denied") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BadInput(f"{file}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
