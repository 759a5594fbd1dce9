"""Commands quoted inline in the documentation's prose (`timeshare evict
--group G --job J`), checked as the blocks' are: a flag or command that
disappears fails the suite wherever a page names it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.doc_blocks.shell import commands, problems_of

SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCED = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"^(timeshare |pip3? install |python3? -m |make )")
# What a command prints names it first ("timeshare up: ready: ..."): a message.
MESSAGE = re.compile(r"^timeshare(?: [\w-]+)*(?: --[\w-]+)?: ")


def inline_commands(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each inline span that starts like a command."""
    text = path.read_text()
    # Blanked, not removed, so that line numbers stay true.
    prose = FENCED.sub(lambda block: "\n" * block.group(0).count("\n"), text)
    found = []
    for match in SPAN.finditer(prose):
        span = match.group(1).strip()
        if COMMAND.match(span) and not MESSAGE.match(span):
            found.append((prose.count("\n", 0, match.start()) + 1, span))
    return found


def inline_problems(span: str) -> list[str]:
    # A table cell escapes its pipes: `pause\|resume` names two commands.
    try:
        found = commands(span.replace("\\|", "|") if "\\|" in span else span)
    except ValueError as error:
        return [f"cannot be read as a command: {error}"]
    return [problem for command in found for problem in problems_of(command)]
