"""How timeshare starts a Python process of its own (`timeshare up`'s
children, the demo's jobs, LocalStack's parts, gpu-check's steps): with this
interpreter and ``-P``.

``python -m`` puts the working directory first on sys.path. Run inside a
clone of this repository, a child would then import the clone's
``timeshare/`` folder instead of the installed package, which lacks
``timeshare.workers`` (mapped in only at install). ``-P`` (Python 3.11 and
later, as timeshare requires) leaves the working directory out, so a child
imports what its parent imported."""

from __future__ import annotations

import sys

SAFE_PATH = "-P"


def python_module_command(module: str, *args: str) -> list[str]:
    """``python -P -m MODULE ARGS...`` with this process's interpreter."""
    return [sys.executable, SAFE_PATH, "-m", module, *args]


def timeshare_command(*args: str) -> list[str]:
    """``timeshare ARGS...``, as a child of this process."""
    return python_module_command("timeshare", *args)
