"""Read an engine's version from its HTTP API, for hooks whose safe behaviour
exists only from some release on: an older engine ignores the argument that
asks for it and does the unsafe thing without saying so."""

from __future__ import annotations

import re

from timeshare.hooks._http import EngineError, get_json


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.17.1rc1" -> (0, 17, 1)."""
    found = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if found is None:
        raise EngineError(f"cannot read an engine version from {version!r}")
    return tuple(int(part) for part in found.group(1).split("."))


def require_release(
    base_url: str, path: str, minimum: tuple[int, ...], what: str, timeout: float
) -> str:
    """The version the engine at ``base_url`` reports under ``path`` (JSON
    "version"); raises EngineError in one line if it is older than ``minimum``."""
    reply = get_json(base_url, path, timeout)
    version = str(reply.get("version", "")) if isinstance(reply, dict) else ""
    if not version:
        raise EngineError(f"GET {base_url.rstrip('/')}{path}: no version in the reply")
    if release(version) < minimum:
        needed = ".".join(str(part) for part in minimum)
        raise EngineError(f"engine version {version} is older than {needed}, which {what}")
    return version
