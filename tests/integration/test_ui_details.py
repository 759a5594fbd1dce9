"""What the Temporal UI shows of a group: its static summary and details,
and its current details, one field per line, read from the dev server's own
UI (2.54) in headless Chromium.

The same text without a browser: tests/unit/test_ui_details.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Worker

import timeshare.aio
from tests.browser import HeadlessPage
from tests.conftest import SimNodes, TemporalServer
from timeshare.models import GroupPolicy
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID, group_workflow_id
from timeshare.workflows.registry import REGISTRY_DETAILS
from timeshare.workflows.ui_text import REGISTRY_SUMMARY

# The UI renders each piece of markdown in an iframe of its own (/render?content=...).
FRAME_TEXT = (
    "(() => {{ const f = document.getElementById('user-metadata-{0}');"
    " return f && f.contentDocument && f.contentDocument.body"
    " ? f.contentDocument.body.innerText : ''; }})()"
)


RENDER_SECONDS = 20.0


@contextlib.asynccontextmanager
async def two_turns_taken(
    api: timeshare.aio.Client, group: str, nodes: SimNodes
) -> AsyncIterator[tuple[str, str]]:
    """Job a on one node, b on another: a takes a turn, then b holds while a
    waits, each job's state resident on its node. Yields the node names."""
    first, second = f"{group}-n1", f"{group}-n2"
    await nodes.start(first)
    await nodes.start(second)
    # No prefetch: every switch is one a job asked for, so the count is known.
    a = await api.join(
        group, "a", nodes=[first], policy=GroupPolicy(max_turn_seconds=600, prefetch="off")
    )
    b = await api.join(group, "b", nodes=[second])
    await a.acquire()
    await a.yield_()
    await b.acquire()
    waiting = asyncio.get_running_loop().create_task(a.acquire())
    try:
        yield first, second
    finally:
        await b.yield_()
        await waiting
        await a.leave()
        await b.leave()


async def details_now(client: Client, workflow_id: str) -> str:
    metadata = await client.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return str(metadata.current_details)


async def until_details_say(client: Client, workflow_id: str, line: str) -> str:
    for _ in range(100):
        details = await details_now(client, workflow_id)
        if line in details.splitlines():
            return details
        await asyncio.sleep(0.1)
    raise AssertionError(f"the current details never said {line!r}: {details!r}")


def read_the_page(url: str, waited_for: str, folder: Path) -> dict[str, str]:
    """Each metadata frame's text, once the current details name
    ``waited_for``; a screenshot of the page in ``folder``."""
    page = HeadlessPage(folder / "profile", width=1280, height=1100)
    try:
        page.open(url)
        page.wait_for(
            f"{FRAME_TEXT.format('current-details')}.includes({waited_for!r})",
            RENDER_SECONDS,
            "the current details",
        )
        shown = {part: page.evaluate(FRAME_TEXT.format(part)) for part in ("summary", "details")}
        shown["current-details"] = page.evaluate(FRAME_TEXT.format("current-details"))
        page.screenshot(folder / "group-in-temporal-ui.png")
        return shown
    finally:
        page.close()


async def test_a_group_says_what_it_is(
    client: Client, api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group = f"said-{unique}"
    handle = client.get_workflow_handle(group_workflow_id(group))
    async with two_turns_taken(api, group, sim_nodes) as (first, second):
        shown = await until_details_say(client, handle.id, "- **queue**: a")
        described = await handle.describe()
    summary = await described.static_summary()
    details = await described.static_details()
    assert summary == f"timeshare lock queue of group {group}: its jobs take turns on shared GPUs"
    assert details is not None and details.startswith(
        f"Group **{group}** is a timeshare lock queue"
    )
    lines = details.splitlines()
    # The policy of the join that started the group, not a default.
    assert any(
        line.startswith("- **long turns**: with others waiting, a turn over 600 s")
        for line in lines
    )
    assert f"- **see it**: `timeshare status {group}`; the current details below" in lines
    assert shown.splitlines()[2:] == [
        "- **holder**: b",
        "- **queue**: a",
        "- **state**: held, epoch 2, 2 switches",
        "- **ordering**: fair",
        f"- **node {first}**: a",
        f"- **node {second}**: b",
    ]
    registry = await client.get_workflow_handle(NODE_REGISTRY_WORKFLOW_ID).describe()
    assert await registry.static_summary() == REGISTRY_SUMMARY
    assert await registry.static_details() == REGISTRY_DETAILS


@pytest.mark.browser
async def test_the_ui_shows_each_field_on_a_line_of_its_own(
    temporal_server: TemporalServer,
    client: Client,
    scheduler: Worker,
    api: timeshare.aio.Client,
    sim_nodes: SimNodes,
    unique: str,
    tmp_path: Path,
) -> None:
    group = f"shown-{unique}"
    workflow_id = group_workflow_id(group)
    async with two_turns_taken(api, group, sim_nodes) as (first, second):
        await until_details_say(client, workflow_id, "- **queue**: a")
        run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
        page = f"/namespaces/default/workflows/{workflow_id}/{run_id}/user-metadata"
        # In a thread: the UI asks the workflow for its details, and this
        # event loop runs the worker that answers.
        shown = await asyncio.to_thread(
            read_the_page, temporal_server.ui_url + page, second, tmp_path
        )
    current = [line.strip() for line in shown["current-details"].splitlines() if line.strip()]
    assert current[1:] == [
        "holder: b",
        "queue: a",
        "state: held, epoch 2, 2 switches",
        "ordering: fair",
        f"node {first}: a",
        f"node {second}: b",
    ], shown["current-details"]
    assert group in shown["summary"] and "lock queue" in shown["summary"]
    assert (
        f"see it: timeshare status {group}; the current details below"
        in shown["details"].splitlines()
    )
