"""What the docs and the code cite, a reader can follow from this repository:
no issue number of this project (a reader has no tracker to look it up in),
an upstream issue or pull request named with its repository
(NVIDIA/cuda-checkpoint#44), no file outside the repository (the facts the
code relies on are in docs/facts.md), and no module or file that is not there."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.conftest import REPO
from tests.tree import MAPPED, module_source

SCANNED = ["docs", "timeshare", "workflows", "activities", "workers", "bench", "tests",
           "examples", "deploy", "proto", "README.md", "Makefile"]  # fmt: skip
TEXT = {".py", ".md", ".c", ".h", ".sh", ".yaml", ".yml", ".toml", ".txt", ".proto", ".cfg"}
# A dotted name of the project's, as prose and comments name modules
# (bench.parts.floors, timeshare.workers.gateway.turn_watch).
DOTTED = re.compile(r"(?<![\w.-])((?:timeshare|bench)(?:\.[a-z_][a-z0-9_]*)+)\b(?![\w-])")
# A file of the tree named by its path (workers/gateway/turn_watch.py).
PATH = re.compile(
    r"(?<![\w/.-])((?:timeshare|workflows|activities|workers|bench|tests|docs|examples|deploy)"
    r"/[\w/.-]*\w\.(?:py|md|c|h|yaml|yml|json|sh|proto|toml))\b"
)
# Paths that stand for any file of their kind.
PLACEHOLDERS = {"tests/upstream/FRAMEWORK.json", "tests/integration/test_x.py"}
# Written by tools, not by hand.
GENERATED = ("timeshare/v1/",)
# Recorded data, not prose.
DATA = ("tests/histories/",)
RULES = {
    # "issue 20", "Issue 44", "issues #30": this project's, or an upstream one unnamed.
    "an issue without its repository": re.compile(r"\b[Ii]ssues? #?\d+"),
    # "(#47)", "PR #34528"; not "#1 SMP" (uname) nor a colour "#1f77b4".
    "a number without its repository": re.compile(r"(?<![\w/.-])#\d+\b(?![0-9a-fA-F])(?! SMP)"),
    # "temporalio/sdk-rust #1146" for temporalio/sdk-rust#1146.
    "a repository apart from its number": re.compile(r"\b[\w.-]+/[\w.-]+ #\d+"),
    # The notes this project was built from, outside the repository.
    "a file outside the repository": re.compile(
        r"GPU-FACTS|TEMPORAL-NOTES|DESIGN\.md|DEVELOPERS\.md|(?<![\w.-])shared/"
    ),
}


@cache
def scanned_files() -> dict[Path, str]:
    """Each file scanned, with its text."""
    found: dict[Path, str] = {}
    for name in SCANNED:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            relative = path.relative_to(REPO).as_posix()
            parts = relative.split("/")
            hidden = any(part.startswith(".") or part == "__pycache__" for part in parts)
            if (
                path.is_file()
                and (path.suffix in TEXT or path.name == "Makefile")
                and not hidden
                and not relative.startswith(DATA)
                and path != Path(__file__)
            ):
                found[path] = path.read_text(errors="replace")
    return found


def offences(text: str) -> list[str]:
    return [
        f"{number}: {why}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        for why, rule in RULES.items()
        if rule.search(line)
    ]


def test_docs_and_code_cite_only_what_a_reader_can_follow() -> None:
    files = scanned_files()
    assert REPO / "docs" / "facts.md" in files and REPO / "workflows" / "group.py" in files
    found = {
        path.relative_to(REPO).as_posix(): lines
        for path, text in files.items()
        if (lines := offences(text))
    }
    assert found == {}


def test_the_rules_catch_what_they_forbid_and_pass_what_they_allow() -> None:
    forbidden = [
        "Goals (issue 20): re-acquire",
        '"""Issue 44: such a process',
        "quoted in the issues: 'invalid argument' (#47)",
        "The mode came with vLLM PR #34528",
        "the shape of temporalio/sdk-rust #1146",
        "(see shared/TEMPORAL-NOTES.md)",
        "as read on driver 580 (GPU-FACTS.md)",
        "the switch protocol (DESIGN.md)",
    ]
    assert [text for text in forbidden if not offences(text)] == []
    allowed = [
        "driver 580 (NVIDIA/cuda-checkpoint#44): the job is failed",
        "`Linux vm 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC`",
        'COLOURS = ["#1f77b4", "#ff7f0e"]',
        "# 2 GiB per job",
        "the facts in docs/facts.md",
    ]
    assert [text for text in allowed if offences(text)] == []


@cache
def top_level_names(source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def stale(name: str) -> bool:
    """A dotted name whose longest module prefix has no such next part: a
    module or name that moved or went. Under ``timeshare`` itself only past
    a package (``timeshare.scheduler`` is a task queue, ``timeshare.io`` a
    label domain)."""
    parts = name.split(".")
    known = len(parts)
    while known > 1 and module_source(".".join(parts[:known])) is None:
        known -= 1
    if known == len(parts) or (known == 1 and parts[0] == "timeshare"):
        return False
    source = module_source(".".join(parts[:known]))
    return source is None or parts[known] not in top_level_names(source)


def gone(path: str) -> bool:
    """A path of the tree, as installed (timeshare/workflows/...) or as in
    the tree, that names no file; a .proto by its path under proto/."""
    for dotted, folder in MAPPED.items():
        installed = dotted.replace(".", "/") + "/"
        if path.startswith(installed):
            path = folder + "/" + path.removeprefix(installed)
    return not (REPO / path).exists() and not (REPO / "proto" / path).exists()


def test_no_module_or_file_named_is_gone() -> None:
    found = [
        f"{path.relative_to(REPO).as_posix()}:{number}: {name}"
        for path, text in scanned_files().items()
        if not path.relative_to(REPO).as_posix().startswith(GENERATED)
        for number, line in enumerate(text.splitlines(), 1)
        for name in [
            *(name for name in DOTTED.findall(line) if stale(name)),
            *(name for name in PATH.findall(line) if name not in PLACEHOLDERS and gone(name)),
        ]
    ]
    assert found == []


def test_a_name_or_path_that_went_is_stale_and_one_that_is_there_is_not() -> None:
    assert stale("bench.stack") and stale("bench.parts.handover_floors")
    assert stale("timeshare.workers.gateway.no_such_module")
    assert stale("timeshare.integrations.turns.turns_from_env")
    assert not stale("timeshare.integrations.environment.turns_from_env")
    assert not stale("timeshare.workers.gateway.turn_watch")
    assert not stale("bench.parts.floors") and not stale("timeshare.scheduler")
    assert gone("timeshare/activities/sim.py") and gone("bench/floor_hops.py")
    assert not gone("timeshare/activities/backends/sim.py") and not gone("bench/floors.py")
    assert not gone("timeshare/v1/timeshare.proto")
