"""The unit folder's guard (tests/unit/conftest.py) would catch a unit test
that starts a process, by each way Python starts one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.unit.conftest import ProcessStarted


def test_subprocess_is_refused() -> None:
    with pytest.raises(ProcessStarted):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_fork_is_refused() -> None:
    with pytest.raises(ProcessStarted):
        os.fork()


async def test_asyncio_subprocesses_are_refused() -> None:
    with pytest.raises(ProcessStarted):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
