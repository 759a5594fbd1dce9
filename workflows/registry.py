"""NodeRegistryWorkflow: which node agents exist and which are alive.

Agents announce themselves with signal-with-start and repeat the announcement
as a heartbeat; a node not heard from within the liveness window is marked
dead by a durable timer, so the registry notices a dead agent by itself.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.models import DrainInput, NodeInfo, NodeRecord

NODE_HEARTBEAT_SECONDS = 10.0
NODE_LIVENESS_SECONDS = 35.0


class NodeRegistryInput(BaseModel):
    nodes: dict[str, NodeRecord] = Field(default_factory=dict)
    liveness_seconds: float = NODE_LIVENESS_SECONDS


class NodeDeparture(BaseModel):
    node: str


@workflow.defn(name="NodeRegistryWorkflow")
class NodeRegistryWorkflow:
    @workflow.init
    def __init__(self, input: NodeRegistryInput) -> None:
        self._nodes = dict(input.nodes)
        self._liveness = input.liveness_seconds

    @workflow.run
    async def run(self, input: NodeRegistryInput) -> None:
        while not workflow.info().is_continue_as_new_suggested():
            alive = [n for n in self._nodes.values() if n.alive]
            if not alive:
                await workflow.wait_condition(lambda: any(n.alive for n in self._nodes.values()))
                continue
            expiry = min(n.last_seen for n in alive) + self._liveness
            wait = max(0.001, expiry - self._now())
            await workflow.sleep(timedelta(seconds=wait))
            now = self._now()
            for node in alive:
                if now - node.last_seen >= self._liveness:
                    node.alive = False
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            NodeRegistryInput(nodes=self._nodes, liveness_seconds=self._liveness)
        )

    def _now(self) -> float:
        return workflow.now().timestamp()

    @workflow.signal
    def announce(self, info: NodeInfo) -> None:
        # An agent announces itself every few seconds; a drain outlasts that.
        known = self._nodes.get(info.node)
        self._nodes[info.node] = NodeRecord(
            **info.model_dump(),
            alive=True,
            last_seen=self._now(),
            drained=known.drained if known is not None else False,
        )

    @workflow.signal
    def depart(self, departure: NodeDeparture) -> None:
        record = self._nodes.get(departure.node)
        if record is not None:
            record.alive = False

    @workflow.signal
    def set_drained(self, drain: DrainInput) -> None:
        record = self._nodes.get(drain.node)
        if record is not None:
            record.drained = drain.drained

    @workflow.query
    def nodes(self) -> list[NodeRecord]:
        return sorted(self._nodes.values(), key=lambda n: n.node)
