"""Writes the spec reference (from ``schemas/*.json``) and the CLI reference (from launcher's argparse parser)
into ``docs/reference/spec.md`` and ``docs/reference/cli.md``, which are committed so that the docs read as
Markdown (on GitHub, in an editor) link to them too; MkDocs reads them like any other page.

Run it after changing a schema or the parser: ``.venv/bin/python scripts/reference.py``. tests/test_docs.py
fails while the committed pages differ from what it writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
SCHEMA_DIR = REPO / "schemas"
PAGES_DIR = REPO / "docs" / "reference"
COMMAND = ".venv/bin/python scripts/reference.py"

Schema = dict[str, Any]


# ---------------------------------------------------------------- spec reference


def _resolve(node: Schema, root: Schema) -> Schema:
    """``node`` with a local ``$ref`` (``#/$defs/NAME``) replaced by its target, the node's own keywords winning."""
    ref = node.get("$ref")
    if ref is None:
        return node
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    merged = dict(_resolve(target, root))
    merged.update({key: value for key, value in node.items() if key != "$ref"})
    return merged


def _merged(node: Schema, root: Schema) -> Schema:
    """``node`` resolved, with the properties of its ``allOf`` members folded in (its own properties win)."""
    node = _resolve(node, root)
    properties: dict[str, Schema] = {}
    required: list[str] = []
    for member in node.get("allOf", []):
        member = _resolve(member, root)
        if "if" not in member:
            properties.update(member.get("properties", {}))
            required += member.get("required", [])
    for name, sub in node.get("properties", {}).items():
        properties[name] = {**properties[name], **sub} if name in properties else sub
    return {**node, "properties": properties, "required": required + node.get("required", [])}


def _value_text(node: Schema, root: Schema) -> str:
    """What values a property takes, in a few words: type, constants, ranges and patterns."""
    node = _resolve(node, root)
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " | ".join(f"`{json.dumps(value)}`" for value in node["enum"])
    if "anyOf" in node:
        return " or ".join(_value_text(option, root) for option in node["anyOf"])
    plain = [member for member in node.get("allOf", []) if "if" not in member]
    if "type" not in node and len(plain) == 1:  # a group that adds keywords to a shared definition
        return _value_text(plain[0], root)
    types = node.get("type", "")
    words = " or ".join(t for t in ([types] if isinstance(types, str) else types) if t != "null") or "any"
    low, high = node.get("minimum"), node.get("maximum")
    if "exclusiveMinimum" in node:
        low = f"more than {node['exclusiveMinimum']}, "
    if low is not None or high is not None:
        words += f" ({'' if low is None else low}..{'' if high is None else high})".replace(", ..", " up to ")
    if "pattern" in node:
        words += f", matching {_literal_code(node['pattern'])}"
    if node.get("type") == "array" or "items" in node and isinstance(node.get("items"), dict):
        items = node.get("items")
        if isinstance(items, dict) and "properties" not in _resolve(items, root):
            words += f" of {_value_text(items, root)}"
    return words


def _literal_code(text: str) -> str:
    """``text`` as inline code that Markdown leaves alone: a table cell cannot hold a ``|`` in a code span, and
    brackets, stars and backslashes of a regular expression would be read as links, emphasis and escapes."""
    return "<code>" + "".join(c if c.isalnum() or c == " " else f"&#{ord(c)};" for c in text) + "</code>"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _branches(node: Schema, root: Schema) -> Iterator[tuple[str, Schema]]:
    """The ``allOf: [{if: {properties: {KEY: {const: V}}}, then: ...}]`` members of ``node``, as (``KEY: V``, then)."""
    for member in _resolve(node, root).get("allOf", []):
        condition = member.get("if", {}).get("properties", {})
        for key, test in condition.items():
            if "const" in test and "then" in member:
                yield f"{key}: {test['const']}", member["then"]


def _sections(node: Schema, root: Schema, path: str, label: str = "") -> Iterator[str]:
    """One Markdown section per object in the schema that has properties, depth first, each a table."""
    node = _merged(node, root)
    properties = node["properties"]
    if not properties:
        return
    title = (f"`{path}`" if path else "Top level") + (f" ({label})" if label else "")
    lines = [f"## {title}", ""]
    if node.get("description"):
        lines += [node["description"], ""]
    lines += ["| key | required | value | meaning |", "|---|---|---|---|"]
    nested: list[tuple[Schema, str, str]] = []
    for name, sub in properties.items():
        resolved = _merged(sub, root)
        meaning = resolved.get("description", "")
        if resolved.get("x-error"):
            meaning += f" Must be: {resolved['x-error'].removeprefix('must be ')}."
        lines.append(f"| `{name}` | {'yes' if name in node['required'] else ''} | {_cell(_value_text(sub, root))} "
                     f"| {_cell(meaning)} |")
        if resolved["properties"]:
            nested.append((sub, _join(path, name), ""))
        items = resolved.get("items")
        if isinstance(items, dict) and _merged(items, root)["properties"]:
            nested.append((items, _join(path, name) + "[]", ""))
    for key_value, then in _branches(node, root):
        for name, sub in then.get("properties", {}).items():
            nested.append((sub, _join(path, name), key_value))
    yield "\n".join(lines) + "\n"
    for sub, sub_path, sub_label in nested:
        yield from _sections(sub, root, sub_path, sub_label)


def spec_reference(schema_dir: Path = SCHEMA_DIR) -> str:
    """The spec reference page: every key of every schema in ``schema_dir``, section by section."""
    parts = ["# Spec reference", "",
             f"Generated from the JSON schemas in `schemas/` by `{COMMAND}`; the schemas are what "
             "`launcher validate` checks, so this page says exactly what a spec may contain. How the keys work "
             "together is in [Writing a spec](../spec.md).", ""]
    for path in sorted(schema_dir.glob("*.json")):
        schema = json.loads(path.read_text())
        parts += [f"Schema `schemas/{path.name}`: {schema.get('title', '')}.", ""]
        parts += list(_sections(schema, schema, ""))
    return "\n".join(parts)


# ---------------------------------------------------------------- CLI reference


def _verbs(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order the parser lists them."""
    for action in parser._actions:  # argparse has no public way to list subcommands
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | meaning |", "|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        metavar = action.metavar or (action.dest.upper() if action.nargs != 0 else "")
        names = ", ".join(action.option_strings) or str(metavar)
        if action.option_strings and action.nargs != 0:
            names += f" {metavar}" if action.metavar or not action.choices else f" {{{','.join(action.choices)}}}"
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog} if action.help else ""
        if action.required and action.option_strings:
            help_text += " (required)"
        rows.append(f"| `{names}` | {_cell(help_text)} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().removeprefix("usage: ").split())


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The CLI reference page: the usage, help and every argument of ``launcher`` and each of its subcommands."""
    if parser is None:
        from launcher.cli import build_parser

        parser = build_parser()
    parts = ["# CLI reference", "",
             f"Generated from launcher's own argument parser (`launcher/cli.py`) by `{COMMAND}`. "
             "What the verbs do on a run is in [Getting started](../getting-started.md); exit statuses are "
             "under [Exit statuses](../getting-started.md#exit-statuses).", "",
             f"```\n{_usage(parser)}\n```", "", parser.description or "", "", *_options_table(parser), ""]
    verbs = list(_verbs(parser))
    parts += ["| command | what it does |", "|---|---|"]
    parts += [f"| [`{name}`](#launcher-{name}) | {_cell(help_text)} |" for name, help_text, _ in verbs]
    for name, help_text, sub in verbs:
        parts += ["", f"## launcher {name}", "", _cell(help_text), "", f"```\n{_usage(sub)}\n```", "",
                  *_options_table(sub)]
        if sub.epilog:
            parts += ["", sub.epilog]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- the pages


def pages() -> dict[Path, str]:
    """Each reference page's path and the text it should hold now."""
    return {PAGES_DIR / "spec.md": spec_reference(), PAGES_DIR / "cli.md": cli_reference()}


def main() -> None:
    sys.path.insert(0, str(REPO))  # this checkout's parser, whatever launcher the interpreter has installed
    PAGES_DIR.mkdir(exist_ok=True)
    for path, text in pages().items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        else:
            print(f"{path.relative_to(REPO)} is up to date")


if __name__ == "__main__":
    main()
