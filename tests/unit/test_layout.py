"""The layout a reader relies on: the scheduling core, the node's core and
placement import nothing of Temporal and no node or process code, no hand-written source
file is over 600 lines, the benchmarks stay under 4,500 lines in all, git
holds no symbolic link, and pyproject.toml
installs every package of the tree. Read from the sources (imports, line
counts, git's index), so a new import, a grown file or a link fails here
before review."""

from __future__ import annotations

import ast
import struct
import tomllib
from pathlib import Path

from tests.conftest import REPO
from tests.tree import MAPPED, module_source

# The pure cores (a group's, a node's: timeshare/node, whose co-residency
# planning the placement advisor's device model follows too) and placement.
CORE = ["timeshare/scheduling", "timeshare/placement", "timeshare/node"]
NODE_AND_PROCESS_CODE = ("timeshare.activities", "timeshare.workers", "timeshare.workflows")
LONGEST_LINES = 600
# The benchmarks in proportion to what they measure: a new one reuses bench.parts.
# (4500 until the chaos run's faults beyond kills: links, machine loss, host
# memory, clock skew, stuck groups; 5200 until bench scale counted a
# hand-over's cost to Temporal by kind; 5400 until it split a hand-over's
# store requests by building block, each measured on the run's own server;
# 5500 until bench handover timed its floor in blocks between its own, hop
# by hop.)
BENCH_LINES = 5600
# Written by tools, not by hand.
GENERATED = ("timeshare/v1/",)


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
                if module_source(f"{base}.{alias.name}")
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
                source = module_source(module)
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
    node = sorted(m for m in reached if m.startswith(NODE_AND_PROCESS_CODE))
    assert node == []
    assert "timeshare.node.room" in reached and "asyncio" not in reached


def test_placement_reaches_the_scheduling_core_only_through_its_door() -> None:
    """The placement advisor feeds GroupCore.handle events, as the group
    workflow does: it drives no lock queue of its own."""
    sources = sorted((REPO / "timeshare" / "placement").glob("*.py"))
    imported = {module for path in sources for module in imports_of(path)}
    assert "timeshare.scheduling.group_core" in imported  # the walk reads them
    assert not [path.name for path in sources if "LockQueue" in path.read_text()]


def test_the_product_has_one_door_to_the_scheduling_core() -> None:
    """LockQueue (the core's functions as methods) serves unit tests alone:
    no product module uses it, so every decision comes through GroupCore."""
    product = [p for top in ("timeshare", *MAPPED.values()) for p in (REPO / top).rglob("*.py")]
    assert product
    assert not [p.name for p in product if "LockQueue" in p.read_text()]


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


def git_index_modes(index: Path | None = None) -> dict[str, int]:
    """Each path in git's index with its mode, read from the index file (a
    unit test starts no `git`): format versions 2, 3 and 4."""
    if index is None:
        git = REPO / ".git"
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = Path(git.read_text().split(":", 1)[1].strip())
        index = git / "index"
    data = index.read_bytes()
    signature, version, count = struct.unpack(">4sII", data[:12])
    assert signature == b"DIRC" and version in (2, 3, 4), version
    modes: dict[str, int] = {}
    offset, path = 12, b""
    for _ in range(count):
        start = offset
        mode = struct.unpack(">I", data[offset + 24 : offset + 28])[0]
        flags = struct.unpack(">H", data[offset + 60 : offset + 62])[0]
        offset += 62 + (2 if flags & 0x4000 else 0)
        if version == 4:  # the path: so many bytes off the last one's end, then these
            strip, offset = varint(data, offset)
            end = data.index(b"\0", offset)
            path = path[: len(path) - strip] + data[offset:end]
            offset = end + 1
        else:  # the path, then NULs to a multiple of 8 bytes
            end = data.index(b"\0", offset)
            path = data[offset:end]
            offset = start + ((end - start) // 8 + 1) * 8
        modes[path.decode()] = mode
    return modes


def varint(data: bytes, offset: int) -> tuple[int, int]:
    """Git's offset varint (varint.c) at ``offset``: its value, and the offset after it."""
    byte = data[offset]
    value = byte & 0x7F
    while byte & 0x80:
        offset += 1
        byte = data[offset]
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, offset + 1


def bench_lines(modes: dict[str, int]) -> int:
    """Lines of the benchmarks' Python files that git tracks (`git ls-files bench`)."""
    tracked = [path for path in modes if path.startswith("bench/") and path.endswith(".py")]
    return sum(len((REPO / path).read_text().splitlines()) for path in tracked)


def test_the_benchmarks_stay_within_their_line_budget() -> None:
    modes = git_index_modes()
    assert "bench/__main__.py" in modes  # the count reads the files git tracks
    assert bench_lines(modes) < BENCH_LINES


def test_git_holds_no_symbolic_link() -> None:
    """A link breaks a checkout on Windows and an sdist; the mapped folders
    install through pyproject.toml instead."""
    modes = git_index_modes()
    assert modes["workflows/group.py"] == 0o100644
    links = sorted(path for path, mode in modes.items() if mode >> 12 == 0o12)
    assert links == []


def test_pyproject_installs_every_package_of_the_tree() -> None:
    """Its package list is written out (packages.find cannot see into a mapped
    folder): a new package left out of it would be missing from every install."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert MAPPED == {
        "timeshare.workflows": "workflows",
        "timeshare.activities": "activities",
        "timeshare.workers": "workers",
    }
    in_tree = set()
    for dotted, folder in {"timeshare": "timeshare", **MAPPED}.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            in_tree.add(".".join([dotted, *parts]))
    assert "timeshare.workers.agent" in in_tree
    assert sorted(setuptools["packages"]) == sorted(in_tree)
