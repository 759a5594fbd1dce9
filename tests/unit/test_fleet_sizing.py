"""docs/operations.md's fleet sizing starts from the benchmark's own figures
(docs/benchmarks.md) and works them out right: a figure measured again, or a
model changed on one page only, fails here."""

from __future__ import annotations

import re

from tests.doc_blocks.markdown import REPO

OPERATIONS = (REPO / "docs" / "operations.md").read_text()
BENCHMARKS = (REPO / "docs" / "benchmarks.md").read_text()
HANDOVERS_PER_S = 1000 / 5
HELD_TURNS, BACKFILL_TURNS = 1000, 250


def sizing() -> str:
    return OPERATIONS.split("## Sizing for a fleet", 1)[1].split("\n## ", 1)[0]


def measured(name: str) -> float:
    """The benchmark's latest figure of that name in its section on what a
    hand-over costs Temporal (a later line there supersedes an earlier one)."""
    section = BENCHMARKS.split("### What a hand-over costs Temporal, by kind", 1)[1]
    section = section.split("\n### ", 1)[0]
    values = re.findall(rf"\b{name}=([0-9.]+)", section)
    assert values, f"docs/benchmarks.md says no {name}"
    return float(values[-1])


def row(label: str, model: bool = False) -> str:
    """The row of the inputs' table, or of the model's (its third column)."""
    rows = [line for line in sizing().splitlines() if line.startswith(f"| {label} |")]
    if model:
        return rows[-1].split("|")[3]
    return rows[0]


def number(text: str, pattern: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in {text!r}"
    return float(found.group(1).replace(",", ""))


def rounded(said: float, exact: float, places: int) -> bool:
    """``said`` is ``exact`` to that many decimal places (a half rounded either way)."""
    return abs(said - exact) <= 0.5 * 10.0**-places + 1e-9


def test_the_per_hand_over_inputs_are_the_benchmarks_figures() -> None:
    inputs = {
        "Temporal CPU": "temporal_cpu_ms_per_handover",
        "requests to Temporal's frontend": "temporal_requests_per_handover",
        "requests to Temporal's store": "temporal_store_requests_per_handover",
    }
    for label, name in inputs.items():
        assert number(row(label), r"\| ([0-9.]+)") == round(measured(name), 1), label
    writes = number(BENCHMARKS, r"\| visibility-store writes \| ([0-9.]+) \|")
    assert number(row("writes to the visibility store"), r"\| ([0-9.]+)") == round(writes, 1)
    full_run_100 = number(BENCHMARKS, r"\n\| 100 \| [0-9]+ \| ([0-9.]+) \| 0 \|")
    assert number(row("scheduler CPU"), r"\| ([0-9.]+) ms") == full_run_100


def test_the_watches_inputs_are_the_benchmarks_figures() -> None:
    said = " ".join(sizing().split())
    held = re.search(r"costs ([0-9.]+) cores of Temporal and ([0-9.]+) of the gateway", said)
    assert held, said
    backfill = re.search(r"its ask pushed, ([0-9.]+) and ([0-9.]+)", said)
    assert backfill, said
    assert [float(v) for v in held.groups()] == [
        measured("watch_temporal_cores_per_100_groups"),
        measured("watch_gateway_cores_per_100_groups"),
    ]
    assert [float(v) for v in backfill.groups()] == [
        measured("backfill_watch_temporal_cores_per_100_groups"),
        measured("backfill_watch_gateway_cores_per_100_groups"),
    ]


def test_the_model_for_a_thousand_groups_is_worked_out_from_those_inputs() -> None:
    temporal_ms = number(row("Temporal CPU"), r"\| ([0-9.]+) ms")
    model = row("Temporal CPU", model=True)
    cores = HANDOVERS_PER_S * temporal_ms / 1000
    assert rounded(number(model, r"([0-9.]+) cores for hand-overs"), cores, 1)
    said = " ".join(sizing().split())
    held = number(said, r"costs ([0-9.]+) cores of Temporal")
    backfill = number(said, r"its ask pushed, ([0-9.]+)")
    assert rounded(number(model, r"([0-9.]+) for 1,000 held turns"), held * HELD_TURNS / 100, 2)
    assert rounded(
        number(model, r"([0-9.]+) for 250 backfill turns"), backfill * BACKFILL_TURNS / 100, 2
    )
    held_gateway = number(said, r"and ([0-9.]+) of the gateway")
    backfill_gateway = number(said, r"its ask pushed, [0-9.]+ and ([0-9.]+)")
    gateways = row("gateways", model=True)
    assert rounded(
        number(gateways, r"([0-9.]+) cores for 1,000 held turns"),
        held_gateway * HELD_TURNS / 100,
        2,
    )
    assert rounded(
        number(gateways, r"([0-9.]+) for 250 backfill turns"),
        backfill_gateway * BACKFILL_TURNS / 100,
        2,
    )
    store = number(row("requests to Temporal's store"), r"\| ([0-9.]+)")
    per_s = number(row("Temporal's store", model=True), r"about ([0-9,]+)")
    assert abs(per_s - HANDOVERS_PER_S * store) <= 100
    scheduler_ms = number(row("scheduler CPU"), r"\| ([0-9.]+) ms")
    schedulers = number(row("schedulers", model=True), r"([0-9.]+) cores")
    assert rounded(schedulers, HANDOVERS_PER_S * scheduler_ms / 1000, 1)
