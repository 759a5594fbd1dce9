"""Where the project's modules live in the tree: the packages pyproject.toml
maps into timeshare (its ``package-dir``: timeshare.workflows is the folder
workflows/), and the source file of a module."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Dotted package -> its folder in the tree.
MAPPED: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]


def module_source(module: str) -> Path | None:
    """The source file of a module of the tree (a package's __init__), if there is one."""
    parts = module.split(".")
    for dotted, folder in MAPPED.items():
        if module == dotted or module.startswith(dotted + "."):
            parts = [folder, *module.removeprefix(dotted).strip(".").split(".")]
            parts = [part for part in parts if part]
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def modules_in(package: str, folder: str) -> dict[str, Path]:
    """Every module below ``folder`` of the tree, by its dotted name under
    ``package`` (a package by its __init__)."""
    found: dict[str, Path] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        parts = path.relative_to(REPO / folder).with_suffix("").parts
        if any(part.startswith(".") or part == "__pycache__" for part in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([package, *parts])] = path
    return found
