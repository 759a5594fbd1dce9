"""Names of groups, jobs and nodes, and the ids derived from them."""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?")

SCHEDULER_TASK_QUEUE = "timeshare.scheduler"
NODE_REGISTRY_WORKFLOW_ID = "timeshare-nodes"
# The entry-point group of the node agent's backends (pyproject.toml).
BACKEND_ENTRY_POINT_GROUP = "timeshare.backends"


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid group, job or node name, else raise ValueError."""
    if not NAME_PATTERN.fullmatch(value):
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise ValueError(
            f"{kind} name {shown!r} is invalid: use 1-63 characters of a-z 0-9 - _ . "
            "starting and ending with a letter or digit"
        )
    return value


def group_workflow_id(group: str) -> str:
    return f"timeshare-group-{group}"


def node_task_queue(node: str) -> str:
    return f"timeshare.node.{node}"
