"""A recovering run's membership rounds as the client's verbs show them (``status`` and ``top``): the current
round, its members, the restarts used (a whole-run retry's included) and why each earlier round ended."""

from __future__ import annotations

from typing import Any

from launcher.protocol.rounds import latest_round
from launcher.runs import attempts
from launcher.runs.state import RunInfo
from launcher.runs.view import open_run
from launcher.wording import plural


def run_rounds(info: RunInfo) -> dict[str, Any] | None:
    """A recovering run's current membership round, restarts and why each earlier round ended; None for a run
    without rounds (a static run) or before its first round was decided."""
    latest = latest_round(open_run(info))
    if latest is None:
        return None
    before = int((info.backend_ids.get(attempts.CURRENT) or {}).get("restarts") or 0)  # its rounds count from 0
    return {"round": latest.number, "members": latest.members, "restarts": before + latest.restarts,
            "history": list(latest.history), "give_up": latest.give_up}


def rounds_text(rounds: dict[str, Any]) -> str:
    """``round 2, 1 restart``."""
    return f"round {rounds['round']}, {plural(rounds['restarts'], 'restart')}"
