"""Read YAML into plain data plus the line/column of every value, within fixed bounds.

PyYAML's own loaders silently keep the last of duplicate keys, expand aliases
without limit and report tabs with a cryptic message. This module composes the
node graph (which cannot grow larger than the text, since aliases are shared
nodes) and builds the data itself, so it can reject duplicate keys, charge
every alias expansion against a budget and remember where each value came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # spec files are small; 1 MiB is far beyond any real one
MAX_VALUES = 20_000  # values built, counting every alias expansion
MAX_DEPTH = 64

Path = tuple  # a path into the data: keys (str) and list indexes (int)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Located:
    """Parsed data plus positions: ``values[path]`` and ``keys[path]`` are 1-based (line, column)."""

    data: Any
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        """Best known position of ``path``: its key or value, else the nearest enclosing one."""
        table = self.keys if key else self.values
        while path:
            if path in table:
                return table[path]
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get((), (1, 1))


@dataclass
class YamlProblem:
    line: int
    column: int
    message: str
    path: Path = ()


class YamlProblems(Exception):
    def __init__(self, problems: list[YamlProblem]):
        self.problems = problems
        super().__init__("; ".join(p.message for p in problems))


def _pos(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _explain(exc: yaml.MarkedYAMLError, text: str) -> str:
    problem = exc.problem or str(exc)
    mark = exc.problem_mark
    if (mark is not None and text[mark.index: mark.index + 1] == "\t") or "'\\t'" in problem:
        return "tab character: YAML indentation must use spaces, not tabs"
    context = f" ({exc.context})" if exc.context else ""
    return f"invalid YAML: {problem}{context}"


def parse_text(text: str) -> Located:
    """Parse one YAML document; raise :class:`YamlProblems` listing everything wrong with it."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlProblems([YamlProblem(1, 1, f"file is larger than the {MAX_BYTES // 1024} KiB limit for spec files")])
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _pos(mark) if mark else (1, 1)
        raise YamlProblems([YamlProblem(line, col, _explain(exc, text))]) from None
    except yaml.YAMLError as exc:  # e.g. a reader error on control characters
        raise YamlProblems([YamlProblem(1, 1, f"invalid YAML: {exc}")]) from None
    if root is None:
        raise YamlProblems([YamlProblem(1, 1, "the file is empty")])
    builder = _Builder()
    data = builder.build(root, (), 0)
    if builder.problems:
        raise YamlProblems(builder.problems)
    return Located(data, builder.values, builder.keys)


class _Builder:
    def __init__(self) -> None:
        self.values: dict[Path, tuple[int, int]] = {}
        self.keys: dict[Path, tuple[int, int]] = {}
        self.problems: list[YamlProblem] = []
        self.budget = MAX_VALUES
        self._scalars = yaml.constructor.SafeConstructor()

    def _fail(self, node: yaml.Node, message: str, path: Path) -> None:
        line, col = _pos(node.start_mark)
        self.problems.append(YamlProblem(line, col, message, path))

    def build(self, node: yaml.Node, path: Path, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0:
            if self.budget == -1:
                self._fail(node, f"too many values (over {MAX_VALUES}, counting alias expansions): "
                           "refusing to expand what looks like an alias bomb", path)
            return None
        if depth > MAX_DEPTH:
            self._fail(node, f"nesting deeper than {MAX_DEPTH} levels", path)
            return None
        self.values.setdefault(path, _pos(node.start_mark))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        try:
            return self._scalars.construct_object(node)
        except yaml.constructor.ConstructorError as exc:
            self._fail(node, f"invalid value: {exc.problem}", path)
            return None

    def _mapping(self, node: yaml.MappingNode, path: Path, depth: int) -> dict:
        result: dict = {}
        first_seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                self._fail(key_node, "merge keys (<<) are not supported in spec files", path)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._fail(key_node, "mapping keys must be plain strings", path)
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in first_seen:
                self._fail(key_node, f"duplicate key '{key}' (first defined on line {first_seen[key]})", path + (key,))
                continue
            first_seen[key] = line
            self.keys[path + (key,)] = _pos(key_node.start_mark)
            result[key] = self.build(value_node, path + (key,), depth + 1)
        return result
