"""The ``switch`` activity: one node's part of a hand-over."""

from __future__ import annotations

import time

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.backend import Backend
from timeshare.models import SwitchInput, SwitchOutput


class SwitchActivities:
    def __init__(self, node: str, backend: Backend) -> None:
        self.node = node
        self.backend = backend

    @activity.defn(name="switch")
    async def switch(self, input: SwitchInput) -> SwitchOutput:
        """Checkpoint every other job resident here, then restore the admitted one."""
        move = input.move
        if move.node != self.node:
            raise ApplicationError(
                f"switch for node {move.node!r} reached the agent of node {self.node!r}",
                non_retryable=True,
            )
        started = time.monotonic()
        # Evict what the backend itself sees resident too, not only what the
        # scheduler believes: after an agent restart the two can differ.
        evict = sorted((set(move.evict) | set(self.backend.resident_jobs())) - {move.admit})
        actions = [await self.backend.checkpoint(job) for job in evict]
        actions.append(await self.backend.restore(move.admit))
        activity.logger.info(
            "group %s epoch %d: node %s admitted %s (evicted %s)",
            input.group,
            input.epoch,
            self.node,
            move.admit,
            evict or "nothing",
        )
        return SwitchOutput(
            node=self.node,
            backend=self.backend.name,
            actions=actions,
            seconds=time.monotonic() - started,
        )
