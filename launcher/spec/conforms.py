"""A quick yes/no check of spec data against the schema, so that a valid spec never imports jsonschema.

Importing jsonschema (with referencing, attrs and its format checkers) took longer than all the rest
of a dry-run. This module evaluates the keywords the spec schema uses, with jsonschema's semantics
and launcher's types (:data:`TYPES`); it knows no messages. A keyword it does not know raises
:class:`Unsure`, so a new keyword in the schema can only send specs the slow way, never let one
through. :mod:`launcher.spec.schema` asks jsonschema whenever the answer is not a plain yes.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

# Schema words that constrain nothing; "then" and "else" are evaluated by "if".
_INERT = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples",
                    "x-error", "then", "else"})


class Unsure(Exception):
    """The schema uses a keyword this module does not evaluate."""


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_integer(value) or isinstance(value, float) and math.isfinite(value)


# A node can use neither 1.0 as a count nor NaN as a size: "integer" is a YAML integer, "number" a finite one.
TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": _is_integer,
    "number": _is_number,
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "array": lambda value: isinstance(value, list),
    "object": lambda value: isinstance(value, dict),
    "null": lambda value: value is None,
}


def conforms(instance: Any, root: dict) -> bool:
    """Whether ``instance`` is valid under the schema ``root``; :class:`Unsure` for an unknown keyword."""
    return _valid(instance, root, root)


def _valid(instance: Any, schema: dict, root: dict) -> bool:
    for keyword, value in schema.items():
        if keyword in _INERT:
            continue
        rule = _KEYWORDS.get(keyword)
        if rule is None:
            raise Unsure(keyword)
        if not rule(instance, value, schema, root):
            return False
    return True


def _type(instance: Any, types: str | list, _schema: dict, _root: dict) -> bool:
    return any(TYPES[name](instance) for name in ([types] if isinstance(types, str) else types))


def _unbool(value: Any) -> Any:
    return ("bool", value) if isinstance(value, bool) else value


def _equal(one: Any, two: Any) -> bool:
    """jsonschema's equality: true is not 1, 1 is 1.0, lists and mappings compare item by item."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return one == two
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_equal(a, b) for a, b in zip(one, two))
    if isinstance(one, dict) and isinstance(two, dict):
        return one.keys() == two.keys() and all(_equal(one[key], two[key]) for key in one)
    return _unbool(one) == _unbool(two)


def _properties(instance: Any, properties: dict, _schema: dict, root: dict) -> bool:
    return not isinstance(instance, dict) or all(
        _valid(instance[name], sub, root) for name, sub in properties.items() if name in instance)


def _additional(instance: Any, extra: bool | dict, schema: dict, root: dict) -> bool:
    if "patternProperties" in schema:
        raise Unsure("patternProperties")
    if not isinstance(instance, dict) or extra is True:
        return True
    extras = [name for name in instance if name not in schema.get("properties", {})]
    return not extras if extra is False else all(_valid(instance[name], extra, root) for name in extras)


def _items(instance: Any, items: dict, schema: dict, root: dict) -> bool:
    if "prefixItems" in schema or not isinstance(items, dict):
        raise Unsure("prefixItems or boolean items")
    return not isinstance(instance, list) or all(_valid(item, items, root) for item in instance)


def _if(instance: Any, condition: dict, schema: dict, root: dict) -> bool:
    branch = schema.get("then" if _valid(instance, condition, root) else "else")
    return branch is None or _valid(instance, branch, root)


def _ref(instance: Any, ref: str, _schema: dict, root: dict) -> bool:
    if not ref.startswith("#/"):
        raise Unsure(f"$ref {ref}")
    target: Any = root
    for part in ref[2:].split("/"):
        target = target[part.replace("~1", "/").replace("~0", "~")]
    return _valid(instance, target, root)


def _on(kind: str, test: Callable[[Any, Any], bool]) -> Callable[[Any, Any, dict, dict], bool]:
    """A keyword that constrains only instances of one type, as JSON Schema's assertions do."""
    return lambda instance, value, _schema, _root: not TYPES[kind](instance) or test(instance, value)


_KEYWORDS: dict[str, Callable[[Any, Any, dict, dict], bool]] = {
    "type": _type,
    "enum": lambda instance, options, _s, _r: any(_equal(option, instance) for option in options),
    "const": lambda instance, value, _s, _r: _equal(instance, value),
    "pattern": _on("string", lambda text, pattern: re.search(pattern, text) is not None),
    "minLength": _on("string", lambda text, least: len(text) >= least),
    "minimum": _on("number", lambda number, least: number >= least),
    "maximum": _on("number", lambda number, most: number <= most),
    "exclusiveMinimum": _on("number", lambda number, bound: number > bound),
    "minItems": _on("array", lambda items, least: len(items) >= least),
    "required": _on("object", lambda mapping, names: all(name in mapping for name in names)),
    "properties": _properties,
    "additionalProperties": _additional,
    "items": _items,
    "allOf": lambda instance, subs, _s, root: all(_valid(instance, sub, root) for sub in subs),
    "anyOf": lambda instance, subs, _s, root: any(_valid(instance, sub, root) for sub in subs),
    "not": lambda instance, sub, _s, root: not _valid(instance, sub, root),
    "if": _if,
    "$ref": _ref,
}
