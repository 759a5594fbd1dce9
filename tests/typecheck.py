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

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

from tests.tree import MAPPED, REPO, modules_in


def mapped_sources() -> list[BuildSource]:
    return [
        BuildSource(str(path.relative_to(REPO)), name)
        for package, folder in MAPPED.items()
        for name, path in modules_in(package, folder).items()
    ]


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
