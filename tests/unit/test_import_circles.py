"""No import circle among the project's own modules (timeshare with its
workflows, activities and workers, and bench): a module never needs, even
through others, a module that needs it. Imports inside functions count (they
defer the circle to run time, they do not remove it); imports only for the
type checker do not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tree import MAPPED, modules_in

# Dotted name of each root -> its folder in the tree.
ROOTS = {"timeshare": "timeshare", **MAPPED, "bench": "bench"}
Graph = dict[str, set[str]]


def project_modules() -> dict[str, Path]:
    """Every module of the roots, by dotted name (a package by its __init__)."""
    return {
        name: path
        for dotted, folder in ROOTS.items()
        for name, path in modules_in(dotted, folder).items()
    }


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_by(module: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that ``module`` imports when it runs: ``from a
    import b`` is the module a.b where there is one, else a's own __init__."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: package.count(".") + 2 - node.level]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
        todo.extend(ast.iter_child_nodes(node))
    found.discard(module)
    return found


def import_graph() -> Graph:
    modules = project_modules()
    return {name: imported_by(name, path, set(modules)) for name, path in modules.items()}


def circles(graph: Graph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module
    (Tarjan's algorithm, iterative): each is at least one import circle."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = lowest[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    lowest[node] = min(lowest[node], index[step])
                continue
            work.pop()
            if work:
                lowest[work[-1][0]] = min(lowest[work[-1][0]], lowest[node])
            if lowest[node] == index[node]:
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


def test_the_project_has_no_import_circle() -> None:
    graph = import_graph()
    assert {"timeshare.workflows.group", "bench.__main__"} <= set(graph)
    assert "timeshare.integrations.turns" in graph["timeshare.integrations.coordinator"]
    assert circles(graph) == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    """The check above would fail on the circle it forbids, also one closed
    only by an import inside a function, and not on one closed only for the
    type checker."""
    graph = import_graph()
    graph["timeshare.integrations.turns"] = graph["timeshare.integrations.turns"] | {
        "timeshare.integrations.coordinator"
    }
    assert circles(graph) == [
        ["timeshare.integrations.coordinator", "timeshare.integrations.turns"]
    ]

    known = {"timeshare.a", "timeshare.b"}
    source = tmp_path / "a.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from timeshare.b import B\n"
        "def f():\n    from timeshare import b\n"
    )
    assert imported_by("timeshare.a", source, known) == {"timeshare.b"}
    source.write_text("import typing\nif typing.TYPE_CHECKING:\n    from timeshare.b import B\n")
    assert imported_by("timeshare.a", source, known) == set()
