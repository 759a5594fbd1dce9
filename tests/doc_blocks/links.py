"""Links between the documentation's pages: each relative link names a file
that is there, and each #anchor a heading (or an <a id>) of that page, as
GitHub makes them."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
ANCHOR_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
FENCED = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
EXTERNAL = ("http://", "https://", "mailto:")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = FENCED.sub("", path.read_text())
    found = {slug(heading) for heading in HEADING.findall(text)}
    return frozenset(found | set(ANCHOR_ID.findall(text)))


def link_problems(path: Path) -> list[str]:
    text = FENCED.sub("", path.read_text())
    problems = []
    for target in LINK.findall(text):
        if target.startswith(EXTERNAL):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{target}: {linked.name} has no heading #{anchor}")
    return problems
