"""The one table of versions (timeshare/scheduling/versions.py): every patch
id the code asks or marks is in it, at the stage the call says (asked:
live; marked: deprecated or removable), nothing in it is stale, no module
but the table spells a patch id, and the live patch calls stay few. Read
from the sources, so a patch added outside the table fails here."""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

from tests.conftest import REPO
from timeshare.scheduling import versions

SOURCES = [*sorted((REPO / "workflows").glob("*.py")), *sorted((REPO / "timeshare").rglob("*.py"))]
TABLE = REPO / "timeshare" / "scheduling" / "versions.py"
# Calls that take a patch id, and the stages their id may be at.
ASKS = {"patched": {"live"}, "deprecate_patch": {"deprecated", "removable"}}
MARKS = {"MarkPatch": {"deprecated", "removable"}}


def named_patches(path: Path) -> list[tuple[str, str]]:
    """(call, the versions constant it names) for every patch call in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ASKS and name not in MARKS:
            continue
        arg = node.args[0]
        constant = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", "")
        found.append((name, constant))
    return found


def test_every_patch_call_names_the_table_at_its_stage() -> None:
    calls = [call for path in SOURCES for call in named_patches(path)]
    assert ("deprecate_patch", "STEADY_TIMER") in calls  # the walk finds them
    for call, constant in calls:
        if constant == "patch":
            continue  # newest_granted's loop over the table; the core's MarkPatch, carried out
        patch = versions.PATCHES[getattr(versions, constant)]
        assert patch.stage in {**ASKS, **MARKS}[call], (call, constant, patch.stage)


def test_the_rules_and_visibility_versions_are_asked_as_live_patches() -> None:
    for _, patch in [*versions.rules_patches(), *versions.visibility_patches()]:
        assert versions.PATCHES[patch].stage == "live"
    numbers = [rules.number for rules in versions.RULES]
    assert numbers == list(range(1, len(numbers) + 1))


def test_no_module_but_the_table_spells_a_patch_id() -> None:
    ids = set(versions.PATCHES)
    for path in SOURCES:
        if path == TABLE:
            continue
        literals = {
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        assert not literals & ids, (path.name, sorted(literals & ids))


def test_every_entry_is_used_and_dated() -> None:
    names = {
        name
        for name in dir(versions)
        if isinstance(getattr(versions, name), str) and getattr(versions, name) in versions.PATCHES
    }
    used_names = {
        node.id if isinstance(node, ast.Name) else node.attr
        for path in SOURCES
        if path != TABLE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Name | ast.Attribute)
    }
    asked_by_table = {p for _, p in [*versions.rules_patches(), *versions.visibility_patches()]}
    for name in names:
        patch = versions.PATCHES[getattr(versions, name)]
        used = name in used_names or patch.id in asked_by_table
        assert used, f"{name} is in the table but nothing asks or marks it"
        datetime.date.fromisoformat(patch.entered)


def test_fewer_than_eight_live_patch_calls() -> None:
    """As `git grep -c 'workflow.patched(' -- workflows timeshare` counts them."""
    lines = [
        f"{path.name}: {line.strip()}"
        for path in SOURCES
        for line in path.read_text().splitlines()
        if "workflow.patched(" in line
    ]
    assert 0 < len(lines) < 8, lines
