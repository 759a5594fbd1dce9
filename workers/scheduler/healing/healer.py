"""GroupHealer: every scheduler worker's answer to a group whose workflow
task keeps failing.

The worker's runner (failure_watch.FailureWatch) tells it of each task it
fails. The healer then reads the group's history and replays it with the
worker's own code. Where that replay fails too, no worker running this code
will ever get past the task (an SDK bug, or code that disagrees with what
the history recorded): the group is healed at once. Where the replay
succeeds, the failure happened only live (the code raised); the group is
healed once the task has failed ``REPEATED_FAILURES`` times.

Healing starts a new run of the group (new_run.start_healed_run) from the
last state the code could rebuild (replayed_state, else the run's start)
and what its jobs were told since (history_facts), which the new run's core
applies first (timeshare.scheduling.healing). A group healed
``HEALS_ALLOWED`` times within ``HEAL_WINDOW_SECONDS``, each new run failing
before it served, is healed again once the oldest of those heals is that old
(healing.heal_allowed_at), and the log says so: never given up on, and never
rebuilt in a tight loop by a fault that fails every new run the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from timeshare.instruments import record_heal
from timeshare.scheduling import healing
from timeshare.workers.scheduler.healing.failure_watch import TaskFailure
from timeshare.workers.scheduler.healing.history_facts import facts_after, read_run
from timeshare.workers.scheduler.healing.new_run import start_healed_run
from timeshare.workers.scheduler.healing.replayed_state import replayed_state
from timeshare.workers.scheduler.healing.start_state import start_input, start_state
from timeshare.workflows.group import GroupInput

log = logging.getLogger("timeshare.scheduler")

GROUP_WORKFLOW = "GroupWorkflow"
COMPLETED_TASK = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
# A task that fails only live (the history replays) is healed once it has
# failed this often: Temporal's attempt count of the task now pending.
REPEATED_FAILURES = 3
# How long the cause of a failure may be in a log line and a run's input.
CAUSE_CHARACTERS = 400


@dataclass(frozen=True)
class Examined:
    """What the healer made of a failure: ``outcome`` is "healed",
    "held-off" (healed again in ``retry_in`` seconds), "waiting" (not failed
    often enough yet) or "moved-on" (the run is no longer the group's, or no
    longer running)."""

    outcome: str
    line: str
    new_run_id: str = ""
    retry_in: float = 0.0


class GroupHealer:
    def __init__(self, client: Client, workflows: Sequence[type]) -> None:
        self._client = client
        self._workflows = list(workflows)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._suspects: asyncio.Queue[TaskFailure] | None = None
        # Runs being examined, and runs healed or given up on: later
        # failures of these need nothing more.
        self._busy: set[str] = set()
        self._done: set[str] = set()
        # Runs held off, until when (monotonic): their failures meanwhile are
        # not examined again; the healer looks at them again then.
        self._held_until: dict[str, float] = {}
        # When this scheduler first heard of each run's failure (monotonic).
        self._first_heard: dict[str, float] = {}
        self.examined: list[Examined] = []

    def heard(self, failure: TaskFailure) -> None:
        """A task failed (on any thread: the worker's activation thread)."""
        if failure.workflow_type != GROUP_WORKFLOW or self._loop is None:
            return
        assert self._suspects is not None
        self._loop.call_soon_threadsafe(self._suspects.put_nowait, failure)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[GroupHealer]:
        self._loop = asyncio.get_running_loop()
        self._suspects = asyncio.Queue()
        task = asyncio.create_task(self._serve(self._suspects))
        try:
            yield self
        finally:
            self._loop = None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, suspects: asyncio.Queue[TaskFailure]) -> None:
        background: set[asyncio.Task[None]] = set()
        while True:
            failure = await suspects.get()
            self._first_heard.setdefault(failure.run_id, time.monotonic())
            if failure.run_id in self._busy or failure.run_id in self._done:
                continue
            if self._held_until.get(failure.run_id, 0.0) > time.monotonic():
                continue
            self._held_until.pop(failure.run_id, None)
            self._busy.add(failure.run_id)
            task = asyncio.create_task(self._examine_logged(failure))
            background.add(task)
            task.add_done_callback(background.discard)

    async def _examine_logged(self, failure: TaskFailure) -> None:
        try:
            examined = await self.examine(failure)
        except Exception as error:  # the next failure of the run brings it back
            log.warning(
                "could not heal %s (run %s) yet: %s: %s; will try at its next failure",
                failure.workflow_id, failure.run_id, type(error).__name__, error,
            )  # fmt: skip
            return
        finally:
            self._busy.discard(failure.run_id)
        self.examined.append(examined)
        if examined.outcome in ("healed", "moved-on"):
            self._done.add(failure.run_id)
            self._first_heard.pop(failure.run_id, None)
        if examined.outcome == "healed":
            log.warning("%s", examined.line)
        elif examined.outcome == "held-off":
            log.error("%s", examined.line)
            self._look_again(failure, examined.retry_in)
        else:
            log.info("%s", examined.line)

    def _look_again(self, failure: TaskFailure, seconds: float) -> None:
        self._held_until[failure.run_id] = time.monotonic() + seconds
        if self._loop is not None and self._suspects is not None:
            self._loop.call_later(seconds + 0.1, self._suspects.put_nowait, failure)

    async def examine(self, failure: TaskFailure) -> Examined:
        client, converter = self._client, self._client.data_converter
        cause = _one_line(failure.message)
        current = await client.get_workflow_handle(failure.workflow_id).describe()
        if current.run_id != failure.run_id or current.status != WorkflowExecutionStatus.RUNNING:
            return Examined("moved-on", f"{failure.workflow_id}: run {failure.run_id} was replaced")
        failing = client.get_workflow_handle(failure.workflow_id, run_id=failure.run_id)
        history = await failing.fetch_history()
        events = history.events
        replayed = await replayed_state(history, self._workflows, converter)
        attempts = current.raw_description.pending_workflow_task.attempt
        if not replayed.failure and attempts < REPEATED_FAILURES:
            return Examined(
                "waiting",
                f"{failure.workflow_id}: its task failed ({cause}); its history replays, so it is "
                f"healed only once the task has failed {REPEATED_FAILURES} times (attempt "
                f"{attempts} pending)",
            )
        payloads = converter.payload_converter
        base = replayed.state or start_state(events, payloads)
        group, now = base.group, time.time()
        served = sum(1 for event in events if event.event_type == COMPLETED_TASK)
        allowed_at = healing.heal_allowed_at(base.heal_times, now, served)
        if allowed_at > now:
            record_heal(group, "held-off", failure.kind)
            recent = healing.recent_heals(base.heal_times, now)
            return Examined(
                "held-off",
                f"group {group} heals again in {allowed_at - now:.0f} s: it was rebuilt {recent} "
                f"times in the last {healing.HEAL_WINDOW_SECONDS:.0f} s and each new run failed "
                f"before it served ({cause}), so it is not rebuilt in a loop. Look for the cause "
                "in this log: a scheduler fixed and restarted runs the group again by itself",
                retry_in=allowed_at - now,
            )
        record = read_run(events, payloads)
        # The rebuilt state holds the task that completed at the event after its start.
        boundary = replayed.task_started + 1 if replayed.state is not None else 0
        facts, touched = facts_after(events, boundary, record, now)
        rebuilt_from = (
            f"the replay of its history to event {boundary}"
            if replayed.state is not None
            else "the run's start"
        )
        rebuild = healing.HealInput(
            cause=f"{failure.kind}: {cause}",
            failed_run_id=failure.run_id,
            rebuilt_from=rebuilt_from,
            facts=facts,
            plans_sent=record.plans_sent,
            epochs_sent=record.epochs_sent,
            incarnations_sent=record.incarnations_sent,
            touched_nodes=touched,
        )
        given = start_input(events, payloads)
        new_input = GroupInput(group=given.group, state=base, heal=rebuild)
        try:
            run_id = await start_healed_run(client, current, events[0], new_input)
        except RPCError as error:
            raise RuntimeError(f"Temporal refused the new run: {error.message}") from error
        record_heal(group, "healed", failure.kind)
        heard = self._first_heard.get(failure.run_id, time.monotonic())
        return Examined(
            "healed",
            f"group {group} healed: run {failure.run_id} failed its workflow task "
            f"({failure.kind}: {cause}); new run {run_id} rebuilt from {rebuilt_from} and "
            f"{len(facts)} later facts, {time.monotonic() - heard:.2f} s after the first "
            "failure this scheduler heard of",
            run_id,
        )


# The SDK's core wraps the cause in a debug rendering of its Failure.
CORE_MESSAGE = re.compile(r'message: "((?:[^"\\]|\\.)*)"')


def _one_line(message: str) -> str:
    found = CORE_MESSAGE.search(message)
    line = " ".join((found.group(1) if found else message).split())
    return line if len(line) <= CAUSE_CHARACTERS else line[: CAUSE_CHARACTERS - 1] + "…"
