"""Command-line overrides of a spec: ``--set path=value``, ``--env K=V``, ``--nodes N``, ``-- ARGS``.

They are applied to the spec's data before validation, so an override is checked exactly like
the file; a problem in an overridden value is reported against the option, not a file line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from launcher.errors import BadInput
from launcher.secrets_mask import MASK, looks_secret, mask, mask_argv
from launcher.spec.model import CLUSTER, RUNTIME, DataPath
from launcher.spec.schema import format_path
from launcher.wording import plural

_KEY = r"[^.\[\]]+"
_PATH = re.compile(rf"{_KEY}(?:\[[0-9]+\])*(?:\.{_KEY}(?:\[[0-9]+\])*)*")
_PART = re.compile(rf"({_KEY})|\[([0-9]+)\]")
_INDEX = re.compile("[0-9]+")


@dataclass(frozen=True)
class Overrides:
    sets: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    nodes: int | None = None
    args: tuple[str, ...] | None = None  # None: keep the spec's args; () replaces them with none

    def __bool__(self) -> bool:
        return bool(self.sets or self.env or self.nodes is not None or self.args is not None)

    def as_options(self, effective: dict) -> list[str]:
        """The overrides as the user typed them, for records and the dry-run, with every value masked that
        the masked ``effective`` spec hides (``--set ...env[0].value=X`` where that entry is DB_PASSWORD)."""
        shown = mask(effective)
        options = [f"--set {_masked_set(item, effective, shown)}" for item in self.sets]
        options += [f"--env {_masked(item, looks_secret(item.partition('=')[0]))}" for item in self.env]
        if self.nodes is not None:
            options.append(f"--nodes {self.nodes}")
        if self.args is not None:
            options.append(" ".join(["--", *mask_argv(list(self.args))]))
        return options


def _masked(item: str, hide: bool) -> str:
    key, equals, value = item.partition("=")
    return f"{key}={MASK}" if equals and value and hide else item


def _masked_set(item: str, effective: dict, shown: dict) -> str:
    path = parse_path(item.partition("=")[0].strip())
    return _masked(item, looks_secret(str(path[-1])) or _lookup(effective, path) != _lookup(shown, path))


def _lookup(data: Any, path: DataPath) -> Any:
    """The value at ``path``, or None where a later option removed it."""
    for part in path:
        try:
            data = data[str(part) if isinstance(data, dict) else part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def apply(data: Any, overrides: Overrides) -> dict[DataPath, str]:
    """Change ``data`` in place; return the option that set (or created) each path, for error messages."""
    if not isinstance(data, dict) or not overrides:
        return {}
    changed: dict[DataPath, str] = {}
    for item in overrides.sets:
        _apply_set(data, item, changed)
    for item in overrides.env:
        _apply_env(data, item, changed)
    if overrides.nodes is not None:  # the main group always has one node (the schema says so)
        _put(data, CLUSTER + ("worker", "replicas"), overrides.nodes - 1,
             f"--nodes {overrides.nodes} (main + workers)", changed)
    if overrides.args is not None:  # the command line replaces the spec's whole command line
        runtime = _put(data, RUNTIME + ("args",), list(overrides.args),
                       " ".join(["--", *mask_argv(list(overrides.args))]), changed)
        runtime.pop("kwargs", None)
    return {_as_text(path): option for path, option in changed.items()}


def parse_path(dotted: str) -> DataPath:
    """``spec.runtime.spec.env[0].value`` or ``spec.runtime.spec.env.0.value`` -> (..., "env", 0, "value")."""
    if not _PATH.fullmatch(dotted):
        raise ValueError(dotted)
    parts: list[str | int] = []
    for key, index in _PART.findall(dotted):
        number = index or (key if _INDEX.fullmatch(key) else "")
        parts.append(int(number) if number else key)
    return tuple(parts)


def _apply_set(data: dict, item: str, changed: dict[DataPath, str]) -> None:
    dotted, equals, raw = item.partition("=")
    option = f"--set {item}"
    if not equals or not dotted.strip():
        raise BadInput(f"--set {item!r}: use --set path.to.field=value, e.g. "
                       "--set spec.cluster.spec.worker.replicas=3")
    try:
        path = parse_path(dotted.strip())
    except ValueError:
        raise BadInput(f"{option}: '{dotted.strip()}' is not a path: join keys with '.' and pick list items by "
                       "number, e.g. spec.runtime.spec.env[0].value (or env.0.value)") from None
    _put(data, path, _scalar(raw, option), option, changed)


def _apply_env(data: dict, item: str, changed: dict[DataPath, str]) -> None:
    name, equals, value = item.partition("=")
    option = f"--env {item}"
    if not equals or not name:
        raise BadInput(f"--env {item!r}: use --env NAME=VALUE")
    config = _parent(data, CLUSTER + ("config", "env"), option, changed)
    env = config.get("env") or []
    if not isinstance(env, list):
        raise BadInput(f"{option}: spec.cluster.spec.config.env in the file is not a list")
    config["env"] = [entry for entry in env if not (isinstance(entry, dict) and entry.get("name") == name)]
    config["env"].append({"name": name, "value": value})
    changed[CLUSTER + ("config", "env", len(config["env"]) - 1)] = option


def option_for(path: DataPath, changed: dict[DataPath, str]) -> str | None:
    """The option that set ``path`` or one of its parents (in what :func:`apply` returned)."""
    path = _as_text(path)
    for length in range(len(path), -1, -1):
        if path[:length] in changed:
            return changed[path[:length]]
    return None


def options_touching(paths: Iterable[DataPath], changed: dict[DataPath, str]) -> list[str]:
    """The options that set a value at, above or under any of ``paths``, in the order given."""
    paths = [_as_text(path) for path in paths]
    options = [option for done, option in changed.items()
               if any(done[:len(path)] == path or path[:len(done)] == done for path in paths)]
    return list(dict.fromkeys(options))


def _as_text(path: DataPath) -> DataPath:
    """Paths compared as text: ``--set ...kwargs.1=x`` sets the mapping key '1', which the schema names so."""
    return tuple(str(part) for part in path)


def _scalar(raw: str, option: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise BadInput(f"{option}: the value is not valid YAML ({exc.problem if hasattr(exc, 'problem') else exc})") \
            from None


def _parent(data: dict, path: DataPath, option: str, changed: dict[DataPath, str]) -> Any:
    """The mapping or list that holds ``path``'s last part; missing or empty mappings are created
    and recorded as ``option``'s, so a problem inside them (an unknown key) is reported against it."""
    node: Any = data
    for index, part in enumerate(path[:-1]):
        child = _child(node, part, path[:index], option)
        if child is None and isinstance(node, dict):
            child = node[str(part)] = {}
            changed[path[:index + 1]] = option
        if not isinstance(child, (dict, list)):
            raise BadInput(f"{option}: {format_path(path[:index + 1])} is not a mapping or list in the spec")
        node = child
    return node


def _child(node: dict | list, part: str | int, where: DataPath, option: str) -> Any:
    """``node[part]``: None when a mapping lacks it; an error for a list item that is not there."""
    if isinstance(node, dict):
        return node.get(str(part))
    if not isinstance(part, int):
        raise BadInput(f"{option}: {format_path(where)} is a list: pick an item by number, "
                       f"e.g. {format_path(where + (0,))}")
    if part >= len(node):
        raise BadInput(f"{option}: {format_path(where)} has {plural(len(node), 'item')}; there is no item [{part}]")
    return node[part]


def _put(data: dict, path: DataPath, value: Any, option: str, changed: dict[DataPath, str]) -> Any:
    """Set ``path`` to ``value``; return the mapping or list that now holds it."""
    parent = _parent(data, path, option, changed)
    last = path[-1]
    if isinstance(parent, list):
        _child(parent, last, path[:-1], option)  # the item must exist: --set changes items, it adds none
    else:
        last = str(last)
    parent[last] = value
    changed[path] = option
    return parent
