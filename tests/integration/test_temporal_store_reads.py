"""The embedded Temporal reads its registered search attributes from its store
once a minute, not at every use: left to its own default, the dev server read
them again for each upsert's validation and each visibility write, a third of
a hand-over's store requests (`bench scale --quick`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.parts.temporal_operations import TemporalOperations
from tests.conftest import start_until_ready
from tests.polling import wait_until_async
from timeshare.testing import free_port, timeshare_command
from timeshare.workflows.visibility import HOLDER, QUEUE_DEPTH

UPSERTS = 10
METADATA_READ = ("persistence_requests", "history", "GetCurrentClusterMetadata")


@workflow.defn(sandboxed=False)
class Upserting:
    """Publishes as a group does: one upsert per workflow task."""

    @workflow.run
    async def run(self, count: int) -> None:
        for depth in range(count):
            workflow.upsert_search_attributes(
                [HOLDER.value_set(f"job-{depth}"), QUEUE_DEPTH.value_set(depth)]
            )
            await workflow.sleep(0.01)


@dataclass(frozen=True)
class MeteredTemporal:
    address: str
    metrics_port: int


@pytest.fixture
def metered_temporal(tmp_path: Path) -> Iterator[MeteredTemporal]:
    ports: list[int] = []

    def command() -> list[str]:
        ports[:] = [free_port(), free_port(), free_port()]
        return timeshare_command(
            "temporal", f"--port={ports[0]}", f"--ui-port={ports[1]}",
            f"--metrics-port={ports[2]}", f"--data-dir={tmp_path}",
        )  # fmt: skip

    process: subprocess.Popen[str] = start_until_ready(command, "timeshare temporal: ready")
    try:
        yield MeteredTemporal(f"127.0.0.1:{ports[0]}", ports[2])
    finally:
        process.terminate()
        process.wait(30)


async def test_search_attribute_upserts_do_not_each_read_the_cluster_metadata(
    metered_temporal: MeteredTemporal,
) -> None:
    client = await Client.connect(metered_temporal.address)
    operations = TemporalOperations(metered_temporal.metrics_port)
    last = f"{HOLDER.name} = 'job-{UPSERTS - 1}'"

    async def listed() -> list[str]:
        return [execution.id async for execution in client.list_workflows(last)]

    async with Worker(client, task_queue="upserting", workflows=[Upserting]):
        # The first upsert may fill the cache; the window counts the rest,
        # and every visibility write of theirs.
        await client.execute_workflow(Upserting.run, 1, id="warm", task_queue="upserting")
        with operations.window():
            await client.execute_workflow(
                Upserting.run, UPSERTS, id="upserts", task_queue="upserting"
            )
            await wait_until_async(listed, "the last upsert in the visibility store")
    assert not operations.error
    reads = operations.count(*METADATA_READ)
    assert reads < UPSERTS / 2, f"{reads} store reads of the cluster metadata for {UPSERTS} upserts"
