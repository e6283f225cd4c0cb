"""The package layout's promises: no import cycle anywhere (type-only imports included: an arrow
drawn for the type checker is still an arrow) and a small `runtime/` top level. The layer and
forbidden-import contracts are import-linter's (`make lint`)."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "monitoring", "storage", "alerts", "dashboards")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: the graph is a few hundred nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_strongly_connected_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    built = grimp.build_graph(*PACKAGES, include_external_packages=False)
    graph = {m: set(built.find_modules_directly_imported_by(m)) for m in built.modules}
    assert strongly_connected(graph) == []


def test_runtime_top_level_is_packages() -> None:
    modules = sorted(p.name for p in (ROOT / "runtime").glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "config.py", "errors.py"]
