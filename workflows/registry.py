"""NodeRegistryWorkflow: which node agents exist and which are alive, and
which group claims which GPUs of each node.

Agents announce themselves with signal-with-start and repeat the announcement
as a heartbeat; a node not heard from within the liveness window is marked
dead by a durable timer, so the registry notices a dead agent by itself.

A GPU belongs to one group at a time. A join claims, for its group, the GPUs
the group's policy names (all of them when it names none) on each of the
job's nodes; a claim that overlaps another group's is answered with that
group's claims, and the gateway refuses the join unless they are stale (see
workers/gateway/claims.py). An agent that releases a job that left drops its
claim there.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.models import NodeInfo, NodeRecord
    from timeshare.scheduling.events import Drain
    from timeshare.workflows.ui_text import registry_details

NODE_HEARTBEAT_SECONDS = 10.0
NODE_LIVENESS_SECONDS = 35.0
# What the Temporal UI says of the registry: whoever starts it passes these.
REGISTRY_DETAILS = registry_details(NODE_HEARTBEAT_SECONDS, NODE_LIVENESS_SECONDS)


class Claim(BaseModel):
    """Group ``group`` uses GPUs ``gpus`` (empty: all) of ``node`` for ``job``."""

    group: str
    job: str
    node: str
    gpus: list[int] = Field(default_factory=list)
    # Workflow time of the join that made it.
    at: float = 0.0

    def overlaps(self, node: str, gpus: list[int]) -> bool:
        return node == self.node and (not gpus or not self.gpus or bool(set(gpus) & set(self.gpus)))


class NarrowInput(BaseModel):
    """Group ``group``'s processes on ``node`` use (or hold state of) ``gpus``:
    its claims there cover only those from now on."""

    group: str
    node: str
    gpus: list[int]


class NodeRegistryInput(BaseModel):
    nodes: dict[str, NodeRecord] = Field(default_factory=dict)
    liveness_seconds: float = NODE_LIVENESS_SECONDS
    claims: list[Claim] = Field(default_factory=list)
    # Each group's claims narrowed on a node to the GPUs its processes use there.
    narrowed: list[NarrowInput] = Field(default_factory=list)


class NodeDeparture(BaseModel):
    node: str


class ClaimInput(BaseModel):
    group: str
    job: str
    nodes: list[str]
    gpus: list[int] = Field(default_factory=list)


class ClaimOutput(BaseModel):
    # Other groups' claims on the same GPUs: the claim was not recorded.
    conflicts: list[Claim] = Field(default_factory=list)


class UnclaimInput(BaseModel):
    group: str
    job: str
    # Empty: on every node.
    node: str = ""


@workflow.defn(name="NodeRegistryWorkflow")
class NodeRegistryWorkflow:
    @workflow.init
    def __init__(self, input: NodeRegistryInput) -> None:
        self._nodes = dict(input.nodes)
        self._liveness = input.liveness_seconds
        self._claims = list(input.claims)
        self._narrowed = {(n.group, n.node): n.gpus for n in input.narrowed}

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
        narrowed = [
            NarrowInput(group=group, node=node, gpus=gpus)
            for (group, node), gpus in sorted(self._narrowed.items())
        ]
        workflow.continue_as_new(
            NodeRegistryInput(
                nodes=self._nodes,
                liveness_seconds=self._liveness,
                claims=self._claims,
                narrowed=narrowed,
            )
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

    @workflow.update
    def claim(self, input: ClaimInput) -> ClaimOutput:
        """Record the job's claim unless another group holds one of its GPUs
        (each group's claims as narrowed to the GPUs its processes use)."""
        conflicts = [
            claim
            for claim in self.claims()
            if claim.group != input.group
            and any(
                claim.overlaps(node, self._narrowed.get((input.group, node), input.gpus))
                for node in input.nodes
            )
        ]
        if conflicts:
            return ClaimOutput(conflicts=conflicts)
        now = self._now()
        self._claims = [
            c for c in self._claims if not (c.group == input.group and c.job == input.job)
        ]
        self._claims += [
            Claim(group=input.group, job=input.job, node=node, gpus=input.gpus, at=now)
            for node in input.nodes
        ]
        return ClaimOutput()

    @workflow.signal
    def unclaim(self, input: UnclaimInput) -> None:
        self._claims = [
            c
            for c in self._claims
            if not (c.group == input.group and c.job == input.job and input.node in ("", c.node))
        ]
        held = {(c.group, c.node) for c in self._claims}
        self._narrowed = {key: gpus for key, gpus in self._narrowed.items() if key in held}

    @workflow.signal
    def narrow(self, input: NarrowInput) -> None:
        """The GPUs the group's processes use, within what its join claimed (a
        GPU outside it may be another group's); widened again within it when
        they use more."""
        claimed = [c.gpus for c in self._claims if c.group == input.group and c.node == input.node]
        if not claimed:
            return
        used = sorted(set(input.gpus) & set(claimed[0])) if claimed[0] else sorted(input.gpus)
        if used:
            self._narrowed[(input.group, input.node)] = used

    @workflow.query
    def claims(self) -> list[Claim]:
        """Each claim with the GPUs it covers now (narrowed where its group's
        processes showed which they use)."""
        return [
            c.model_copy(update={"gpus": self._narrowed[(c.group, c.node)]})
            if (c.group, c.node) in self._narrowed
            else c
            for c in self._claims
        ]

    @workflow.signal
    def depart(self, departure: NodeDeparture) -> None:
        record = self._nodes.get(departure.node)
        if record is not None:
            record.alive = False

    @workflow.signal
    def set_drained(self, drain: Drain) -> None:
        record = self._nodes.get(drain.node)
        if record is not None:
            record.drained = drain.drained

    @workflow.query
    def nodes(self) -> list[NodeRecord]:
        return sorted(self._nodes.values(), key=lambda n: n.node)
