"""A worker under a coordinator (tests/integration/test_coordinator.py): asks for turns
through TIMESHARE_TURNS_FD and prints what it saw, one JSON line."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import timeshare
from timeshare.integrations.environment import turns_from_env


def seen_from_outside(group: str, address: str) -> dict[str, Any]:
    """Run by the coordinator with the turn given away."""
    with timeshare.connect(address) as client:
        return {"holder": client.get_group(group).holder, "pid": os.getpid()}


def main() -> None:
    group, address = sys.argv[1], sys.argv[2]
    turns = turns_from_env()
    turns.acquire("setup")
    turns.handover("rollout")
    # By its importable name: run as a script, this module is __main__.
    from tests.turns_worker import seen_from_outside as named

    outside = turns.outside(named, {"group": group, "address": address}, then="train")
    try:
        turns.outside(lambda: None, {}, then="train")
        refused = ""
    except ValueError as error:
        refused = str(error)
    print(json.dumps({"outside": outside, "refused": refused, "pid": os.getpid(),
                      "holding": turns.holding, "phase": turns.phase}))  # fmt: skip
    turns.close()


if __name__ == "__main__":
    main()
