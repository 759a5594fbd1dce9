"""Traces, metrics, search attributes and history: what an engineer looks at
when a step time doubles."""

from __future__ import annotations

import asyncio
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Worker

import timeshare.aio
from tests.conftest import REPO, SimNodes, wait_for_line
from tests.gateways import RunningGateway, start_gateway
from tests.service_loop import ServiceLoop
from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id
from timeshare.testing import free_port, timeshare_command
from timeshare.workers.common.service import connect_temporal
from timeshare.workers.common.telemetry import Telemetry
from timeshare.workflows.visibility import HOLDER, QUEUE_DEPTH, STATE

STATE_BYTES = 2**26
TURNS_EACH = 3


@dataclass
class Observed:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader


@pytest.fixture(scope="module")
def observed() -> Iterator[Observed]:
    """In-memory exporters behind the global providers (installed once per process)."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    if trace.get_tracer_provider() is not tracer_provider:
        pytest.skip("another test installed OpenTelemetry providers first")
    yield Observed(spans, reader)


@dataclass
class TracedStack:
    gateway: RunningGateway
    nodes: SimNodes
    client: Client


@pytest.fixture(scope="module")
async def traced(
    observed: Observed, temporal_address: str, scheduler: Worker, service_loop: ServiceLoop
) -> AsyncIterator[TracedStack]:
    """A gateway and node agents whose Temporal clients carry the tracing
    interceptor, on the service loop as the session's are."""
    telemetry = Telemetry.with_global_providers()
    client = await service_loop.call(connect_temporal(temporal_address, telemetry=telemetry))
    gateway = await service_loop.call(start_gateway(temporal_address, telemetry=telemetry))
    nodes = SimNodes(client, service_loop)
    yield TracedStack(gateway, nodes, client)
    await nodes.stop()
    await service_loop.call(gateway.close())


async def take_turns(address: str, group: str, node: str) -> None:
    api = timeshare.aio.connect(address)
    # No prefetch: every switch is one a turn asked for, so they can be counted.
    policy = GroupPolicy(prefetch="off")
    try:
        a = await api.join(group, "a", nodes=[node], policy=policy)
        b = await api.join(group, "b", nodes=[node])
        for _ in range(TURNS_EACH):
            for job in (a, b):
                async with job.turn():
                    pass
        await a.leave()
        await b.leave()
    finally:
        await api.close()


