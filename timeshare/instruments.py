"""The metrics timeshare records. Instruments come from the global meter
provider, which telemetry.setup_telemetry (or a test) installs; until then
they record nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Histogram, Observation

from timeshare.models import SwitchOutput

_meter = metrics.get_meter("timeshare")
# Switches take milliseconds (sim, co-resident) to minutes (100 GB over PCIe);
# waits and turns up to an hour.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                   600, 1800, 3600)  # fmt: skip


def _seconds_histogram(name: str, description: str) -> Histogram:
    return _meter.create_histogram(
        name, unit="s", description=description, explicit_bucket_boundaries_advisory=SECONDS_BUCKETS
    )


SWITCH_DURATION = _seconds_histogram(
    "timeshare.switch.duration",
    "Seconds a node spent on one phase (checkpoint or restore) of a switch",
)
ACQUIRE_WAIT = _seconds_histogram(
    "timeshare.acquire.wait", "Seconds from a job's acquire to its grant"
)
TURN_DURATION = _seconds_histogram("timeshare.turn.duration", "Seconds a job held the turn")
BYTES_MOVED = _meter.create_counter(
    "timeshare.bytes.moved", unit="By", description="Device state bytes checkpointed or restored"
)
GROUP_HEALS = _meter.create_counter(
    "timeshare.group.heals",
    description="Groups whose workflow task kept failing, rebuilt by the scheduler in a new "
    "run (outcome healed), or held off a while as its new runs failed at once (outcome held-off)",
)
# Backend actions by phase; "noop" is not a phase. Co-residency locks and unlocks.
PHASES = frozenset({"checkpoint", "restore", "lock", "unlock"})


def record_grant(group: str, job: str, waited_seconds: float, phase: str = "") -> None:
    """``phase``: what the job asked the turn for ("" where it named none)."""
    ACQUIRE_WAIT.record(waited_seconds, {"group": group, "job": job, "phase": phase})


def record_turn(group: str, job: str, held_seconds: float, phase: str = "") -> None:
    TURN_DURATION.record(held_seconds, {"group": group, "job": job, "phase": phase})


def record_heal(group: str, outcome: str, cause: str) -> None:
    """``cause``: the kind of failure (nondeterminism, workflow-error)."""
    GROUP_HEALS.add(1, {"group": group, "outcome": outcome, "cause": cause})


def record_switch(group: str, output: SwitchOutput) -> None:
    for action in output.actions:
        if action.action not in PHASES:
            continue
        labels = {"group": group, "node": output.node, "backend": output.backend}
        SWITCH_DURATION.record(action.seconds, {**labels, "phase": action.action})
        BYTES_MOVED.add(action.bytes, labels)


GpuSample = tuple[str, float | None, int]  # uuid, utilization 0..1 (None: unknown), bytes used


def observe_gpus(node: str, sample: Callable[[], list[GpuSample]]) -> None:
    """Gauges of each GPU's utilisation and memory, sampled at each collection.
    Call only where there are GPUs: elsewhere the series are absent, not zero."""

    def utilization(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(busy, {"node": node, "gpu": uuid})
            for uuid, busy, _ in sample()
            if busy is not None
        ]

    def memory(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(used, {"node": node, "gpu": uuid}) for uuid, _, used in sample()]

    _meter.create_observable_gauge(
        "timeshare.gpu.utilization",
        [utilization],
        unit="1",
        description="Fraction of the last sample period the GPU ran a kernel (NVML)",
    )
    _meter.create_observable_gauge(
        "timeshare.gpu.memory.used", [memory], unit="By", description="GPU memory in use (NVML)"
    )
