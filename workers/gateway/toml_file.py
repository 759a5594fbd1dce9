"""The TOML files the processes are given (the gateway's tokens, the Temporal
settings): read whole, with a one-line error that names the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


class TomlFileError(ValueError):
    """The file cannot be read, or is not TOML; the message says which."""


def read_toml(path: Path, label: str) -> dict[str, Any]:
    """The file's tables; ``label`` names the file in errors ("config file")."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as error:
        raise TomlFileError(f"{label} {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise TomlFileError(f"{label} {path}: not valid TOML: {error}") from None