def trace_of(spans: list[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and s.context.trace_id == trace_id]


async def test_one_trace_from_acquire_to_the_backend_restore(
    traced: TracedStack, observed: Observed, unique: str
) -> None:
    node, group = f"n-{unique}", f"traced-{unique}"
    await traced.nodes.start(node, state_bytes=STATE_BYTES)
    await take_turns(traced.gateway.address, group, node)
    spans = list(observed.spans.get_finished_spans())
    restores = [
        s
        for s in spans
        if s.name == "timeshare.restore"
        and s.attributes is not None
        and s.attributes.get("timeshare.job") == "b"
        and any(
            p.name == "timeshare.switch"
            and p.attributes is not None
            and p.attributes.get("timeshare.group") == group
            for p in spans
            if p.context is not None
            and s.parent is not None
            and p.context.span_id == s.parent.span_id
        )
    ]
    assert restores, "no restore span for job b in this group"
    whole = trace_of(spans, restores[0].context.trace_id)
    names = {s.name for s in whole}
    assert "/timeshare.v1.TimeSlicer/Acquire" in names  # the job's own call, and the gateway's
    assert {"timeshare.switch", "timeshare.checkpoint", "timeshare.restore"} <= names
    assert "StartWorkflowUpdate:acquire" in names  # Temporal's own interceptor, same trace
    kinds = {s.kind for s in whole if s.name == "/timeshare.v1.TimeSlicer/Acquire"}
    assert kinds == {trace.SpanKind.CLIENT, trace.SpanKind.SERVER}
    # Connected: one root (the client's call), every other span's parent in the trace.
    ids = {s.context.span_id for s in whole if s.context is not None}
    roots = [s for s in whole if s.parent is None or s.parent.span_id not in ids]
    assert len(roots) == 1 and roots[0].kind == trace.SpanKind.CLIENT, [r.name for r in roots]


def metric_points(reader: InMemoryMetricReader, name: str, group: str) -> list[object]:
    data = reader.get_metrics_data()
    points: list[object] = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    points += [
                        p
                        for p in metric.data.data_points
                        if p.attributes is not None and p.attributes.get("group") == group
                    ]
    return points


async def test_metrics_count_turns_switches_and_bytes_exactly(
    traced: TracedStack, observed: Observed, unique: str
) -> None:
    node, group = f"n-{unique}", f"metered-{unique}"
    await traced.nodes.start(node, state_bytes=STATE_BYTES)
    await take_turns(traced.gateway.address, group, node)
    reader = observed.metrics
    turns = 2 * TURNS_EACH
    waits = metric_points(reader, "timeshare.acquire.wait", group)
    assert sum(p.count for p in waits) == turns  # type: ignore[attr-defined]
    held = metric_points(reader, "timeshare.turn.duration", group)
    assert sum(p.count for p in held) == turns  # type: ignore[attr-defined]
    phases = {
        p.attributes["phase"]: p.count  # type: ignore[attr-defined]
        for p in metric_points(reader, "timeshare.switch.duration", group)
    }
    # Each turn needs a switch (the other job is resident); the first evicts nothing.
    assert phases == {"restore": turns, "checkpoint": turns - 1}
    moved = sum(p.value for p in metric_points(reader, "timeshare.bytes.moved", group))  # type: ignore[attr-defined]
    # Every checkpoint moves the state; every restore but the first of each job too.
    assert moved == ((turns - 1) + (turns - 2)) * STATE_BYTES
    # The group's own history agrees with the agents' metrics.
    api = timeshare.aio.connect(traced.gateway.address)
    try:
        history = await api.group_history(group)
    finally:
        await api.close()
    assert [t.job for t in history.turns] == ["a", "b"] * TURNS_EACH
    assert all(t.released_at >= t.granted_at >= t.requested_at for t in history.turns)
    assert len(history.switches) == turns and all(s.ok for s in history.switches)
    assert sum(s.bytes_moved for s in history.switches) == moved


async def test_search_attributes_and_details_show_the_group(
    traced: TracedStack, unique: str
) -> None:
    node, group = f"n-{unique}", f"visible-{unique}"
    await traced.nodes.start(node, state_bytes=STATE_BYTES)
    api = timeshare.aio.connect(traced.gateway.address)
    client = traced.client
    workflow_id = group_workflow_id(group)
    try:
        a = await api.join(group, "a", nodes=[node])
        b = await api.join(group, "b", nodes=[node])
        await a.acquire()
        waiting = asyncio.create_task(b.acquire())
        query = (
            f"WorkflowId = '{workflow_id}' AND TimeshareHolder = 'a' AND TimeshareQueueDepth = 1"
        )
        assert await eventually_found(client, query)
        details = await current_details(client, workflow_id)
        lines = details.splitlines()
        assert "- **holder**: a" in lines and "- **queue**: b" in lines
        assert f"- **node {node}**: a" in lines
        await a.yield_()
        await waiting
        await b.yield_()
        assert await eventually_found(
            client, f"WorkflowId = '{workflow_id}' AND TimeshareState = 'idle'"
        )
        await a.leave()
        await b.leave()
    finally:
        await api.close()


async def test_a_quick_hand_over_writes_only_what_changed(traced: TracedStack, unique: str) -> None:
    """A switch like the group's last (quick) one is not published as
    `switching`: the yield's workflow task upserts nothing, and each upsert
    carries only the attributes that changed. What is published at the end is
    still the whole truth."""
    node, group = f"n-{unique}", f"lean-{unique}"
    await traced.nodes.start(node, state_bytes=STATE_BYTES)
    api = timeshare.aio.connect(traced.gateway.address)
    handle = traced.client.get_workflow_handle(group_workflow_id(group))
    try:
        a = await api.join(group, "a", nodes=[node], policy=GroupPolicy(prefetch="off"))
        b = await api.join(group, "b", nodes=[node])
        await a.acquire()  # the group's first switch, recorded as quick
        waiting = asyncio.create_task(b.acquire())
        assert await eventually_found(
            traced.client, f"WorkflowId = '{handle.id}' AND TimeshareQueueDepth = 1"
        )
        await a.yield_()
        await waiting
        events = [event async for event in handle.fetch_history_events()]
        attributes = await handle.describe()
        await b.yield_()
        await a.leave()
        await b.leave()
    finally:
        await api.close()
    yielded = next(i for i, e in enumerate(events) if accepted_update(e) == "yield")
    switch = next(i for i, e in enumerate(events[yielded:], yielded) if e.HasField(
        "activity_task_scheduled_event_attributes"))  # fmt: skip
    assert not [e for e in events[yielded:switch] if upserted(e)], "the quick switch was shown"
    after_join = [
        set(upserted(e))
        for e in events[next(i for i, e in enumerate(events) if accepted_update(e) == "acquire") :]
        if upserted(e)
    ]
    assert after_join == [
        # The group's first switch, to a: no switch before it to tell its speed by.
        {"TimeshareState", "TimeshareQueueDepth"},
        {"TimeshareHolder", "TimeshareQueueDepth", "TimeshareState"},  # a holds
        {"TimeshareQueueDepth"},  # b waits
        # b holds: the switch to it was never shown, so the state is unchanged.
        {"TimeshareHolder", "TimeshareQueueDepth"},
    ]
    shown = attributes.typed_search_attributes
    assert (shown.get(HOLDER), shown.get(QUEUE_DEPTH), shown.get(STATE)) == ("b", 0, "held")


def accepted_update(event: HistoryEvent) -> str:
    if not event.HasField("workflow_execution_update_accepted_event_attributes"):
        return ""
    return event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name


def upserted(event: HistoryEvent) -> list[str]:
    if not event.HasField("upsert_workflow_search_attributes_event_attributes"):
        return []
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
    # The SDK's own record of patches (workflow.patched) is not the group's.
    return [name for name in fields.indexed_fields if name != "TemporalChangeVersion"]


async def eventually_found(client: Client, query: str) -> bool:
    for _ in range(100):  # visibility lags the workflow
        if [w async for w in client.list_workflows(query)]:
            return True
        await asyncio.sleep(0.2)
    return False


async def current_details(client: Client, workflow_id: str) -> str:
    metadata = await client.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return str(metadata.current_details)


async def test_report_draws_a_live_group(traced: TracedStack, unique: str, tmp_path: Path) -> None:
    node, group = f"n-{unique}", f"drawn-{unique}"
    await traced.nodes.start(node, state_bytes=STATE_BYTES)
    await take_turns(traced.gateway.address, group, node)
    out = tmp_path / "timeline.html"
    report = await asyncio.create_subprocess_exec(
        *timeshare_command(
            "report", "--group", group, f"--out={out}", f"--address={traced.gateway.address}"
        ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    stdout, stderr = await report.communicate()
    assert report.returncode == 0, stderr.decode()
    assert stdout.decode().strip() == str(out)
    page = out.read_text()
    assert group in page and f">{node}<" in page.replace("\n", "")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def test_an_agent_serves_prometheus_metrics_with_temporals_own(
    gateway: str, temporal_address: str, unique: str, tmp_path: Path
) -> None:
    node, port = f"prom-{unique}", free_port()
    agent = subprocess.Popen(
        timeshare_command(
            "agent", f"--node={node}", f"--temporal={temporal_address}",
            f"--socket={tmp_path / 'agent.sock'}", f"--metrics-port={port}",
        ),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        wait_for_line(agent, "ready:", 60)
        await take_turns(gateway, f"prom-{unique}", node)
        text = scrape(port)
        assert (
            f'timeshare_switch_duration_seconds_count{{backend="sim",group="prom-{unique}"' in text
        )
        assert "timeshare_bytes_moved_bytes_total" in text
        assert "temporal_" in text  # the SDK's own metrics, same endpoint
        assert "timeshare_gpu_utilization" not in text  # no GPU here: absent, not zero
    finally:
        agent.terminate()
        agent.wait(timeout=30)
