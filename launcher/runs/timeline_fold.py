"""A large run's timeline folded to a screen (issue 41): above :data:`FOLD_ABOVE` nodes, the nodes that stand out
(the main, every node that ended otherwise than most or was lost, replaced or asked to leave, the slowest to start and
the slowest to finish) keep a lane of their own and the rest are folded into groups that show, per state, its spread
over the group's nodes. 1,024 lanes are no picture anyone reads; one node that failed among them must still be seen.

Nothing is dropped: every node is in exactly one lane or one fold, and a fold names its nodes. :func:`lanes` is pure.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from statistics import median

from launcher.protocol import events as node_events
from launcher.runs import timeline as tl

FOLD_ABOVE = 32  # nodes: a run of more is folded (the picture then has at most SHOWN_AT_MOST + a few folds' lanes)
SHOWN_AT_MOST = 24  # nodes drawn on their own in a folded run; standouts beyond are folded by why they stand out
MAIN, SLOWEST_START, SLOWEST_FINISH = "main", "slowest to start", "slowest to finish"
NO_STATUS = "no final status"
ODD_PHASES = (tl.DEATH, tl.JOINS, tl.LEAVE_ASKED, tl.LEAVES)  # a node with one of these stands out


@dataclass(frozen=True)
class Spread:
    """One state over a fold's nodes: each node's first start and last end in it, earliest, median and latest."""

    state: str
    nodes: int  # how many of the fold's nodes were ever in the state
    starts: tuple[float, float, float]
    ends: tuple[float, float, float]


@dataclass(frozen=True)
class Fold:
    nodes: list[str]  # in rank order
    why: str  # "" for the nodes that do not stand out; else what the standouts folded here share
    spreads: list[Spread]  # in the order of tl.STATES


@dataclass(frozen=True)
class Lanes:
    shown: dict[str, str]  # node -> why it has a lane of its own ("" when the run is not folded), in rank order
    folds: list[Fold]

    @property
    def folded(self) -> bool:
        return bool(self.folds)


def lanes(timeline: tl.Timeline, spans: list[tl.Segment], all_nodes: bool = False) -> Lanes:
    """Which nodes keep a lane and how the rest fold: every node on its own up to FOLD_ABOVE nodes (or asked)."""
    if all_nodes or len(timeline.nodes) <= FOLD_ABOVE:
        return Lanes({node: "" for node in timeline.nodes}, [])
    reasons = standouts(timeline, spans)
    first = [node for node, why in reasons.items() if set(why) & {MAIN, SLOWEST_START, SLOWEST_FINISH}]
    chosen = set(first + [node for node in reasons if node not in first][:SHOWN_AT_MOST - len(first)])
    groups: dict[str, list[str]] = {"": [node for node in timeline.nodes if node not in reasons]}
    for node, why in reasons.items():
        if node not in chosen:  # a standout beyond the screen: folded with those that stand out alike
            groups.setdefault(why[0], []).append(node)
    by_node = _by_node(spans)
    folds = [Fold(nodes, why, spreads(nodes, by_node)) for why, nodes in groups.items() if nodes]
    return Lanes({node: "; ".join(reasons[node]) for node in timeline.nodes if node in chosen}, folds)


def standouts(timeline: tl.Timeline, spans: list[tl.Segment]) -> dict[str, list[str]]:
    """Node -> why it stands out, in rank order: the main, the nodes that ended otherwise than most (or were lost,
    replaced, asked to leave), the last to reach training (where none trained: to register) and the last to end."""
    reasons: dict[str, list[str]] = {node: [] for node in timeline.nodes}
    reasons[_main(timeline)].append(MAIN)
    for node, why in _different(timeline).items():
        reasons[node].append(why)
    by_node = _by_node(spans)
    for why, milestone in ((SLOWEST_START, _reached_training(by_node)), (SLOWEST_FINISH, _finished(by_node))):
        if milestone:
            reasons[max(milestone, key=lambda node: milestone[node])].append(why)
    return {node: why for node, why in reasons.items() if why}


def _main(timeline: tl.Timeline) -> str:
    """The node that learned node rank 0, else the first lane (the spec's main comes first)."""
    return next((event.node for event in timeline.events if event.phase == node_events.DECIDED and event.rank == 0
                 and event.node in timeline.nodes), timeline.nodes[0])


def _different(timeline: tl.Timeline) -> dict[str, str]:
    """Nodes whose final state is not the most common one (``lost``, ``failed``, no final status), then those that
    died, were replaced, asked to join or to leave: why, by the first that applies."""
    final: dict[str, str] = {}
    odd: dict[str, str] = {}
    for event in timeline.events:
        if event.node is None:
            continue
        if event.phase == tl.RECORDED:
            final[event.node] = event.detail.split(" ")[0]
        elif event.phase in ODD_PHASES:
            odd.setdefault(event.node, event.label)
        elif event.incarnation > 0:
            odd.setdefault(event.node, "replaced")
    ended = {node: final.get(node, NO_STATUS) for node in timeline.nodes}
    usual = Counter(ended.values()).most_common(1)[0][0]
    found = {node: state for node, state in ended.items() if state != usual}
    return {node: found.get(node) or odd[node] for node in timeline.nodes if node in found or node in odd}


def _by_node(spans: list[tl.Segment]) -> dict[str, list[tl.Segment]]:
    grouped: dict[str, list[tl.Segment]] = {}
    for span in spans:
        grouped.setdefault(span.node, []).append(span)
    return grouped


def _reached_training(by_node: dict[str, list[tl.Segment]]) -> dict[str, float]:
    """Per node, when it first trained; where no node trained, when it registered (began waiting)."""
    for state in (tl.TRAINING, tl.WAITING):
        reached = {node: min(span.start for span in mine if span.state == state)
                   for node, mine in by_node.items() if any(span.state == state for span in mine)}
        if reached:
            return reached
    return {}


def _finished(by_node: dict[str, list[tl.Segment]]) -> dict[str, float]:
    return {node: max(span.end for span in mine) for node, mine in by_node.items() if mine}


def spreads(nodes: list[str], by_node: dict[str, list[tl.Segment]]) -> list[Spread]:
    """Each state's spread over ``nodes``: of each node's first start and last end in it."""
    found = []
    for state in tl.STATES:
        starts, ends = [], []
        for node in nodes:
            mine = [span for span in by_node.get(node, []) if span.state == state]
            if mine:
                starts.append(min(span.start for span in mine))
                ends.append(max(span.end for span in mine))
        if starts:
            found.append(Spread(state, len(starts), _three(starts), _three(ends)))
    return found


def _three(values: list[float]) -> tuple[float, float, float]:
    return min(values), median(values), max(values)


def named(nodes: list[str]) -> str:
    """``node-1 to node-56, node-58 to node-1023``: names that differ only by a number in a row, as ranges."""
    runs: list[list[str]] = []
    previous: tuple[str, int] | None = None
    for node in nodes:
        match = re.fullmatch(r"(.*?)(\d+)", node)
        key = (match.group(1), int(match.group(2))) if match else None
        if runs and key and previous and key == (previous[0], previous[1] + 1):
            runs[-1].append(node)
        else:
            runs.append([node])
        previous = key
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]} to {run[-1]}" for run in runs)
