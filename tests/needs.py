"""What the environment-bound tests need, as pytest markers. A test marked with
one of these is skipped, with the reason, where the machine lacks it; `make test`
then names in one line what it skipped and why (see conftest's summary)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def missing(marker: str) -> str | None:
    """Why a test with this marker cannot run here, or None when it can."""
    if marker == "kubectl" and shutil.which("kubectl") is None:
        return "kubectl is not on PATH (it renders the kustomizations)"
    if marker == "browser" and not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: run `make chromium` as root"
    if marker == "gpu" and os.environ.get("TIMESHARE_GPU_TESTS") != "1":
        return "needs a GPU host and TIMESHARE_GPU_TESTS=1"
    return None


def skip_what_the_machine_lacks(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in ("kubectl", "browser", "gpu"):
            reason = item.get_closest_marker(marker) and missing(marker)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
