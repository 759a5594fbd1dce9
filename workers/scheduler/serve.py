"""The scheduler worker: runs GroupWorkflow and the node registry. Stateless."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from datetime import timedelta

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.service import RPCError
from temporalio.worker import Worker

from timeshare.names import SCHEDULER_TASK_QUEUE
from timeshare.workers.common.event_loop import running_event_loop
from timeshare.workers.common.service import StartupError, ready, wait_for_temporal
from timeshare.workers.common.telemetry import Telemetry
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.scheduler.healing.failure_watch import FailureWatch
from timeshare.workers.scheduler.healing.healer import GroupHealer
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import NodeRegistryWorkflow
from timeshare.workflows.sandbox import workflow_runner
from timeshare.workflows.visibility import SEARCH_ATTRIBUTES

log = logging.getLogger("timeshare.scheduler")

STICKY_TIMEOUT = timedelta(seconds=2)


async def check_search_attributes(client: Client) -> None:
    """Refuse to start where the group workflow could not publish its state:
    an upsert of an unknown search attribute fails every workflow task."""
    request = ListSearchAttributesRequest(namespace=client.namespace)
    try:
        known = await client.operator_service.list_search_attributes(request)
    except RPCError as error:
        # Temporal Cloud registers attributes through its own API, not this one.
        log.warning("cannot list search attributes (%s); assuming they exist", error.message)
        return
    kinds = {k: IndexedValueType.Name(v) for k, v in known.custom_attributes.items()}
    missing = [
        name
        for name, kind in SEARCH_ATTRIBUTES.items()
        if kinds.get(name) != f"INDEXED_VALUE_TYPE_{kind.upper()}"
    ]
    if missing:
        commands = "; ".join(
            f"temporal operator search-attribute create --namespace {client.namespace} "
            f"--name {name} --type {SEARCH_ATTRIBUTES[name]}"
            for name in missing
        )
        raise StartupError(
            f"namespace {client.namespace!r} lacks the search attributes {', '.join(missing)}; "
            f"register them: {commands}"
        )


def external_storage_concurrency(converter: DataConverter) -> int:
    """How many external-storage visits an activation runs at once. The SDK
    visits every activation's payloads, and every completion's, for external
    storage (payloads kept outside history) even where none is set; at its
    default concurrency of 3 each visit of a payload list is an asyncio task
    of its own, at 1 a plain call. timeshare's converter has no external
    storage (workers/scheduler/data_converter.py), so one at a time costs nothing and
    saves about 4 % of the scheduler's CPU per hand-over (docs/benchmarks.md,
    "Scale"). A converter with external storage keeps the SDK's
    default."""
    return 1 if converter.external_storage is None else sdk_external_storage_concurrency()


def sdk_external_storage_concurrency() -> int:
    """The SDK's default, as its Worker declares it."""
    parameter = inspect.signature(Worker).parameters[
        "max_workflow_task_external_storage_concurrency"
    ]
    return int(parameter.default)


def activations_inline(sandboxed: bool, deadlock_detection: bool) -> bool:
    """Whether the worker runs each workflow activation on its event loop
    rather than on a thread of its pool. Inline saves about a tenth of the
    scheduler's CPU per hand-over (docs/benchmarks.md, "Scale"): no
    hand-off to a thread and back, no deadlock timer per activation. What
    the pool adds is the SDK's deadlock detection, which fails an activation
    that runs past 2 s. The group workflow's code cannot block (no I/O, no
    waits but Temporal's), and on a machine loaded enough to stall an
    activation for 2 s the detector fails sound tasks. Where it is wanted
    (say, trying a patched workflow), ``--deadlock-detection`` brings it back.
    The sandbox keeps the pool: inline, the SDK would relax the sandbox for
    a debugger."""
    return not (sandboxed or deadlock_detection)


async def serve_scheduler(
    stop: asyncio.Event,
    temporal: TemporalSettings,
    telemetry: Telemetry | None = None,
    sandboxed: bool = False,
    deadlock_detection: bool = False,
    group_workflows: Sequence[type] = (GroupWorkflow,),
) -> None:
    """``group_workflows``: the class that runs GroupWorkflow (a stand-in of
    the benchmarks' for one that disagrees with a history, say). Serve the
    group workflows until ``stop``; outside the SDK's sandbox
    unless ``sandboxed`` (timeshare.workflows.sandbox says why); each
    activation on the event loop unless ``deadlock_detection`` or
    ``sandboxed`` (activations_inline says why)."""
    telemetry = telemetry or Telemetry()
    client = await wait_for_temporal(temporal, "scheduler", stop, telemetry)
    await check_search_attributes(client)
    telemetry.start()
    inline = activations_inline(sandboxed, deadlock_detection)
    healer = GroupHealer(client, group_workflows)
    worker = Worker(
        client,
        task_queue=SCHEDULER_TASK_QUEUE,
        workflows=[*group_workflows, NodeRegistryWorkflow],
        # Every task it fails is heard by the healer (docs/reliability.md,
        # "A group that cannot be replayed").
        workflow_runner=FailureWatch(workflow_runner(sandboxed), healer.heard),
        # A group's next task waits this long for a worker that died holding
        # its cached history before any other replica takes it (default 10 s).
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        # The SDK's one way to run activations inline (it names it for
        # debuggers); nothing else of it applies outside the sandbox.
        debug_mode=inline,
        max_workflow_task_external_storage_concurrency=external_storage_concurrency(
            client.data_converter
        ),
    )
    async with healer.running(), worker:
        where = f"task queue {SCHEDULER_TASK_QUEUE} on {temporal.describe()}"
        if sandboxed:
            where += ", workflows in the SDK's sandbox"
        elif not inline:
            where += ", activations on threads with deadlock detection"
        where += f", event loop {running_event_loop()}"
        ready("scheduler", where)
        await stop.wait()
    await telemetry.close()
