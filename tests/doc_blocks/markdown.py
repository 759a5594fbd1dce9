"""The code blocks of the documentation: README.md, docs/ and examples/,
each fenced block with its language, its text and its marker."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.doc_blocks.markers import MARKER, Marker, MarkerError, parse_marker

REPO = Path(__file__).resolve().parents[2]
SHELL = ("sh", "bash", "shell", "console")
PYTHON = ("python", "py")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>```+)(?P<lang>[\w+-]*)\s*$")
# An unlabelled block that starts like a command: it must say it is shell.
COMMAND_START = re.compile(r"^\s*(\$ |timeshare |python3? |pip |make |\.venv/bin/)")
# ... unless it shows what a command printed, which names the command first.
OUTPUT_START = re.compile(r"^\s*timeshare(?: [\w-]+)*: ")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    marker: Marker | None
    marker_error: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def kind(self) -> str:
        if self.lang in SHELL:
            return "shell"
        if self.lang in PYTHON:
            return "python"
        return "other"


def documentation_files(root: Path = REPO) -> list[Path]:
    files = [root / "README.md"]
    files += sorted((root / "docs").rglob("*.md"))
    files += sorted((root / "examples").rglob("*.md"))
    return [path for path in files if path.is_file()]


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(opening["ticks"]):
            end += 1
        indent = len(opening["indent"])
        text = "\n".join(line[indent:] for line in lines[index + 1 : end])
        marker, error = _marker_before(lines, index)
        found.append(Block(path, index + 1, opening["lang"].lower(), text, marker, error))
        index = end + 1
    return found


def _marker_before(lines: list[str], index: int) -> tuple[Marker | None, str]:
    """The marker on the nearest non-blank line above the fence, if any."""
    above = index - 1
    while above >= 0 and not lines[above].strip():
        above -= 1
    if above < 0:
        return None, ""
    found = MARKER.search(lines[above])
    if not found:
        return None, ""
    try:
        return parse_marker(found["body"]), ""
    except MarkerError as error:
        return None, str(error)


def all_blocks(root: Path = REPO) -> list[Block]:
    return [block for path in documentation_files(root) for block in blocks_of(path)]


def looks_like_commands(block: Block) -> bool:
    """An unlabelled (or text) block whose first line is a command."""
    first = next((line for line in block.text.splitlines() if line.strip()), "")
    return (
        block.kind == "other"
        and block.lang in ("", "text")
        and bool(COMMAND_START.match(first))
        and not OUTPUT_START.match(first)
    )
