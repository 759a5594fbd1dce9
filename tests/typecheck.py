"""mypy over the tree as it installs: ``python -m tests.typecheck [mypy options]``.

The server's folders at the top of the tree (workflows/, activities/,
workers/) are the packages timeshare.workflows, timeshare.activities and
timeshare.workers (pyproject.toml maps them at install time). mypy finds a
module by its path, so a plain ``mypy`` does not see them under those names;
this runs mypy, with the settings in pyproject.toml, on every source file
named by the module it is when installed.

mypy learns that ``from package import name`` names a submodule only from
the file system, so a module of a mapped folder is imported as
``import timeshare.workers.gateway.convert as convert``, not ``from
timeshare.workers.gateway import convert``, where nothing else imports it."""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

REPO = Path(__file__).resolve().parent.parent
# Folder in the tree -> the package it installs as (pyproject.toml's package-dir).
MAPPED = {"workflows": "timeshare.workflows", "activities": "timeshare.activities",
          "workers": "timeshare.workers"}  # fmt: skip


def mapped_sources() -> list[BuildSource]:
    sources = []
    for folder, package in MAPPED.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            sources.append(BuildSource(str(path.relative_to(REPO)), ".".join([package, *parts])))
    return sources


def main(argv: list[str]) -> int:
    sources, options = process_options(argv, require_targets=False)
    errors: list[str] = []
    try:
        result = build.build([*sources, *mapped_sources()], options)
        errors = result.errors
    except CompileError as error:
        errors = error.messages
    for line in errors:
        print(line)
    checked = len(sources) + len(mapped_sources())
    print(f"{'Found errors' if errors else 'Success: no issues found'} ({checked} source files)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
