"""One fault of a chaos run, as the run reports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    # When the part was ready again, or the condition ended.
    back_at: float
    # What came back, or what the stack showed meanwhile, in words.
    outcome: str
