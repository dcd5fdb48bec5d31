"""Node names from the spec's groups: one rule, used by the plan (client) and the node bootstrap.

Nodes are told the groups (``[[name, replicas], ...]``), not the list of every name, so a
node's environment stays the same size whatever the cluster size. ``launcher scale`` adds nodes
to the last (worker) group, numbered after every name that group ever had: a node that left keeps
its records under its name, and a new one never takes them over.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def expand(groups: Sequence[tuple[str, int]]) -> list[str]:
    """``[("job-main", 1), ("job-worker", 2)]`` -> ``["job-main", "job-worker-0", "job-worker-1"]``.

    The first group is the main group: a single main node keeps its name as it is.
    """
    names: list[str] = []
    for index, (name, replicas) in enumerate(groups):
        if index == 0 and replicas == 1:
            names.append(name)
        else:
            names.extend(f"{name}-{i}" for i in range(replicas))
    return names


def duplicates(names: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return sorted({name for name in names if name in seen or seen.add(name)})



def number_in(group: str, name: str) -> int | None:
    """``n`` when ``name`` is ``{group}-{n}`` (n written as a plain number), else None."""
    tail = name[len(group) + 1:] if name.startswith(f"{group}-") else ""
    return int(tail) if tail.isdigit() and tail == str(int(tail)) else None


def added(groups: Sequence[tuple[str, int]], taken: Iterable[str], count: int) -> list[str]:
    """``count`` new names for the last group, numbered after its nodes and every name of it in ``taken``."""
    group = _growing(groups)
    numbers = [number_in(group, name) for name in (*expand(groups), *taken)]
    start = max((n for n in numbers if n is not None), default=-1) + 1
    return [f"{group}-{start + i}" for i in range(count)]


def including(groups: Sequence[tuple[str, int]], name: str) -> list[tuple[str, int]]:
    """The groups, the last grown just enough to hold ``name`` (a node ``launcher scale`` added): what that
    node is told, so that its name is checked against its groups like any other node's."""
    group = _growing(groups)
    number = number_in(group, name)
    if number is None:
        raise ValueError(f"{name!r} is no node of group {group!r}")
    *first, (_, replicas) = groups
    return [*first, (group, max(replicas, number + 1))]


def rank_order(order: Sequence[str], grows: str | None, names: Iterable[str]) -> list[str]:
    """``names`` that are nodes of the run, in rank order: the spec's nodes as ``order`` has them, then nodes
    added to the group ``grows`` by number; any other name is left out."""
    names = set(names)
    known = [name for name in order if name in names]
    extra = sorted((number, name) for name in names - set(order)
                   if grows and (number := number_in(grows, name)) is not None)
    return known + [name for _, name in extra]


def _growing(groups: Sequence[tuple[str, int]]) -> str:
    if len(groups) < 2:  # a single main group keeps its name as it is: it cannot take numbered nodes
        raise ValueError("only a worker group after the main group can grow")
    return groups[-1][0]
