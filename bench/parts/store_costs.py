"""What each building block of a hand-over costs Temporal's store, measured
on the benchmark's own server before its load: a DescribeWorkflowExecution
(a turn watch's read), a trivial update, one that also upserts a search
attribute, and an update awaiting one activity on another task queue.
bench.scale splits a hand-over's store requests by these, so
the part no building block explains is left to look at.

Requests to the store are the server's own counters
(bench.parts.temporal_operations), read around each block's calls; the
server's background (a few requests a second) falls into each window too.
"""

from __future__ import annotations

import asyncio
import urllib.error
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle

from bench.parts.floor_layers import FloorWorkflow, start_floor
from bench.parts.floors import floor_workers
from bench.parts.temporal_operations import Key, read

CALLS = 40
SETTLE_SECONDS = 1.2
STORE = "persistence_requests"
DESCRIBE = "DescribeWorkflowExecution"
UPDATE = "trivial update"
SEARCH_ATTRIBUTES = "update upserting a search attribute"
ACTIVITY = "update awaiting one remote activity"


@dataclass(frozen=True)
class StoreCosts:
    """Store requests per call of each block (``error``: why none were read)."""

    per_call: dict[str, float]
    error: str = ""

    @property
    def search_attribute_upsert(self) -> float:
        """What an upsert adds to the update that makes it."""
        return self.per_call[SEARCH_ATTRIBUTES] - self.per_call[UPDATE]

    @property
    def pair(self) -> float:
        """The floor's pair: a trivial update and one awaiting an activity."""
        return self.per_call[UPDATE] + self.per_call[ACTIVITY]


async def measure_store_costs(client: Client, metrics_port: int, calls: int = CALLS) -> StoreCosts:
    async with floor_workers(client) as queue:
        plain = await start_floor(client, queue)
        publishing = await start_floor(client, queue, publishes=True)
        blocks: dict[str, Callable[[], Awaitable[Any]]] = {
            DESCRIBE: plain.describe,
            UPDATE: lambda: plain.execute_update(FloorWorkflow.ping),
            SEARCH_ATTRIBUTES: lambda: publishing.execute_update(FloorWorkflow.ping),
            ACTIVITY: lambda: plain.execute_update(FloorWorkflow.via_activity),
        }
        for call in blocks.values():
            for _ in range(3):  # warmed up: each workflow cached, its task queue sticky
                await call()
        per_call: dict[str, float] = {}
        try:
            before = await _settled(metrics_port)
            for name, call in blocks.items():
                for _ in range(calls):
                    await call()
                after = await _settled(metrics_port)
                per_call[name] = (_store(after) - _store(before)) / calls
                before = after
        except (urllib.error.URLError, OSError) as error:
            return StoreCosts({}, f"Temporal's metrics on port {metrics_port}: {error}")
        await _finish(plain, publishing)
    return StoreCosts(per_call)


async def _settled(port: int) -> Counter[Key]:
    """The server's counters once what it did so far has reached them (its
    metrics are flushed about once a second)."""
    await asyncio.sleep(SETTLE_SECONDS)
    return read(port)


def _store(counts: Counter[Key]) -> int:
    return sum(n for (metric, _, _), n in counts.items() if metric == STORE)


async def _finish(*handles: WorkflowHandle[FloorWorkflow, None]) -> None:
    for handle in handles:
        await handle.signal(FloorWorkflow.finish)


@dataclass(frozen=True)
class HandoverStore:
    """A hand-over's store requests and the blocks it made, per hand-over."""

    total: float
    describes: float
    search_attribute_upserts: float


def explained(costs: StoreCosts, handover: HandoverStore) -> list[list[str]]:
    """Rows [what, block count, store requests, needed by the hand-over?]
    splitting a hand-over's store requests by its blocks' measured costs;
    the last row is what they leave unexplained."""
    c = costs
    parts = [
        ("the floor's pair: a trivial update, an update awaiting an activity", 1.0, c.pair,
         "yes: a yield, and an acquire granted after a switch"),
        ("DescribeWorkflowExecution (turn watches)", handover.describes,
         c.per_call[DESCRIBE], "no: a holder's watch, once per turn and every few seconds"),
        ("search-attribute upserts", handover.search_attribute_upserts,
         c.search_attribute_upsert, "no: what `temporal workflow list` filters on"),
    ]  # fmt: skip
    rows = [[what, f"{n:.2f}", f"{n * each:.1f}", why] for what, n, each, why in parts]
    rest = handover.total - sum(n * each for _, n, each, _ in parts)
    rows.append(["the rest: the acquire's own task, timers, renewals, memo", "-", f"{rest:.1f}",
                 "partly: an acquire that waits is accepted in a task of its own"])  # fmt: skip
    rows.append(["all", "-", f"{handover.total:.1f}", ""])
    return rows
