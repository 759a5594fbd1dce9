"""The node agent: runs the switch activity for its node through a backend,
and announces the node to the registry while it lives."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from timeshare.activities.backends.base import (
    Backend,
    BackendConfig,
    BackendError,
    BackendNotFound,
)
from timeshare.activities.backends.gpus import NoGpus, device_memory, gpu_inventory
from timeshare.activities.backends.hook_registry import HookRegistry
from timeshare.activities.backends.loading import load_backend
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.switch import SwitchActivities
from timeshare.background import background
from timeshare.instruments import GpuSample, observe_gpus
from timeshare.models import NodeInfo
from timeshare.names import (
    NODE_REGISTRY_WORKFLOW_ID,
    SCHEDULER_TASK_QUEUE,
    group_workflow_id,
    node_task_queue,
)
from timeshare.scheduling import events as ev
from timeshare.workers.agent.claim_narrowing import ClaimNarrowing
from timeshare.workers.agent.credentials import JobCredentials, group_lookup
from timeshare.workers.agent.exit_watch import ExitWatch
from timeshare.workers.agent.registration_socket import remove_socket, serve_agent_socket
from timeshare.workers.common.service import StartupError, ready, wait_for_temporal
from timeshare.workers.common.telemetry import Telemetry
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import (
    NODE_HEARTBEAT_SECONDS,
    REGISTRY_DETAILS,
    NarrowInput,
    NodeDeparture,
    NodeRegistryInput,
    NodeRegistryWorkflow,
    UnclaimInput,
)
from timeshare.workflows.ui_text import REGISTRY_SUMMARY

log = logging.getLogger("timeshare.agent")


async def serve_agent(
    stop: asyncio.Event,
    temporal: TemporalSettings,
    backend_name: str,
    config: BackendConfig,
    socket_path: str,
    telemetry: Telemetry | None = None,
    socket_group: int | None = None,
    *,
    evict_exited: bool = True,
) -> None:
    try:
        backend = load_backend(backend_name, config)
    except (BackendNotFound, BackendError) as error:
        raise StartupError(str(error)) from None
    processes = ProcessTable(registrations_path(socket_path))
    hooks = HookRegistry()
    backend.attach(processes)
    backend.attach_hooks(hooks)
    telemetry = telemetry or Telemetry()
    client = await wait_for_temporal(temporal, "agent", stop, telemetry)
    telemetry.start()
    if not backend.simulated and backend.gpus():  # else the GPU series are absent, not 0
        observe_gpus(config.node, gpu_samples)
    activities = SwitchActivities(config.node, backend, processes, node_state_path(socket_path))
    activities.on_release.append(partial(drop_claim, client, config.node))
    registrations = await serve_agent_socket(
        socket_path,
        processes,
        hooks,
        forget=activities.release_job,
        credentials=JobCredentials(group_lookup(client)),
        socket_group=socket_group,
    )
    info = NodeInfo(
        node=config.node, backend=backend.name, simulated=backend.simulated, gpus=backend.gpus()
    )
    task_queue = node_task_queue(config.node)
    worker = Worker(
        client, task_queue=task_queue, activities=[activities.switch, activities.release]
    )
    exits = ExitWatch(
        config.node, processes, partial(evict_from_group, client), activities.processes_exited
    )
    # NVML shows which GPUs the groups' processes use (never on the sim backend).
    narrowing = (
        None
        if backend.simulated
        else ClaimNarrowing(config.node, processes, device_memory, partial(narrow_claim, client))
    )
    async with (
        registrations,
        worker,
        background(exits.run(stop) if evict_exited else None),
        background(narrowing.run(stop) if narrowing else None),
    ):
        await announce(client, node_info(info, backend))
        ready(
            "agent",
            f"node {config.node}, backend {backend.describe()}, task queue {task_queue}, "
            f"registrations on {socket_path}, Temporal {temporal.describe()}",
        )
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), NODE_HEARTBEAT_SECONDS)
            if not stop.is_set():
                await announce(client, node_info(info, backend))
        remove_socket(socket_path)
        # Processes serving hooks see the agent go, and reconnect to the next one.
        hooks.close_all()
        with contextlib.suppress(Exception):
            handle = client.get_workflow_handle(NODE_REGISTRY_WORKFLOW_ID)
            await handle.signal(NodeRegistryWorkflow.depart, NodeDeparture(node=config.node))
    await telemetry.close()


async def evict_from_group(client: Client, group: str, job: str, reason: str) -> bool:
    """Evict the job; False where it is not in its group (left, or the group is gone)."""
    handle = client.get_workflow_handle(group_workflow_id(group))
    try:
        return await handle.execute_update(GroupWorkflow.evict, ev.Evict(job=job, reason=reason))
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


def node_info(info: NodeInfo, backend: Backend) -> NodeInfo:
    """The node as announced now, with what its backend wants operators to know."""
    return info.model_copy(update={"notes": backend.notes()})


async def drop_claim(client: Client, node: str, group: str, job: str) -> None:
    """A job released here no longer claims this node's GPUs."""
    handle = client.get_workflow_handle(NODE_REGISTRY_WORKFLOW_ID)
    await handle.signal(NodeRegistryWorkflow.unclaim, UnclaimInput(group=group, job=job, node=node))


async def narrow_claim(client: Client, narrowing: NarrowInput) -> None:
    handle = client.get_workflow_handle(NODE_REGISTRY_WORKFLOW_ID)
    await handle.signal(NodeRegistryWorkflow.narrow, narrowing)


def registrations_path(socket_path: str) -> Path:
    """Beside the socket: gone with it at reboot, when the processes are gone too."""
    return Path(socket_path).with_suffix(".registrations.json")


def node_state_path(socket_path: str) -> Path:
    """The node's record (timeshare/node/state.py), beside the registrations."""
    return Path(socket_path).with_suffix(".node.json")


def gpu_samples() -> list[GpuSample]:
    try:
        gpus = gpu_inventory()
    except NoGpus:
        return []
    return [
        (
            gpu.uuid,
            None if gpu.utilization_percent is None else gpu.utilization_percent / 100,
            gpu.memory_used_bytes,
        )
        for gpu in gpus
    ]


async def announce(client: Client, info: NodeInfo) -> None:
    """Tell the registry this node is alive (starting the registry if needed)."""
    try:
        await client.start_workflow(
            NodeRegistryWorkflow.run,
            NodeRegistryInput(),
            id=NODE_REGISTRY_WORKFLOW_ID,
            task_queue=SCHEDULER_TASK_QUEUE,
            start_signal="announce",
            start_signal_args=[info],
            static_summary=REGISTRY_SUMMARY,
            static_details=REGISTRY_DETAILS,
        )
    except Exception as error:  # a missed heartbeat is retried at the next beat
        log.warning("could not announce node %s: %s", info.node, error)
