"""Temporal's side of the versions table (timeshare/scheduling/versions.py):
which version of a versioned record a run takes, asked of Temporal's patch
markers, so that a history written by an older scheduler replays with the
version it was written with."""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow


def newest_granted(
    first: int,
    later: tuple[tuple[int, str], ...],
    patched: Callable[[str], bool] = workflow.patched,
) -> int:
    """The newest version Temporal grants, asking for each later version's
    patch in turn, oldest first, until one is not granted: a new run gets
    the newest (and records a marker for each); a history replays with the
    version its markers name. Each marker a history holds must be asked
    again, in the same order, or Temporal's patch machine fails the replay.
    ``patched``: who says whether a patch holds (Temporal, in a workflow;
    the markers of a history read outside one)."""
    version = first
    for number, patch in later:
        if not patched(patch):
            break
        version = number
    return version
