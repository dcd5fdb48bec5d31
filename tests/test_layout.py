"""The package's layout, from its source: no import cycles among launcher's modules (function-level and
type-checking imports included), the node program grouped by job, and the work-dir protocol independent of
both the node and the client."""

from __future__ import annotations

import ast
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"
MAX_NODE_MODULES = 15  # modules directly in launcher/node/; the rest sit in its subpackages by job
PROTOCOL = "launcher.protocol"
NOT_FOR_PROTOCOL = ("launcher.node", "launcher.runs", "launcher.backends", "launcher.commands")


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module under ``package_dir`` by its dotted name (a package by its own name)."""
    top = package_dir.parent
    modules = {}
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(top).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports anywhere in its source: at the top, inside functions,
    under ``if TYPE_CHECKING``. ``from P import x`` imports the module P.x where there is one, else P."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return {imported for imported in found if imported in modules and imported != name}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = module_names(package_dir)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            current, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[current] = min(low[current], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[current])
            if low[current] == index[current]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == current:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_text(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "; ".join(edges)


def test_no_import_cycles():
    graph = import_graph(LAUNCHER)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(cycle_text(component, graph) for component in found)


def test_node_keeps_its_jobs_in_subpackages():
    direct = sorted(path.name for path in (LAUNCHER / "node").glob("*.py"))
    assert len(direct) <= MAX_NODE_MODULES, f"{len(direct)} modules directly in launcher/node/: {direct}"


def test_protocol_imports_neither_side():
    graph = import_graph(LAUNCHER)
    reaching = {f"{name} -> {imported}" for name, imports in graph.items()
                if name == PROTOCOL or name.startswith(PROTOCOL + ".")
                for imported in imports if imported.startswith(tuple(p + "." for p in NOT_FOR_PROTOCOL))
                or imported in NOT_FOR_PROTOCOL}
    assert not reaching, "the protocol imports the node or the client:\n" + "\n".join(sorted(reaching))


def test_cycles_are_found_through_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def late():\n    from ..c import value\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nvalue = 1\n")
    (package / "d.py").write_text("from pkg import a\n")  # imports into the cycle, not part of it
    graph = import_graph(package)
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (package / "c.py").write_text("value = 1\n")
    assert cycles(import_graph(package)) == []
