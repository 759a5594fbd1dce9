"""Unit tests start no process: no Temporal server, no agent, no job. While a
unit test (and its fixtures) runs, starting one fails the test, so a test
that needs one is moved to tests/integration rather than slowing this folder.
Fixtures that an integration test in the same test process started earlier
are not caught here; `make test-unit` runs this folder alone, where they are."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

SPAWNERS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnve")


class ProcessStarted(AssertionError):
    """A unit test started a process."""


def refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise ProcessStarted(
        "a unit test started a process; a test that needs processes belongs in tests/integration"
    )


def refusing() -> pytest.MonkeyPatch:
    patch = pytest.MonkeyPatch()
    patch.setattr(subprocess.Popen, "__init__", refuse)
    for name in SPAWNERS:
        if hasattr(os, name):
            patch.setattr(os, name, refuse)
    patch.setattr(asyncio, "create_subprocess_exec", refuse)
    patch.setattr(asyncio, "create_subprocess_shell", refuse)
    return patch


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    patch = refusing()
    try:
        yield
    finally:
        patch.undo()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    patch = refusing()
    try:
        yield
    finally:
        patch.undo()
