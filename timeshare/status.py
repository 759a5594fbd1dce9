"""Groups, holders, queues, residency and nodes as tables (`timeshare status`,
timeshare.status_command), and the operator commands that print them."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import timeshare
from timeshare.errors import TimeshareError
from timeshare.models import GroupStatus, NodeRecord


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def groups_table(groups: Sequence[GroupStatus]) -> str:
    rows = [
        [
            g.group,
            g.state + (f" ({g.degraded_cause})" if g.degraded_cause else ""),
            holder_label(g),
            str(g.epoch),
            ", ".join(g.queue) or "-",
            ", ".join(f"{node}={job}" for node, job in g.resident.items()) or "-",
            str(g.switches),
            ", ".join(g.drained) or "-",
        ]
        for g in groups
    ]
    headers = ["group", "state", "holder", "epoch", "queue", "resident", "switches", "drained"]
    return table(headers, rows)


def holder_label(group: GroupStatus) -> str:
    """The holder, what it holds the turn for, and whether it is asked to yield."""
    if not group.holder:
        return "-"
    phase = f" ({group.holder_phase})" if group.holder_phase else ""
    return group.holder + phase + (", asked to yield" if group.yield_requested else "")


def policy_line(group: GroupStatus) -> str:
    p = group.policy
    parts = [f"ordering {p.ordering}"]
    if p.phase_priority:
        bonuses = ", ".join(
            f"{phase} {bonus:+d}" for phase, bonus in sorted(p.phase_priority.items())
        )
        parts.append(f"phase priority {bonuses}")
    if p.aging_seconds:
        parts.append(f"aging every {p.aging_seconds:g} s")
    if p.preempt_lower_after_seconds:
        parts.append(f"preempts lower priority after {p.preempt_lower_after_seconds:g} s")
    if any(j.backfill for j in group.jobs):
        parts.append(f"backfill preempted {p.backfill_grace_seconds:g} s after a regular ask")
    if not p.switch_cost_aware:
        parts.append("switch costs not weighed")
    elif p.switch_cost_seconds is not None:
        parts.append(f"a switch costs {p.switch_cost_seconds:g} s (set)")
    if p.max_turn_seconds:
        parts.append(f"turn limit {p.max_turn_seconds:g} s (+{p.preempt_grace_seconds:g} s grace)")
    parts.append(f"lease {p.lease_seconds:g} s while others wait, {p.idle_lease_seconds:g} s idle")
    return "policy: " + "; ".join(parts)


def jobs_table(group: GroupStatus) -> str:
    now = time.time()
    rows = [
        [
            j.job + (" (backfill)" if j.backfill else "") + (" (preempted)" if j.preempted else ""),
            ",".join(j.nodes),
            str(j.priority),
            f"{j.weight:g}",
            f"{j.share_seconds:.1f}",
            str(j.turns),
            f"{j.waited_seconds:.1f}",
            f"{j.held_seconds:.1f}",
            f"{max(0.0, now - j.last_seen):.0f}s ago",
        ]
        for j in group.jobs
    ]
    headers = ["job", "nodes", "priority", "weight", "share s", "turns", "waited s", "held s",
               "last heard"]  # fmt: skip
    return table(headers, rows)


def nodes_table(nodes: Sequence[NodeRecord]) -> str:
    now = time.time()
    rows = [
        [
            n.node,
            ("alive" if n.alive else "DEAD") + (", drained" if n.drained else ""),
            n.backend + (" (simulated)" if n.simulated else ""),
            f"{max(0.0, now - n.last_seen):.0f}s ago",
            "; ".join(n.gpus) or "-",
        ]
        for n in nodes
    ]
    notes = [f"{n.node}: {note}" for n in nodes for note in n.notes]
    return "\n".join([table(["node", "state", "backend", "last seen", "gpus"], rows), *notes])


def run_control(args: argparse.Namespace) -> int:
    """The operator commands: pause, resume, evict, drain, undrain."""
    try:
        with timeshare.connect(args.address) as client:
            if args.command in ("pause", "resume"):
                status = client.pause(args.group, paused=args.command == "pause")
                print(groups_table([status]))
            elif args.command == "evict":
                status = client.evict(args.group, args.job, args.reason)
                print(f"evicted {args.job} from {args.group}")
                print(groups_table([status]))
            else:
                groups = client.drain(args.node, drained=args.command == "drain")
                state = "drained" if args.command == "drain" else "in service"
                print(f"node {args.node} {state}; groups told: {', '.join(groups) or 'none'}")
    except TimeshareError as error:
        print(f"timeshare {args.command}: {error}", file=sys.stderr)
        return 1
    return 0
