"""The scheduler changes that running groups' histories must tell apart, as
Temporal's patch markers, each at its stage of Temporal's documented cycle
(docs.temporal.io, "Versioning": patched, then deprecate_patch once no
running history takes the old path, then removed once no history holds the
marker).

Live (``workflow.patched``): the rules a group is created with
(scheduling/rules.py), asked once, at creation; the newest change to the
group's timer (histories of groups running yesterday still take its old
path); and, in visibility.py, what a group shows outside. Deprecated
(``workflow.deprecate_patch``): every change whose old path is gone from
the code. A history from before one of
them no longer replays: such a group must have continued as new (it does
every few thousand events) or ended before this scheduler runs it;
tests/integration/test_replay.py replays histories recorded with the markers.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.scheduling import group_core, prefetch
    from timeshare.workflows import visibility

# -- live: the rules of a new group -------------------------------------------
POLICIES = "timeshare-scheduling-policies"
ANTICIPATION = "timeshare-fair-share-anticipation"
SWITCH_COSTS = "timeshare-switch-cost-aware-admission"
OVERDUE_ASKS = "timeshare-overdue-asks"

# No timer armed for the wait slice of an acquire already granted.
SETTLED_SLICES = "timeshare-no-timer-for-settled-slices"

# -- deprecated: marked where the change first asked, the old path removed -----
# One lease timer kept while its deadline is not later than the group's next.
STEADY_TIMER = "timeshare-steady-timer"
# A waiting acquire's slice ends by the main loop's one timer.
SLICE_BY_MAIN_TIMER = "timeshare-slices-by-the-main-timer"
# A holder others wait for gets its whole lease from its grant.
LEASE_FROM_GRANT = "timeshare-lease-from-grant"
# The agents of a job that left are asked to release its processes.
RELEASE_LEFT_JOBS = "timeshare-release-left-jobs"
# Announced by the core (commands.MarkPatch) where its decisions rest on them.
ANNOUNCED_BY_THE_CORE = (
    group_core.WHOLE_JOBS,
    group_core.EVICT_FAILED_JOBS,
    group_core.EVICT_FAILING_HOOKS,
    group_core.PREFETCH,
    group_core.RELEASE_PER_MEMBERSHIP,
    prefetch.PREFETCH_GUESS,
    prefetch.PREFETCH_PAST_DEPARTED,
)

# Every patch id this scheduler still issues, live or deprecated, visibility.py's
# included: a marker outside it in a history fails that history's replay.
ISSUED = frozenset(
    {
        POLICIES, ANTICIPATION, SWITCH_COSTS, OVERDUE_ASKS, SETTLED_SLICES, STEADY_TIMER,
        SLICE_BY_MAIN_TIMER, LEASE_FROM_GRANT, RELEASE_LEFT_JOBS, *ANNOUNCED_BY_THE_CORE,
        visibility.PATCH, visibility.LEAN_PATCH, visibility.CARRIED_MEMO_PATCH,
        visibility.BACKFILL_WAITING_PATCH, visibility.BACKFILL_YIELD_AT_PATCH,
    }
)  # fmt: skip
