"""What a group's history recorded after the point its state was rebuilt
to: each message's outcome as its job was told it (timeshare.scheduling.
healing's facts), and what the run sent to the nodes. Read from the events
themselves, never by running workflow code: the code could not replay them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import PayloadConverter

from timeshare.models import AcquireResult, KeepTurnOutput, ReleaseInput, SwitchInput
from timeshare.names import node_task_queue
from timeshare.refusals import Refusal
from timeshare.scheduling import events as ev
from timeshare.scheduling import healing as heal
from timeshare.scheduling.state import StoredGrant

# The events a workflow task's commands write, right after its completion.
COMMAND_EVENTS = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED,
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_TIMER_CANCELED,
    EventType.EVENT_TYPE_MARKER_RECORDED,
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}
# What each update of GroupWorkflow takes: the core's event.
UPDATE_INPUTS: dict[str, type[Any]] = {
    "join": ev.Join,
    "acquire": ev.Acquire,
    "keep_turn": ev.KeepTurn,
    "cancel_acquire": ev.CancelAcquire,
    "yield": ev.Yield,
    "heartbeat": ev.Heartbeat,
    "leave": ev.Leave,
    "evict": ev.Evict,
    "pause": ev.Pause,
    "drain": ev.Drain,
}
# An acquire refused with these never reached the queue: the turn it would
# have given back first (next_turn) is still held.
REFUSED_BEFORE_QUEUED = {
    Refusal.INVALID_ARGUMENT,
    Refusal.NOT_FOUND,
    Refusal.UNAUTHENTICATED,
    Refusal.PERMISSION_DENIED,
    Refusal.FAILED_PRECONDITION,
    Refusal.INTERNAL,
}
NODE_QUEUE_PREFIX = node_task_queue("")


@dataclass
class _Update:
    name: str
    input: Any
    # The completion: None while none was recorded; else (succeeded, its
    # result or the failure's type).
    outcome: tuple[bool, Any] | None = None


@dataclass
class RunRecord:
    """What a run's whole history says, read once."""

    updates: dict[str, _Update] = field(default_factory=dict)
    # Each activity (by its scheduled event's id) and the node it ran on.
    activity_nodes: dict[int, str] = field(default_factory=dict)
    plans_sent: int = 0
    epochs_sent: int = 0
    incarnations_sent: int = 0


def read_run(events: Sequence[HistoryEvent], converter: PayloadConverter) -> RunRecord:
    record = RunRecord()
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            name = request.input.name
            if name in UPDATE_INPUTS:
                value = _decode(converter, request.input.args, UPDATE_INPUTS[name])
                record.updates[request.meta.update_id] = _Update(name, value)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            completed = event.workflow_execution_update_completed_event_attributes
            update = record.updates.get(completed.meta.update_id)
            if update is not None:
                update.outcome = _outcome(converter, update.name, completed.outcome)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            _note_activity(record, event, converter)
    return record


def facts_after(
    events: Sequence[HistoryEvent], after: int, record: RunRecord, heal_at: float
) -> tuple[list[heal.HealFact], list[str]]:
    """The facts recorded after event ``after`` (a completed workflow task,
    whose own commands the rebuilt state holds already; 0: from the start),
    and the nodes touched since."""
    facts: list[heal.HealFact] = []
    touched: set[str] = set()
    skipping = after > 0
    for event in events:
        if event.event_id <= after:
            continue
        if skipping and event.event_type in COMMAND_EVENTS:
            continue
        skipping = False
        at = event.event_time.ToDatetime().timestamp() if event.HasField("event_time") else heal_at
        facts += _facts_of(event, record, at)
        node = _activity_node(event, record)
        if node:
            touched.add(node)
    return facts, sorted(touched)


def _facts_of(event: HistoryEvent, record: RunRecord, at: float) -> list[heal.HealFact]:
    kind = event.event_type
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
        update_id = event.workflow_execution_update_accepted_event_attributes.protocol_instance_id
        update = record.updates.get(update_id)
        return _asked(update, at) if update is not None and update.name == "acquire" else []
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
        update_id = event.workflow_execution_update_completed_event_attributes.meta.update_id
        update = record.updates.get(update_id)
        return _told(update, at) if update is not None and update.outcome is not None else []
    return []


