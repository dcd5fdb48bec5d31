"""Node names from the spec's groups: one rule, used by the plan (client) and the node bootstrap.

Nodes are told the groups (``[[name, replicas], ...]``), not the list of every name, so a
node's environment stays the same size whatever the cluster size.
"""

from __future__ import annotations

from typing import Sequence


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

