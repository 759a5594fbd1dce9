"""What the docs and the code cite, a reader can follow from this repository:
no issue number of this project (a reader has no tracker to look it up in),
an upstream issue or pull request named with its repository
(NVIDIA/cuda-checkpoint#44), and no file outside the repository: the facts
the code relies on are in docs/facts.md."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

SCANNED = ["docs", "timeshare", "workflows", "activities", "workers", "bench", "tests",
           "examples", "deploy", "proto", "README.md", "Makefile"]  # fmt: skip
TEXT = {".py", ".md", ".c", ".h", ".sh", ".yaml", ".yml", ".toml", ".txt", ".proto", ".cfg"}
# Recorded data, not prose.
DATA = ("tests/histories/",)
# Moving into the package with the GPU check, which states the same facts there.
MOVING = {"bench/gpu_check.py", "bench/gpu_probe.py", "bench/parts/gpu_figures.py"}
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


def scanned_files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            relative = path.relative_to(REPO).as_posix()
            if (
                path.is_file()
                and (path.suffix in TEXT or path.name == "Makefile")
                and not any(part.startswith(".") or part == "__pycache__" for part in path.parts)
                and not relative.startswith(DATA)
                and relative not in MOVING
                and path != Path(__file__)
            ):
                found.append(path)
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
        for path in files
        if (lines := offences(path.read_text(errors="replace")))
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
