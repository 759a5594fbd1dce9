"""The layout a reader relies on: the scheduling core and placement import
nothing of Temporal and no node or process code, and no hand-written source
file is over 600 lines. Read from the sources (imports, line counts), so a
new import or a grown file fails here before review."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

CORE = ["timeshare/scheduling", "timeshare/placement"]
# Where the symlinked packages live in the tree.
LINKED = {"timeshare.workflows": "workflows", "timeshare.activities": "activities",
          "timeshare.workers": "workers"}  # fmt: skip
NODE_AND_PROCESS_CODE = ("timeshare.activities", "timeshare.workers", "timeshare.workflows")
# The node's co-residency planning, plain data in and a decision out: the
# placement advisor's device model follows the node's switch with it. What it
# imports is walked like the rest (no Temporal, no other node code).
PURE_NODE_CODE = {"timeshare.activities.residency"}
LONGEST_LINES = 600
# Written by tools, not by hand.
GENERATED = ("timeshare/v1/",)


def module_file(module: str) -> Path | None:
    """The source file of a timeshare module (a package's __init__), if there is one."""
    parts = module.split(".")
    for dotted, folder in LINKED.items():
        if module == dotted or module.startswith(dotted + "."):
            parts = [folder, *module.removeprefix(dotted).strip(".").split(".")]
            parts = [part for part in parts if part]
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path) -> set[str]:
    """Every module the file imports, at any depth of the file (also the ones
    imported only for type checking, which a reader still follows)."""
    found: set[str] = set()
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {
                f"{base}.{alias.name}"
                for alias in node.names
                if module_file(f"{base}.{alias.name}")
            }
    return found


def closure(start: list[Path]) -> set[str]:
    """The modules reached from ``start`` by following timeshare's own imports."""
    seen: set[str] = set()
    todo = list(start)
    visited: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in visited:
            continue
        visited.add(path)
        for module in imports_of(path):
            seen.add(module)
            if module.split(".")[0] == "timeshare":
                source = module_file(module)
                if source is not None:
                    todo.append(source)
    return seen


def test_the_core_and_placement_import_no_temporal_and_no_node_or_process_code() -> None:
    sources = [path for folder in CORE for path in sorted((REPO / folder).glob("*.py"))]
    assert len(sources) > 10
    reached = closure(sources)
    assert "timeshare.models" in reached  # the walk follows imports
    temporal = sorted(m for m in reached if m.split(".")[0] == "temporalio")
    assert temporal == []
    node = sorted(
        m for m in reached if m.startswith(NODE_AND_PROCESS_CODE) and m not in PURE_NODE_CODE
    )
    assert node == []


def test_the_pure_node_code_placement_follows_imports_no_node_or_process_code() -> None:
    (residency,) = [module_file(module) for module in PURE_NODE_CODE]
    assert residency is not None
    reached = closure([residency])
    assert not [m for m in reached if m.split(".")[0] == "temporalio"]
    assert not [m for m in reached if m.startswith(NODE_AND_PROCESS_CODE)]
    assert "timeshare.scheduling" not in {".".join(m.split(".")[:2]) for m in reached}


def test_placement_reaches_the_scheduling_core_only_through_its_door() -> None:
    """The placement advisor feeds GroupCore.handle events, as the group
    workflow does: it drives no lock queue of its own."""
    sources = sorted((REPO / "timeshare" / "placement").glob("*.py"))
    imported = {module for path in sources for module in imports_of(path)}
    assert "timeshare.scheduling.group_core" in imported  # the walk reads them
    assert not [m for m in imported if m.startswith("timeshare.scheduling.queue")]
    assert not [path.name for path in sources if "LockQueue" in path.read_text()]


def test_the_walk_sees_an_import_of_node_code() -> None:
    """The check above would catch the import it forbids."""
    reached = closure([REPO / "workers" / "agent" / "serve.py"])
    assert "temporalio.client" in reached
    assert "timeshare.activities.backends.base" in reached


def test_no_hand_written_source_file_is_over_600_lines() -> None:
    tracked = [
        path
        for path in REPO.rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(REPO).parts)
        and not path.is_symlink()
        and not str(path.relative_to(REPO)).startswith(GENERATED)
        and "site-packages" not in path.parts
        and not path.relative_to(REPO).parts[0].endswith(".egg-info")
    ]
    long = {
        str(path.relative_to(REPO)): lines
        for path in tracked
        if (lines := len(path.read_text().splitlines())) > LONGEST_LINES
    }
    assert long == {}
