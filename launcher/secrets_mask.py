"""Mask secret values before anything is printed. Applied to output only, never to what is sent."""

from __future__ import annotations

import json
import re
from typing import Any

MASK = "********"
_SECRET_NAME = re.compile(
    r"(PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|CREDENTIAL|PRIVATE|(^|_)AUTH|(^|_)KEY$|API_?KEY|ACCESS_?KEY)",
    re.IGNORECASE,
)


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


# Env variables that carry a command line as a JSON list (see launcher.plan.node_env).
ARGV_VARIABLES = ("LAUNCHER_ARGS", "LAUNCHER_START_OPTIONS")
# Spec fields that hold a command line as a list (runtime args, torchrun start options).
ARGV_FIELDS = ("args", "startOptions")
# Fields that hold shell text: a batch script, a Slurm spec's setup lines
SCRIPT_FIELDS = ("script", "setup")


def mask_argv(tokens: list[str]) -> list[str]:
    """``--hf-token X`` and ``--password=X`` with their values masked; other tokens as they are."""
    masked: list[str] = []
    hide_next = False
    for token in tokens:
        if hide_next:
            masked.append(MASK)
            hide_next = False
            continue
        name, equals, _ = token.partition("=")
        secret_option = token.startswith("-") and looks_secret(name.lstrip("-").replace("-", "_"))
        if secret_option and equals:
            masked.append(f"{name}={MASK}")
        else:
            masked.append(token)
            hide_next = secret_option
    return masked


def _mask_argv_json(text: Any) -> Any:
    try:
        tokens = json.loads(text)
    except (TypeError, ValueError):
        return text
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return text
    return json.dumps(mask_argv(tokens), ensure_ascii=False)


# NAME=VALUE in a shell script (``export NAME=VALUE``, ``--main-env NAME=VALUE``), the value as shlex quotes it
_SHELL_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=('(?:[^']|'\"'\"')*'|\"(?:[^\"\\]|\\.)*\"|[^\s']+)")


def mask_script(text: str) -> str:
    """A shell script with the values of its secret-looking assignments masked."""
    return _SHELL_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={MASK}" if looks_secret(m.group(1)) else m.group(0), text)


def mask(value: Any) -> Any:
    """A copy of ``value`` in which every mapping entry whose key looks secret has its value masked,
    and so has every value that follows a secret-looking option in a command line."""
    if isinstance(value, dict):
        if isinstance(value.get("name"), str) and "value" in value and looks_secret(value["name"]):
            return {**value, "value": MASK}  # an env list entry: {name: HF_TOKEN, value: ...}
        masked = {}
        for key, item in value.items():
            if isinstance(key, str) and looks_secret(key) and item not in ("", None):
                masked[key] = MASK
            elif key in ARGV_VARIABLES:
                masked[key] = _mask_argv_json(item)
            elif key in ARGV_FIELDS and isinstance(item, list):
                masked[key] = mask_argv([str(token) for token in item])
            elif key in SCRIPT_FIELDS and isinstance(item, str):  # shell (slurm's batch script, setup): its exports
                masked[key] = mask_script(item)
            elif key in SCRIPT_FIELDS and isinstance(item, list):
                masked[key] = [mask_script(line) if isinstance(line, str) else line for line in item]
            else:
                masked[key] = mask(item)
        return masked
    if isinstance(value, list):
        return [mask(item) for item in value]
    return value
