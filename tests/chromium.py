"""Debian's headless Chromium for tests that open generated HTML: the path of
/usr/bin/chromium, installed with apt-get when missing and this process may
install it, else the test is skipped with the reason."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# Downloading and unpacking Chromium on a slow mirror and a busy 2-core host.
INSTALL_SECONDS = 900

log = logging.getLogger(__name__)


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log.warning("chromium: running apt-get %s", " ".join(args))
    return subprocess.run(
        ["apt-get", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=INSTALL_SECONDS,
        check=False,
    )


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


def chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    if shutil.which("apt-get") is None:
        pytest.skip(f"{CHROMIUM} is missing and there is no apt-get to install it")
    if os.geteuid() != 0:
        pytest.skip(f"{CHROMIUM} is missing; install it as root: apt-get install chromium")
    install = ("install", "-y", "--no-install-recommends", "chromium")
    try:
        result = _apt(*install)
        if result.returncode != 0:
            # Fresh images often ship without package lists.
            _apt("update")
            result = _apt(*install)
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing chromium took over {INSTALL_SECONDS} s")
    if result.returncode != 0 or not CHROMIUM.exists():
        pytest.skip(f"could not install chromium: {_last_line(result)}")
    log.warning("chromium: installed %s", CHROMIUM)
    return CHROMIUM
