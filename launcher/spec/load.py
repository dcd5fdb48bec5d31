"""Load a spec file: read it within bounds, parse, validate, build typed objects.

All problems are reported at once as ``FILE:LINE:COL: path: message`` in a :class:`SpecError`.
"""

from __future__ import annotations

import os
from pathlib import Path

from launcher.errors import BadInput, SpecError
from launcher.spec import model, schema, yamlsafe


def load_spec(path: str | os.PathLike) -> model.Spec:
    file = Path(path)
    text = _read(file)
    label = str(path)
    try:
        located = yamlsafe.parse_text(text)
    except yamlsafe.YamlProblems as exc:
        raise SpecError([f"{label}:{p.line}:{p.column}: {schema.format_path(p.path) + ': ' if p.path else ''}"
                         f"{p.message}" for p in exc.problems]) from None
    return spec_from_located(located, label, file.resolve())


def spec_from_located(located: yamlsafe.Located, label: str, source: Path | None) -> model.Spec:
    if not isinstance(located.data, dict):
        raise SpecError([f"{label}:1:1: the top level must be a mapping with kind, apiVersion and spec"])
    problems = schema.check(located.data)
    if not problems:
        spec, problems = model.build(located.data, source)
        if not problems:
            return spec
    lines = []
    for problem in problems:
        line, col = located.where(problem.path, key=problem.at_key)
        lines.append((line, col, f"{label}:{line}:{col}: {schema.format_path(problem.path)}: {problem.message}"))
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
