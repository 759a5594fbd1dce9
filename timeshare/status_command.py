"""`timeshare status`: the tables of timeshare.status, `-o wide` with each
group's policy and jobs, `-o json` for scripts, and `--watch` to show it
again every few seconds, as `kubectl get -o ... --watch` does."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import timeshare
from timeshare.cli.exit_codes import ExitCode
from timeshare.errors import TimeshareError
from timeshare.models import GroupStatus, NodeRecord
from timeshare.status import groups_table, jobs_table, nodes_table, policy_line

STATUS_OUTPUTS = ("table", "wide", "json")
WATCH_SECONDS = 2.0
# Clears a terminal and puts the cursor top left, between two refreshes of --watch.
CLEAR_SCREEN = "\033[H\033[2J"


@dataclass
class Snapshot:
    groups: list[GroupStatus]
    nodes: list[NodeRecord]


def pause(seconds: float) -> None:
    """Between two refreshes of --watch (tests shorten it)."""
    time.sleep(seconds)


def fetch(address: str | None, group: str | None) -> Snapshot:
    with timeshare.connect(address) as client:
        groups = [client.get_group(group)] if group else client.list_groups()
        return Snapshot(groups, client.list_nodes())


def render(snapshot: Snapshot, output: str, one_group: bool) -> str:
    if output == "json":
        return json.dumps(
            {
                "groups": [g.model_dump(mode="json") for g in snapshot.groups],
                "nodes": [n.model_dump(mode="json") for n in snapshot.nodes],
            },
            sort_keys=True,
        )
    parts = [groups_table(snapshot.groups) if snapshot.groups else "no groups yet"]
    if output == "wide" or one_group:
        for group in snapshot.groups:
            parts += ["", f"group {group.group}", policy_line(group), jobs_table(group)]
    nodes = snapshot.nodes
    parts += ["", nodes_table(nodes) if nodes else "no node agents have announced themselves"]
    return "\n".join(parts)


def show_status(
    address: str | None, group: str | None, output: str, watch: float | None = None
) -> int:
    """Print once, or with ``watch`` every that many seconds until Ctrl-C."""
    clear = watch is not None and output != "json" and sys.stdout.isatty()
    try:
        while True:
            text = render(fetch(address, group), output, group is not None)
            print((CLEAR_SCREEN if clear else "") + text, flush=True)
            if watch is None:
                return ExitCode.OK
            if output != "json":
                print(flush=True)
            pause(watch)
    except TimeshareError as error:
        print(f"timeshare status: {error}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
