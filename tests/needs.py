"""What the environment-bound tests need, as pytest markers. A test marked with
one of these is skipped, with the reason, where the machine lacks it; `make test`
then names in one line what it skipped and why (see conftest's summary)."""

from __future__ import annotations

import importlib.util
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
    if marker == "llmd_client" and not llmd_client_installed():
        return (
            "llm-d's Python client is not installed (not on PyPI): pip install "
            "pkg/client/python and pkg/integrations/slime of llm-d-incubation/"
            "llm-d-rl-time-slicing"
        )
    return None


def llmd_client_installed() -> bool:
    """llm-d's `timeslice` and `timeslice_slime`, found without importing
    them: their generated protobuf module and timeshare's copy of the same
    API cannot share one process (tests run them as processes of their own).
    PyPI's unrelated `timeslice` has no orchestrator."""
    client = importlib.util.find_spec("timeslice")
    if client is None or not client.submodule_search_locations:
        return False
    folders = [Path(folder) for folder in client.submodule_search_locations]
    has_orchestrator = any((folder / "orchestrator").is_dir() for folder in folders)
    return has_orchestrator and importlib.util.find_spec("timeslice_slime") is not None


def skip_what_the_machine_lacks(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in ("kubectl", "browser", "gpu", "llmd_client"):
            reason = item.get_closest_marker(marker) and missing(marker)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
