"""The GPU check of a new GPU host (an alias of `timeshare gpu-check`)."""

from __future__ import annotations

from timeshare.gpu_check.main import main

__all__ = ["main"]
