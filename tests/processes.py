"""Processes for tests of process backends (timeshare.testing.processes)."""

from timeshare.testing.processes import detached, kill

__all__ = ["detached", "kill"]
