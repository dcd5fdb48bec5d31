"""Label and field selectors as the API takes them in ``labelSelector`` and ``fieldSelector``.

Labels: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors (equality-based
``=``, ``==``, ``!=``; set-based ``in``, ``notin``, ``key``, ``!key``; requirements joined by commas, all must hold).
Fields: https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/ (``=``, ``==``, ``!=`` on
a field's path, e.g. ``metadata.name``, ``status.phase``, ``involvedObject.name``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

Match = Callable[[dict[str, Any]], bool]


def _requirements(text: str) -> list[str]:
    """Split on the commas that are not inside a set's parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [part for part in parts + [current.strip()] if part]


def labels(text: str | None) -> Match:
    tests: list[Match] = []
    for requirement in _requirements(text or ""):
        tests.append(_label_requirement(requirement))
    return lambda body: all(test(body.get("metadata", {}).get("labels") or {}) for test in tests)


def _label_requirement(text: str) -> Callable[[dict[str, str]], bool]:
    if found := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", text):
        key, operator, values = found.group(1), found.group(2), {v.strip() for v in found.group(3).split(",")}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if found := re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", text):
        key, operator, value = found.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        return lambda labels: text[1:] not in labels
    return lambda labels: text in labels


def fields(text: str | None) -> Match:
    tests: list[Match] = []
    for requirement in _requirements(text or ""):
        found = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", requirement)
        if found is None:
            raise ValueError(f"invalid field selector {requirement!r}")
        path, operator, value = found.groups()
        tests.append(_field_requirement(path.split("."), operator == "!=", value))
    return lambda body: all(test(body) for test in tests)


def _field_requirement(path: list[str], negated: bool, value: str) -> Match:
    def test(body: dict[str, Any]) -> bool:
        here: Any = body
        for part in path:
            here = here.get(part) if isinstance(here, dict) else None
        return (str(here if here is not None else "") == value) != negated

    return test
