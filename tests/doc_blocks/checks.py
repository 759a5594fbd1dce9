"""Everything the suite asks of one documentation block, without running it."""

from __future__ import annotations

from tests.doc_blocks.markdown import REPO, Block, looks_like_commands
from tests.doc_blocks.python_names import python_problems
from tests.doc_blocks.shell import commands, problems_of


def marker_problems(block: Block) -> list[str]:
    if block.kind == "other":
        if looks_like_commands(block):
            return ["starts with a command: label it ```sh (and mark it) or show it as output"]
        return []
    if block.marker_error:
        return [block.marker_error]
    if block.marker is None:
        return [
            "neither run nor marked: put <!-- check: run --> (or 'run with a stack', "
            "'not run: REASON') on the line before it (tests/doc_blocks/markers.py)"
        ]
    marker = block.marker
    if marker.tested_by and not (REPO / marker.tested_by).is_file():
        return [f"marked tested by {marker.tested_by}, which is not there"]
    if (marker.save_as or marker.as_test) and block.kind != "python":
        return ["only a Python block can be saved as a file or run as a test"]
    return []


def block_problems(block: Block) -> list[str]:
    """Its marker, then its flags (shell) or its names (Python)."""
    problems = marker_problems(block)
    if block.kind == "shell":
        try:
            found = commands(block.text)
        except ValueError as error:
            return [*problems, f"cannot be read as shell: {error}"]
        problems += [problem for command in found for problem in problems_of(command)]
    elif block.kind == "python":
        problems += python_problems(block.text)
    return problems
