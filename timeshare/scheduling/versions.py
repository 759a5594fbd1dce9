"""Every version a running group's history can hold, in one table: the
Rules a group decides by (scheduling/rules.py), the shape of what a group
publishes outside its workflow (workflows/visibility.py), and every
Temporal patch id the scheduler asks or marks, each with its stage and the
date it entered.

A group's workflow runs for as long as the group has jobs, so its code must
replay every history it wrote (docs/reliability.md, "Changing the
workflow"). Temporal tells the paths apart by patch markers, and a patch
goes through Temporal's documented cycle (docs.temporal.io, "Versioning"):

- ``live``: asked (``workflow.patched``): the code keeps both paths, and a
  history from before the change replays on the old one.
- ``deprecated``: marked (``workflow.deprecate_patch``, or the core's
  MarkPatch command): the old path is gone. A history that holds the
  marker replays; one from before the change no longer does, so every run
  that began before it must have continued as new or ended.
- ``removable``: deprecated, and no run that still needs the marker is
  left: the mark may go. tests/integration/test_replay.py fails while a
  recorded history holds a marker the code no longer issues.

The Rules are asked once, at a group's creation, oldest first, one patch
per version (``rules_patches``): a history records a marker for each
version its group was created with, and Temporal's patch machine fails a
replay whose code leaves one of them unasked, so one call over this table
asks them all, and a group created by an older scheduler replays with its
own Rules. A running group keeps its Rules in its state across
continue-as-new; the core reads that record, never a patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stage = Literal["live", "deprecated", "removable"]


@dataclass(frozen=True)
class Patch:
    id: str
    stage: Stage
    # The day the change entered the scheduler (ISO date).
    entered: str
    what: str


@dataclass(frozen=True)
class RulesVersion:
    number: int
    # The patch a new group's creation asks for this version (none for the first).
    patch: str
    entered: str
    what: str


@dataclass(frozen=True)
class VisibilityVersion:
    number: int
    patch: str
    entered: str
    what: str


# -- the Rules ------------------------------------------------------------------
RULES_LEGACY = 1
RULES_POLICIES = 2
RULES_ANTICIPATION = 3
RULES_SWITCH_COSTS = 4
RULES_OVERDUE_ASKS = 5
RULES_STEADY_DEADLINES = 6

POLICIES = "timeshare-scheduling-policies"
ANTICIPATION = "timeshare-fair-share-anticipation"
SWITCH_COSTS = "timeshare-switch-cost-aware-admission"
OVERDUE_ASKS = "timeshare-overdue-asks"
STEADY_DEADLINES = "timeshare-steady-deadlines"

RULES = (
    RulesVersion(RULES_LEGACY, "", "2026-11-30", "FIFO, one lease for everyone"),
    RulesVersion(
        RULES_POLICIES, POLICIES, "2026-12-01",
        "scheduling policies: fair share, weights, priorities, idle and contended leases",
    ),
    RulesVersion(
        RULES_ANTICIPATION, ANTICIPATION, "2026-12-04",
        "fair share holds the turn open for a yielder behind its share",
    ),
    RulesVersion(
        RULES_SWITCH_COSTS, SWITCH_COSTS, "2026-12-06",
        "switch costs weighed: backfill gaps, anticipation no longer than a switch",
    ),
    RulesVersion(
        RULES_OVERDUE_ASKS, OVERDUE_ASKS, "2026-12-06",
        "a regular job's overdue request still holds a backfill waiter back a while",
    ),
    RulesVersion(
        RULES_STEADY_DEADLINES, STEADY_DEADLINES, "2026-12-07",
        "the group looks again when a waiter held back by switch costs may go, a turn "
        "held or not; a backfill job that turns regular starts level in fair share",
    ),
)  # fmt: skip
NEWEST_RULES = RULES[-1].number

# -- what a group publishes (workflows/visibility.py) ---------------------------------
VISIBILITY_LEGACY = 0
VISIBILITY_RECORD = 1
WATCH_RECORD = "timeshare-watch-record"

VISIBILITY = (
    VisibilityVersion(
        VISIBILITY_LEGACY, "", "2026-11-30",
        "search attributes, and the memo keys yield_epoch, backfill_waiting and "
        "backfill_yield_at, each behind a patch of its own",
    ),
    VisibilityVersion(
        VISIBILITY_RECORD, WATCH_RECORD, "2026-12-07",
        "search attributes, and one versioned memo record of what a holder must hear "
        "(scheduling/watch.py)",
    ),
)  # fmt: skip
NEWEST_VISIBILITY = VISIBILITY[-1].number

# -- the other patches -------------------------------------------------------------
# Asked by the group workflow.
SETTLED_SLICES = "timeshare-no-timer-for-settled-slices"
# Asked by the legacy visibility path only (runs that began before WATCH_RECORD).
SEARCH_ATTRIBUTES = "timeshare-search-attributes"
LEAN_SEARCH_ATTRIBUTES = "timeshare-lean-search-attributes"
CARRIED_YIELD_EPOCH = "timeshare-carried-yield-epoch"
BACKFILL_WAITING_MEMO = "timeshare-backfill-waiting-memo"
BACKFILL_YIELD_AT_MEMO = "timeshare-backfill-yield-at-memo"
# Marked by the group workflow.
STEADY_TIMER = "timeshare-steady-timer"
SLICE_BY_MAIN_TIMER = "timeshare-slices-by-the-main-timer"
LEASE_FROM_GRANT = "timeshare-lease-from-grant"
RELEASE_LEFT_JOBS = "timeshare-release-left-jobs"
# Announced by the core (commands.MarkPatch) where its decisions rest on them.
WHOLE_JOBS = "timeshare-whole-job-switch"
EVICT_FAILED_JOBS = "timeshare-evict-failed-jobs"
EVICT_FAILING_HOOKS = "timeshare-evict-failing-hooks"
PREFETCH = "timeshare-prefetch"
RELEASE_PER_MEMBERSHIP = "timeshare-release-per-membership"
PREFETCH_GUESS = "timeshare-prefetch-the-job-away-longest"
PREFETCH_PAST_DEPARTED = "timeshare-prefetch-past-departed-jobs"

PATCHES = {
    patch.id: patch
    for patch in (
        Patch(POLICIES, "live", "2026-12-01", "Rules 2 at a group's creation"),
        Patch(ANTICIPATION, "live", "2026-12-04", "Rules 3 at a group's creation"),
        Patch(SWITCH_COSTS, "live", "2026-12-06", "Rules 4 at a group's creation"),
        Patch(OVERDUE_ASKS, "live", "2026-12-06", "Rules 5 at a group's creation"),
        Patch(STEADY_DEADLINES, "live", "2026-12-07", "Rules 6 at a group's creation"),
        Patch(WATCH_RECORD, "live", "2026-12-07", "a run publishes one versioned record"),
        Patch(SETTLED_SLICES, "live", "2026-12-04",
              "no timer armed for the wait slice of an acquire already granted"),
        Patch(CARRIED_YIELD_EPOCH, "live", "2026-12-03",
              "legacy visibility: a run continued as new writes yield_epoch 0 where the "
              "carried memo still asks"),
        Patch(BACKFILL_WAITING_MEMO, "live", "2026-12-06",
              "legacy visibility: the backfill_waiting memo key"),
        Patch(BACKFILL_YIELD_AT_MEMO, "live", "2026-12-06",
              "legacy visibility: the backfill_yield_at memo key"),
        Patch(SEARCH_ATTRIBUTES, "deprecated", "2026-11-30",
              "search attributes are upserted"),
        Patch(LEAN_SEARCH_ATTRIBUTES, "deprecated", "2026-12-03",
              "an upsert carries only the attributes that changed; a quick switch is not "
              "shown as switching"),
        Patch(STEADY_TIMER, "deprecated", "2026-12-01",
              "one lease timer kept while its deadline is not later than the group's next"),
        Patch(SLICE_BY_MAIN_TIMER, "deprecated", "2026-12-02",
              "a waiting acquire's slice ends by the main loop's one timer"),
        Patch(LEASE_FROM_GRANT, "deprecated", "2026-12-03",
              "a holder others wait for gets its whole lease from its grant"),
        Patch(RELEASE_LEFT_JOBS, "deprecated", "2026-12-01",
              "the agents of a job that left are asked to release its processes"),
        Patch(WHOLE_JOBS, "deprecated", "2026-11-30",
              "jobs leave as a whole: stopped on every node before any checkpoint"),
        Patch(EVICT_FAILED_JOBS, "deprecated", "2026-12-01",
              "a job whose CUDA state FAILED is evicted"),
        Patch(EVICT_FAILING_HOOKS, "deprecated", "2026-12-02",
              "a job whose own hooks fail its checkpoint is evicted"),
        Patch(PREFETCH, "deprecated", "2026-12-02",
              "the job expected next is brought in ahead of its request"),
        Patch(RELEASE_PER_MEMBERSHIP, "deprecated", "2026-12-06",
              "each membership of a job that left gets a release of its own"),
        Patch(PREFETCH_GUESS, "deprecated", "2026-12-03",
              "with no request known, the job away the longest is prefetched"),
        Patch(PREFETCH_PAST_DEPARTED, "deprecated", "2026-12-03",
              "a job that left holds no prefetch up"),
    )
}  # fmt: skip


def rules_patches() -> tuple[tuple[int, str], ...]:
    """(version, patch) of every Rules version after the first, oldest first:
    what a new group's creation asks, one after the other, until one is
    not granted (a history written before it)."""
    return tuple((rules.number, rules.patch) for rules in RULES[1:])


def visibility_patches() -> tuple[tuple[int, str], ...]:
    """As rules_patches, for the shape of what a run publishes."""
    return tuple((version.number, version.patch) for version in VISIBILITY[1:])


def issued() -> frozenset[str]:
    """Every patch id this scheduler still asks or marks (a removable one is
    marked until its entry goes): a marker outside it in a history fails
    that history's replay."""
    return frozenset(PATCHES)
