"""A benchmark's stack (timeshare.testing.LocalStack), started in a folder of
its own and stopped on leaving: a scratch folder, removed after, unless
``workdir`` names one to keep."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from timeshare.testing import LocalStack


@contextlib.contextmanager
def running_stack(workdir: Path | None = None, **options: Any) -> Iterator[LocalStack]:
    with (
        tempfile.TemporaryDirectory() as scratch,
        LocalStack(workdir or Path(scratch), **options) as stack,
    ):
        yield stack
