"""Command-line overrides of a spec: ``--set path=value``, ``--env K=V``, ``--nodes N``, ``-- ARGS``.

They are applied to the spec's data before validation, so an override is checked exactly like
the file; a problem in an overridden value is reported against the option, not a file line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.errors import BadInput
from launcher.secrets_mask import MASK, looks_secret, mask_argv

Path = tuple


@dataclass(frozen=True)
class Overrides:
    sets: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    nodes: int | None = None
    args: tuple[str, ...] | None = None  # None: keep the spec's args; () replaces them with none

    def __bool__(self) -> bool:
        return bool(self.sets or self.env or self.nodes is not None or self.args is not None)

    def as_options(self) -> list[str]:
        """The overrides as the user typed them, secret-looking values masked: for records and the dry-run."""
        options = [f"--set {_masked(item, item.partition('=')[0].rsplit('.', 1)[-1])}" for item in self.sets]
        options += [f"--env {_masked(item, item.partition('=')[0])}" for item in self.env]
        if self.nodes is not None:
            options.append(f"--nodes {self.nodes}")
        if self.args is not None:
            options.append(" ".join(["--", *mask_argv(list(self.args))]))
        return options


def _masked(item: str, name: str) -> str:
    key, equals, value = item.partition("=")
    return f"{key}={MASK}" if equals and value and looks_secret(name) else item


def apply(data: Any, overrides: Overrides) -> dict[Path, str]:
    """Change ``data`` in place; return which paths each option set (for error messages)."""
    if not isinstance(data, dict) or not overrides:
        return {}
    changed: dict[Path, str] = {}
    for item in overrides.sets:
        dotted, equals, raw = item.partition("=")
        if not equals or not dotted.strip():
            raise BadInput(f"--set {item!r}: use --set path.to.field=value, e.g. "
                           "--set spec.cluster.spec.worker.replicas=3")
        path = tuple(int(part) if part.isdigit() else part for part in dotted.strip().split("."))
        _put(data, path, _scalar(raw, f"--set {item}"), f"--set {item}")
        changed[path] = f"--set {item}"
    cluster: Path = ("spec", "cluster", "spec")
    for item in overrides.env:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise BadInput(f"--env {item!r}: use --env NAME=VALUE")
        config = _parent(data, cluster + ("config", "env"), f"--env {item}")
        env = config.get("env") or []
        if not isinstance(env, list):
            raise BadInput(f"--env {item}: spec.cluster.spec.config.env in the file is not a list")
        config["env"] = [entry for entry in env if not (isinstance(entry, dict) and entry.get("name") == name)]
        config["env"].append({"name": name, "value": value})
        changed[cluster + ("config", "env", len(config["env"]) - 1)] = f"--env {item}"
    if overrides.nodes is not None:  # the main group always has one node (the schema says so)
        _put(data, cluster + ("worker", "replicas"), overrides.nodes - 1, f"--nodes {overrides.nodes}")
        changed[cluster + ("worker", "replicas")] = f"--nodes {overrides.nodes} (main + workers)"
    if overrides.args is not None:
        _put(data, ("spec", "runtime", "spec", "args"), list(overrides.args), "-- ARGS")
        changed[("spec", "runtime", "spec", "args")] = " ".join(["--", *mask_argv(list(overrides.args))])
    return changed


def option_for(path: Path, changed: dict[Path, str]) -> str | None:
    """The option that set ``path`` or one of its parents."""
    for length in range(len(path), -1, -1):
        if path[:length] in changed:
            return changed[path[:length]]
    return None


def _scalar(raw: str, option: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise BadInput(f"{option}: the value is not valid YAML ({exc.problem if hasattr(exc, 'problem') else exc})") \
            from None


def _parent(data: dict, path: Path, option: str) -> Any:
    """The mapping or list that holds ``path``'s last part; missing or empty mappings are created."""
    node: Any = data
    for index, part in enumerate(path[:-1]):
        if isinstance(node, dict):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
        if not isinstance(node, (dict, list)):
            where = ".".join(str(p) for p in path[:index + 1])
            raise BadInput(f"{option}: {where} is not a mapping or list in the spec")
    return node


def _put(data: dict, path: Path, value: Any, option: str) -> None:
    parent = _parent(data, path, option)
    last = path[-1]
    if isinstance(parent, list) and not (isinstance(last, int) and last < len(parent)):
        raise BadInput(f"{option}: no item {last!r} in {'.'.join(str(p) for p in path[:-1])}")
    if isinstance(parent, dict) and not isinstance(last, str):
        last = str(last)
    parent[last] = value
