"""What the Temporal UI says of timeshare's workflows, in its markdown: each
group's static summary and details (set when it starts), its current details
(kept current by workflows/visibility.py), and the node registry's.

One field per line, as a bullet list: Temporal UI 2.54 renders a markdown
table without cell padding or borders, so a row read as one run of words
("node vmjob-ba" for node vmjob-b holding a); a list item renders on a line
of its own in any markdown renderer (tests/integration/test_ui_details.py checks the UI).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timeshare.models import GroupPolicy
    from timeshare.scheduling.reporting import GroupSummary

# Characters that would start markup inside a field's value (a failure's
# cause is free text).
_MARKUP = re.compile(r"([\\`*_\[\]<>|~#])")
_WHITESPACE = re.compile(r"\s+")
REGISTRY_SUMMARY = (
    "timeshare node registry: which node agents are alive, which GPUs each group claims"
)


def plain(text: str) -> str:
    """``text`` shown as it is, on one line."""
    return _MARKUP.sub(r"\\\1", _WHITESPACE.sub(" ", text).strip())


def field(name: str, value: str) -> str:
    return f"- **{name}**: {value}"


def status_command(group: str) -> str:
    return f"`timeshare status {group}`"


def current_details(summary: GroupSummary) -> str:
    """The group now; its first line says what it is, since a run continued
    as new has no static summary (the SDK cannot carry one over)."""
    holder = plain(summary.holder) or "-"
    if summary.holder_phase:
        holder += f" ({plain(summary.holder_phase)})"
    if summary.yield_epoch:
        holder += ", asked to yield"
    lines = [
        f"Group **{plain(summary.group)}**, a timeshare lock queue "
        f"(see {status_command(summary.group)})",
        "",
        field("holder", holder),
        field("queue", ", ".join(plain(job) for job in summary.queue) or "-"),
        *(
            [field("backfill", ", ".join(plain(job) for job in summary.backfill))]
            if summary.backfill
            else []
        ),
        field("state", f"{summary.state}, epoch {summary.epoch}, {summary.switches} switches"),
    ]
    if summary.degraded_cause:
        lines.append(field("degraded", plain(summary.degraded_cause)))
    lines.append(field("ordering", summary.ordering))
    if summary.phase_priority:
        bonuses = ", ".join(f"{plain(phase)} {bonus:+d}" for phase, bonus in summary.phase_priority)
        lines.append(field("phase priority", bonuses))
    lines += [field(f"node {plain(node)}", plain(job)) for node, job in summary.resident]
    return "\n".join(lines)


def group_summary(group: str) -> str:
    """One line: the UI shows it in the workflow's page and in lists."""
    return f"timeshare lock queue of group {plain(group)}: its jobs take turns on shared GPUs"


def group_details(group: str, policy: GroupPolicy) -> str:
    """What the group is and its policy in short (fixed at its first join)."""
    lines = [
        f"Group **{plain(group)}** is a timeshare lock queue: its jobs take turns on "
        "the GPUs of their nodes, one job holding the turn at a time; a switch moves "
        "GPU state off the job that ran and onto the next.",
        "",
        field("ordering", _ordering(policy)),
        field("leases", _leases(policy)),
        field("long turns", _long_turns(policy)),
        field("co-residency", _co_residency(policy)),
        field("prefetch", _prefetch(policy)),
        field("GPUs", _gpus(policy)),
        field(
            "failing switches",
            f"retried, and given up after {policy.switch_give_up_seconds:g} s: "
            "the job whose state cannot move is evicted",
        ),
    ]
    if policy.phase_priority:
        bonuses = ", ".join(f"{plain(p)} {b:+d}" for p, b in sorted(policy.phase_priority.items()))
        lines.append(field("phase priority", bonuses))
    lines += [
        field("see it", f"{status_command(group)}; the current details below"),
        "",
        "The policy is the group's own from its first join; later joins keep it.",
    ]
    return "\n".join(lines)


def registry_details(heartbeat_seconds: float, liveness_seconds: float) -> str:
    return "\n".join(
        [
            "The node agents announce themselves here, and each join claims its "
            "group's GPUs on its nodes.",
            "",
            field(
                "liveness",
                f"an agent announces itself every {heartbeat_seconds:g} s; "
                f"one not heard from for {liveness_seconds:g} s is marked dead",
            ),
            field("claims", "a GPU belongs to one group at a time"),
            field("see it", "`timeshare status` (every node, alive or not, and its groups)"),
        ]
    )


def _ordering(policy: GroupPolicy) -> str:
    if policy.ordering == "fifo":
        text = "fifo: the longest waiting job goes next (priority first)"
    else:
        text = (
            "fair: the job furthest behind its weighted share of GPU time goes next "
            "(priority first)"
        )
    if policy.aging_seconds:
        text += f"; a waiter's priority rises by one every {policy.aging_seconds:g} s"
    return text


def _leases(policy: GroupPolicy) -> str:
    return (
        f"a holder others wait for is evicted after {policy.lease_seconds:g} s without a call; "
        f"any other job is dropped after {policy.idle_lease_seconds:g} s"
    )


def _long_turns(policy: GroupPolicy) -> str:
    parts = []
    if policy.max_turn_seconds:
        parts.append(
            f"with others waiting, a turn over {policy.max_turn_seconds:g} s is asked to yield "
            f"and preempted {policy.preempt_grace_seconds:g} s later"
        )
    if policy.preempt_lower_after_seconds:
        parts.append(
            "a waiter that outranks the holder preempts it after "
            f"{policy.preempt_lower_after_seconds:g} s"
        )
    return "; ".join(parts) or "no limit: a job holds the turn until it yields"


def _co_residency(policy: GroupPolicy) -> str:
    if policy.co_residency == "off":
        return "off: every switch checkpoints the job that ran"
    return "auto: a job that yields stays on the GPU, locked, while the next job fits beside it"


def _prefetch(policy: GroupPolicy) -> str:
    if policy.prefetch == "off":
        return "off: state moves only for a waiting job"
    return "auto: while the GPUs sit idle, the job expected to ask next is brought onto them"


def _gpus(policy: GroupPolicy) -> str:
    if not policy.gpus:
        return "all of each node's"
    return ", ".join(str(gpu) for gpu in policy.gpus) + " of each node"