def _asked(update: _Update, at: float) -> list[heal.HealFact]:
    message: ev.Acquire = update.input
    facts: list[heal.HealFact] = []
    outcome = update.outcome
    refused = outcome is not None and not outcome[0] and outcome[1] in REFUSED_BEFORE_QUEUED
    if message.yield_epoch and not refused:
        given = ev.Yield(message.job, message.token_hash, message.yield_epoch)
        facts.append(heal.GaveBack(given=given, at=at))
    facts.append(heal.Asked(acquire=message, at=at))
    return facts


def _told(update: _Update, at: float) -> list[heal.HealFact]:
    assert update.outcome is not None
    succeeded, result = update.outcome
    message = update.input
    if update.name == "acquire":
        if not succeeded:
            withdrawn = ev.CancelAcquire(message.job, message.token_hash, message.request_id)
            return [heal.Withdrew(withdrawn=withdrawn, at=at)]
        grant = result.grant if isinstance(result, AcquireResult) else None
        return [] if grant is None else [heal.Granted(grant=StoredGrant.of_grant(grant), at=at)]
    if not succeeded:
        return []
    match update.name:
        case "join":
            return [heal.Joined(join=message, at=at)]
        case "leave":
            return [heal.Left(leave=message, at=at)]
        case "heartbeat":
            return [heal.Heard(heartbeat=message, at=at)]
        case "yield":
            return [heal.GaveBack(given=message, at=at)]
        case "keep_turn" if isinstance(result, KeepTurnOutput):
            return [heal.KeptTurn(grant=StoredGrant.of_grant(result.grant), at=at)]
        case "cancel_acquire" if result is True:
            return [heal.Withdrew(withdrawn=message, at=at)]
        case "evict" if result is True:
            return [heal.Evicted(evict=message, at=at)]
        case "pause":
            return [heal.Paused(pause=message, at=at)]
        case "drain":
            return [heal.Drained(drain=message, at=at)]
    return []


# What each update's success carries, where a fact needs it.
UPDATE_RESULTS: dict[str, type[Any]] = {
    "acquire": AcquireResult,
    "keep_turn": KeepTurnOutput,
    "cancel_acquire": bool,
    "evict": bool,
}


def _outcome(converter: PayloadConverter, name: str, outcome: Any) -> tuple[bool, Any]:
    if outcome.HasField("failure"):
        failure = outcome.failure
        if failure.HasField("application_failure_info"):
            return False, failure.application_failure_info.type
        return False, ""
    result_type = UPDATE_RESULTS.get(name)
    if result_type is None or not outcome.success.payloads:
        return True, None
    return True, _decode(converter, outcome.success, result_type)


def _note_activity(record: RunRecord, event: HistoryEvent, converter: PayloadConverter) -> None:
    scheduled = event.activity_task_scheduled_event_attributes
    queue = scheduled.task_queue.name
    if queue.startswith(NODE_QUEUE_PREFIX):
        record.activity_nodes[event.event_id] = queue.removeprefix(NODE_QUEUE_PREFIX)
    name = scheduled.activity_type.name
    if name == "switch":
        switch: SwitchInput = _decode(converter, scheduled.input, SwitchInput)
        record.plans_sent = max(record.plans_sent, switch.plan)
        record.epochs_sent = max(record.epochs_sent, switch.epoch)
        record.incarnations_sent = max([record.incarnations_sent, *switch.incarnations.values()])
    elif name == "release":
        release: ReleaseInput = _decode(converter, scheduled.input, ReleaseInput)
        record.incarnations_sent = max(record.incarnations_sent, release.incarnation)


def _activity_node(event: HistoryEvent, record: RunRecord) -> str:
    """The node an activity event concerns ("" for any other event)."""
    if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return record.activity_nodes.get(event.event_id, "")
    for attributes in (
        event.activity_task_started_event_attributes,
        event.activity_task_completed_event_attributes,
        event.activity_task_failed_event_attributes,
        event.activity_task_timed_out_event_attributes,
        event.activity_task_canceled_event_attributes,
    ):
        if attributes.scheduled_event_id:
            return record.activity_nodes.get(attributes.scheduled_event_id, "")
    return ""


def _decode(converter: PayloadConverter, payloads: Payloads, kind: type[Any]) -> Any:
    return converter.from_payloads(list(payloads.payloads), [kind])[0]
