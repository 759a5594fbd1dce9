"""The chaos run's faults beyond a kill: a slow or a lossy link to Temporal,
the whole machine lost at once, a node out of host memory, a gateway whose
clock is off, and a group whose history its scheduler cannot replay. Each
lasts a drawn while and ends by itself; a Fault says what it did and what
the stack showed meanwhile (bench.parts.chaos_faults runs them)."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.parts.chaos_pool import JobPool
from bench.parts.disagreeing_scheduler import RUN_VARIABLE
from bench.parts.fault import Fault
from bench.parts.link_proxy import LinkProxy
from timeshare.errors import TimeshareError
from timeshare.models import NOT_ENOUGH_HOST_MEMORY
from timeshare.names import group_workflow_id
from timeshare.testing import LocalStack
from timeshare.testing.clock_skew import skewed_environment
from timeshare.workers.common.service import connect_temporal

# Between one fault and the next.
FAULT_GAP_SECONDS = (3.0, 9.0)
# How long a condition lasts (the lossy link's cuts, the skewed clock and
# the short host memory: long enough for switches to meet them).
WINDOW_SECONDS = (3.0, 8.0)
# A slow link holds each chunk back this long, each way.
LINK_DELAY_SECONDS = (0.05, 0.3)
# A gateway's clock is off by this much, either way (the issue's ±2 s).
CLOCK_SKEW_SECONDS = 2.0
# Host memory left to a node for parked state: less than one job's (0.25 GiB).
SHORT_HOST_GIB = 0.05
# A stuck group must heal within this (docs/reliability.md).
HEAL_SECONDS = 60.0
# A node short of host memory stays so at most this long for a switch to meet it.
HOST_MEMORY_MOST_SECONDS = 20.0
# The machine's parts are down this long before they all start again.
MACHINE_DOWN_SECONDS = (0.0, 8.0)


@dataclass
class Chaos:
    """What the faults act on: the stack, its jobs, and the links to Temporal
    the gateways and the agents reach it through."""

    stack: LocalStack
    pool: JobPool
    links: dict[str, LinkProxy] = field(default_factory=dict)
    # How long a condition lasts, and the machine stays down, drawn from this.
    window: tuple[float, float] = WINDOW_SECONDS
    # Between one fault and the next, drawn from this.
    gaps: tuple[float, float] = FAULT_GAP_SECONDS

    def lasting(self, rng: random.Random) -> float:
        return rng.uniform(*self.window)


def link_parts(stack: LocalStack) -> dict[str, list[str]]:
    """Which parts reach Temporal through which link."""
    return {"gateway-link": stack.gateway_parts, "agent-link": stack.agents}


def links_for(stack: LocalStack) -> dict[str, LinkProxy]:
    """A proxy per link, its parts pointed at it (before the stack starts)."""
    links = {}
    for name, parts in link_parts(stack).items():
        link = LinkProxy(stack.temporal_port, name)
        links[name] = link
        stack.part_temporal.update({part: link.address for part in parts})
    return links


def slow_link(chaos: Chaos, rng: random.Random) -> Fault:
    name = rng.choice(sorted(chaos.links))
    delay = rng.uniform(*LINK_DELAY_SECONDS)
    window = chaos.lasting(rng)
    at = time.time()
    chaos.links[name].slow(delay)
    time.sleep(window)
    chaos.links[name].slow(0.0)
    return Fault("slow-link", name, at, time.time(), f"+{delay * 1000:.0f} ms each way for "
                                                       f"{window:.1f} s")  # fmt: skip


def lossy_link(chaos: Chaos, rng: random.Random) -> Fault:
    name = rng.choice(sorted(chaos.links))
    window = chaos.lasting(rng)
    at = time.time()
    chaos.links[name].lossy(True)
    time.sleep(window)
    chaos.links[name].lossy(False)
    return Fault("lossy-link", name, at, time.time(), f"every connection cut for {window:.1f} s")


def whole_machine(chaos: Chaos, rng: random.Random) -> Fault:
    """Every part of the stack killed in the same instant, then all started
    again on the same data folder (Temporal's database, the simulated GPUs'
    state), as `timeshare up` after a power loss. The jobs, clients on
    other hosts, live on."""
    stack = chaos.stack
    down = min(rng.uniform(*MACHINE_DOWN_SECONDS), chaos.window[1])
    at = time.time()
    stack.kill_all_at_once()
    time.sleep(down)
    stack.start_all()
    return Fault("machine", "every part", at, time.time(), f"down {down:.1f} s, all started again")


def short_host_memory(chaos: Chaos, rng: random.Random) -> Fault:
    """A node left with too little host memory to park a job, for a while
    (and until a switch there has met it, at most HOST_MEMORY_MOST_SECONDS):
    its agent restarted so, then restarted as it was."""
    stack = chaos.stack
    agent = rng.choice(stack.agents)
    at = time.time()
    stack.part_options[agent] = [f"--sim-host-gib={SHORT_HOST_GIB}"]
    stack.restart(agent, signal.SIGTERM)
    causes = watch_groups(chaos, chaos.lasting(rng), NOT_ENOUGH_HOST_MEMORY)
    if not causes:
        causes = watch_groups(chaos, HOST_MEMORY_MOST_SECONDS, NOT_ENOUGH_HOST_MEMORY, first=True)
    lasted = time.time() - at
    del stack.part_options[agent]
    stack.restart(agent, signal.SIGTERM)
    seen = f"switches failed naming it: {', '.join(causes)}" if causes else "no switch met it"
    return Fault("host-memory", agent, at, time.time(), f"{SHORT_HOST_GIB} GiB for "
                                                         f"{lasted:.1f} s; {seen}")  # fmt: skip


def clock_skew(chaos: Chaos, rng: random.Random) -> Fault:
    """A gateway whose wall clock runs 2 s ahead or behind, for a while."""
    stack = chaos.stack
    gateway = rng.choice(stack.gateway_parts)
    skew = rng.choice([-CLOCK_SKEW_SECONDS, CLOCK_SKEW_SECONDS])
    window = chaos.lasting(rng) * 2
    at = time.time()
    stack.part_env[gateway] = skewed_environment(skew, {})
    stack.restart(gateway)
    time.sleep(window)
    del stack.part_env[gateway]
    stack.restart(gateway)
    return Fault("clock-skew", gateway, at, time.time(), f"clock {skew:+g} s for {window:.1f} s")


def stuck_group(chaos: Chaos, rng: random.Random) -> Fault:
    """Every scheduler replica replaced by one whose code cannot replay one
    group's current run (bench.parts.disagreeing_scheduler), until that
    group has healed; then the schedulers as they were."""
    stack = chaos.stack
    group = rng.choice(sorted({p.group for p in chaos.pool.processes}))
    stuck_run = current_run(stack.temporal, group)
    at = time.time()
    disagreeing = [sys.executable, "-m", "bench.parts.disagreeing_scheduler",
                   f"--temporal={stack.temporal}"]  # fmt: skip
    for part in stack.scheduler_parts:
        stack.part_command[part] = disagreeing
        stack.part_env[part] = {RUN_VARIABLE: stuck_run}
        stack.restart(part)
    deadline = time.time() + HEAL_SECONDS
    healed_run = stuck_run
    while healed_run == stuck_run and time.time() < deadline:
        time.sleep(0.2)
        healed_run = current_run(stack.temporal, group)
    healed_at = time.time()
    for part in stack.scheduler_parts:
        del stack.part_command[part], stack.part_env[part]
        stack.restart(part)
    outcome = (
        f"healed {healed_at - at:.1f} s after its schedulers were replaced"
        if healed_run != stuck_run
        else f"NOT healed within {HEAL_SECONDS:g} s"
    )
    return Fault("stuck-group", group, at, healed_at, outcome)


def watch_groups(chaos: Chaos, seconds: float, needle: str, first: bool = False) -> list[str]:
    """For ``seconds`` (``first``: or until one is seen): the groups whose
    switches failed saying ``needle``."""
    groups = sorted({p.group for p in chaos.pool.processes})
    seen: set[str] = set()
    until = time.time() + seconds
    while time.time() < until and not (first and seen):
        for group in groups:
            try:
                status = chaos.stack.group(group)
            except TimeshareError:
                continue
            if needle in status.degraded_cause:
                seen.add(group)
        time.sleep(0.2)
    return sorted(seen)


def current_run(temporal: str, group: str) -> str:
    async def described() -> str:
        client = await connect_temporal(temporal)
        return (await client.get_workflow_handle(group_workflow_id(group)).describe()).run_id

    return asyncio.run(described())


CONDITIONS: dict[str, Callable[[Chaos, random.Random], Fault]] = {
    "slow-link": slow_link,
    "lossy-link": lossy_link,
    "machine": whole_machine,
    "host-memory": short_host_memory,
    "clock-skew": clock_skew,
    "stuck-group": stuck_group,
}
# What each kind does, for `bench chaos --kinds`.
DESCRIPTIONS = {
    "slow-link": "the link from the gateways or the agents to Temporal holds every chunk "
    f"back {LINK_DELAY_SECONDS[0] * 1000:.0f}-{LINK_DELAY_SECONDS[1] * 1000:.0f} ms each way "
    f"for {WINDOW_SECONDS[0]:g}-{WINDOW_SECONDS[1]:g} s",
    "lossy-link": "that link cuts every connection, and each new one, "
    f"for {WINDOW_SECONDS[0]:g}-{WINDOW_SECONDS[1]:g} s",
    "machine": "every part of the stack killed in the same instant, all started again on "
    "the same data folder",
    "host-memory": f"a node's agent left {SHORT_HOST_GIB} GiB of host memory for parked "
    "state (less than one job's) for a while",
    "clock-skew": f"a gateway's wall clock {CLOCK_SKEW_SECONDS:g} s ahead or behind for a while",
    "stuck-group": "every scheduler replaced by one that cannot replay a group's history, "
    "until the group heals",
}
