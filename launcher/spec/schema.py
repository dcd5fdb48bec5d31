"""Validate spec data against ``schemas/distributed.schema.json`` and word every problem for people.

Each problem becomes ``(path, key?, message)``; :mod:`launcher.spec.load` adds file positions.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

from launcher.resources import data_dir
from launcher.spec.conforms import TYPES, Unsure, conforms

UNSUPPORTED_FRAMEWORKS = ("dask", "horovod", "tensorflow", "ray")
SUPPORTED_FRAMEWORKS = ("pytorch",)


@dataclass(frozen=True)
class Problem:
    path: tuple
    message: str
    at_key: bool = False  # point at the key (unknown keys) rather than the value
    reads: tuple = ()  # a cross-field problem's other values: an option that set one of them is named too


def format_path(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


@lru_cache(maxsize=1)
def load_schema() -> dict:
    with open(data_dir("schemas") / "distributed.schema.json", encoding="utf-8") as handle:
        return json.load(handle)


@lru_cache(maxsize=1)
def jsonschema_validator() -> Any:
    import jsonschema  # imported here: only validation needs it

    # JSON Schema counts 1.0 as an integer and lets NaN pass every bound: launcher's own types instead.
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({
        name: lambda _checker, value, test=TYPES[name]: test(value) for name in ("integer", "number")})
    strict = jsonschema.validators.extend(base, type_checker=checker)
    # The schema itself is checked against the metaschema by the test suite, not on every start (60 ms).
    return strict(load_schema())


def check(data: Any) -> list[Problem]:
    """Every problem in ``data``, in document order of their paths."""
    framework = _unsupported_framework(data)
    if framework:
        return [framework]
    if _conforms(data):
        return []
    errors = list(jsonschema_validator().iter_errors(data))
    problems: list[Problem] = []
    for index, error in enumerate(errors):
        if not _said_otherwise(index, errors):
            problems.extend(_describe(error))
    return list(dict.fromkeys(problems))


_VALUE_RULES = ("type", "minimum", "maximum", "exclusiveMinimum", "minLength")


def _said_otherwise(index: int, errors: list) -> bool:
    """One message per value that breaks several rules: its own schema's (the main group's replicas: exactly 1),
    not also the wider one it extends through allOf (a node group's 0 to 1023), which would disagree; and of its
    own schema's rules the first (an integer's type, not also its bound)."""
    def rank(position: int) -> tuple[int, int]:
        return list(errors[position].absolute_schema_path).count("allOf"), position

    error = errors[index]
    return error.validator in _VALUE_RULES and any(
        other.validator in _VALUE_RULES and other.absolute_path == error.absolute_path and rank(position) < rank(index)
        for position, other in enumerate(errors))


def _conforms(data: Any) -> bool:
    """The quick check (no jsonschema import) for the common case, a valid spec."""
    try:
        return conforms(data, load_schema())
    except Unsure:
        return False


def _unsupported_framework(data: Any) -> Problem | None:
    try:
        kind = data["spec"]["cluster"]["kind"]
    except (TypeError, KeyError):
        return None
    if isinstance(kind, str) and kind.lower() in UNSUPPORTED_FRAMEWORKS:
        return Problem(("spec", "cluster", "kind"),
                       f"framework '{kind}' is not supported yet; supported: {', '.join(SUPPORTED_FRAMEWORKS)}")
    return None


def _describe(error: Any) -> Iterator[Problem]:
    path = tuple(error.absolute_path)
    schema = error.schema
    kind = error.validator
    if kind == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        for key in sorted(set(error.instance) - set(allowed)):
            yield Problem(path + (key,), _unknown_key(str(key), allowed), at_key=True)
    elif kind == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        for name in missing:
            yield Problem(path, f"missing required key '{name}'")
    elif kind in _VALUE_RULES:
        got = _type_name(error.instance) if kind == "type" else repr(error.instance)
        yield Problem(path, f"must be {expected(schema)} (got {got})")
    elif kind in ("enum", "const"):
        options = error.validator_value if kind == "enum" else [error.validator_value]
        yield Problem(path, _not_one_of(error.instance, options))
    elif "x-error" in schema:
        yield Problem(path, f"{schema['x-error']} (got {error.instance!r})")
    else:
        yield Problem(path, error.message)


def _unknown_key(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if not close:
        lowered = {name.lower(): name for name in allowed}
        close = [lowered[key.lower()]] if key.lower() in lowered else []
    if close:
        return f"unknown key '{key}'; did you mean '{close[0]}'?"
    return f"unknown key '{key}'; allowed here: {', '.join(allowed) or 'nothing'}"


def _not_one_of(value: Any, options: list) -> str:
    if len(options) == 1:
        message = f"must be {options[0]!r}"
    else:
        message = f"must be one of {', '.join(repr(o) for o in options)}"
    close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close and close[0] != str(value) else ""
    return f"{message} (got {value!r}){hint}"


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "array": "a list", "object": "a mapping", "null": "empty"}


def expected(schema: dict) -> str:
    """Describe what a schema accepts, e.g. ``an integer >= 0`` or ``a non-empty string``."""
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    words = " or ".join(_TYPE_WORDS.get(t, t) for t in types if t != "null") or "a value"
    if schema.get("minLength") == 1 and types == ["string"]:
        return "a non-empty string"
    bounds = []
    if "minimum" in schema and "maximum" in schema and schema["minimum"] == schema["maximum"]:
        return f"{words} equal to {schema['minimum']}"
    if "minimum" in schema and "maximum" in schema:
        return f"{words} from {schema['minimum']} to {schema['maximum']}"
    if "minimum" in schema:
        bounds.append(f">= {schema['minimum']}")
    if "exclusiveMinimum" in schema:
        bounds.append(f"> {schema['exclusiveMinimum']}")
    if "maximum" in schema:
        bounds.append(f"<= {schema['maximum']}")
    return " ".join([words, " and ".join(bounds)]).strip()


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}" if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
