"""``launcher scale RUN --nodes N``: grow or shrink a running elastic run within minNodes..maxNodes.

What changes is asked through the work dir and the backend; the nodes carry it out in their membership
rounds (docs/protocol.md, "Scaling"): new nodes join at the next round, nodes asked to leave end theirs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from launcher import node_names
from launcher.backends import backend_for
from launcher.backends.base import Backend
from launcher.errors import EXIT_OK, BadInput
from launcher.protocol.control import CONTROL_PREFIX, SCALE, leave_key, request_leave
from launcher.protocol.events import scale_key
from launcher.protocol.rounds import latest_round
from launcher.protocol.store import WorkDir
from launcher.runs import state
from launcher.runs.state import RunInfo, resolve_run
from launcher.runs.view import RunView, open_run, read_view
from launcher.spec.model import Cluster, build
from launcher.wording import plural


@dataclass(frozen=True)
class Change:
    before: list[str]  # the nodes the run has now (running, not asked to leave), in rank order
    add: list[str]
    remove: list[str]


def scale(ref: str | None, nodes: int) -> int:
    info = resolve_run(ref)
    cluster = _cluster(info)
    elastic = cluster.elastic
    if elastic is None:
        raise BadInput(f"run {info.run_id} is not elastic: only a run with spec.cluster.spec.elastic "
                       f"(minNodes, maxNodes) can be scaled (its spec as run is in {info.path})")
    if not elastic.min_nodes <= nodes <= elastic.max_nodes:
        raise BadInput(f"--nodes {nodes} is outside run {info.run_id}'s minNodes..maxNodes "
                       f"({elastic.min_nodes}..{elastic.max_nodes}, spec.cluster.spec.elastic)")
    backend = backend_for(info.backend, "local")
    view = read_view(info, backend=backend)
    if view.ended:
        raise BadInput(f"run {info.run_id} has ended ({view.result}): only a running run can be scaled")
    problem = backend.scale_problem(info)
    if problem:
        raise BadInput(f"run {info.run_id} cannot be scaled: {problem}")
    run = open_run(info)
    change = plan_change(cluster.group_sizes, present_nodes(info, view, run), info.nodes, nodes)
    if not change.add and not change.remove:
        print(f"run {info.run_id} has {plural(nodes, 'node')} already ({', '.join(change.before)}); nothing to do")
        return EXIT_OK
    # The wish first, whole: whatever happens next, the work dir says what was asked for and when.
    at = time.time()
    wish = json.dumps({"nodes": nodes, "at": at, "from": change.before, "add": change.add,
                       "remove": change.remove}).encode()
    run.put(f"{CONTROL_PREFIX}/{SCALE}", wish)
    run.create(scale_key(at), wish)  # each request kept, for the timeline (scale.json holds only the latest)
    print(f"run {info.run_id}: {len(change.before)} -> {plural(nodes, 'node')}")
    for name in change.remove:
        request_leave(run, name, f"the run was scaled to {plural(nodes, 'node')}")
    if change.remove:
        print(f"asked {', '.join(change.remove)} to leave: they end their round, sync their outputs and stop "
              "(state left); the others go on from the newest checkpoint")
    if change.add:
        _add(backend, info, change.add)
        print(f"started {', '.join(change.add)}: they join at the next round; the members go on from the newest "
              "checkpoint with them")
    print(f"`launcher status {info.run_id}` shows the members once the next round has begun")
    return EXIT_OK


def present_nodes(info: RunInfo, view: RunView, run: WorkDir) -> list[str]:
    """The run's nodes that run now (as the backend sees them) and were not asked to leave."""
    listed = set(run.list(CONTROL_PREFIX))
    if view.fates:
        running = [name for name in info.nodes if view.fates.get(name) and view.fates[name].running]
    else:  # a backend that cannot tell which nodes run: the latest round's members
        latest = latest_round(run)
        running = latest.members if latest else []
    return [name for name in running if leave_key(name).split("/", 1)[1] not in listed]


def plan_change(groups: list[tuple[str, int]], present: list[str], taken: list[str], nodes: int) -> Change:
    """Who is added (worker names after every name in ``taken``) or asked to leave (the highest-numbered
    workers first, the main only if nothing else can go)."""
    before = node_names.rank_order(node_names.expand(groups), groups[-1][0], present)
    if nodes > len(before):
        return Change(before, node_names.added(groups, taken, nodes - len(before)), [])
    return Change(before, [], list(reversed(before))[:len(before) - nodes])


def _add(backend: Backend, info: RunInfo, names: list[str]) -> None:
    started = backend.scale(info, names)
    info.nodes = info.nodes + [name for name in started if name not in info.nodes]
    state.save(info)  # status, watch, cancel and clean read the run's nodes from here


def _cluster(info: RunInfo) -> Cluster:
    if not info.effective_spec:
        raise BadInput(f"run {info.run_id} is not recorded on this machine with its spec (opened from its work "
                       "dir): scale it from the machine that started it")
    return build(info.effective_spec).cluster
