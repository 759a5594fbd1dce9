"""The Grafana dashboard asks only for series the metrics exist as once the
OpenTelemetry Prometheus exporter has named them, with their own labels."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "timeshare-dashboard.json"
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # histogram, counter or gauge
    unit: str  # Prometheus unit suffix; "" for none
    label_names: str  # space-separated

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self.label_names.split())

    def series(self) -> set[str]:
        """Dots become underscores, the unit is appended, a counter gets _total
        and a histogram its three series."""
        base = self.name.replace(".", "_") + (f"_{self.unit}" if self.unit else "")
        if self.kind == "histogram":
            return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
        if self.kind == "counter":
            return {f"{base}_total"}
        return {base}


METRICS = (
    Metric("timeshare.switch.duration", "histogram", "seconds", "group node backend phase"),
    Metric("timeshare.acquire.wait", "histogram", "seconds", "group job"),
    Metric("timeshare.turn.duration", "histogram", "seconds", "group job"),
    Metric("timeshare.queue.depth", "gauge", "", "group"),
    Metric("timeshare.switch.failing", "gauge", "", "group cause"),
    Metric("timeshare.bytes.moved", "counter", "bytes", "group node"),
    Metric("timeshare.gpu.utilization", "gauge", "", "node gpu"),
    Metric("timeshare.gpu.memory.used", "gauge", "bytes", "node gpu"),
    Metric("timeshare.backfill.busy_seconds", "gauge", "", "group"),
    Metric("timeshare.backfill.preemptions", "gauge", "", "group"),
    Metric("timeshare.backfill.delay_seconds", "gauge", "", "group"),
)
LABELS = {series: metric.labels for metric in METRICS for series in metric.series()}
SERIES = re.compile(r"\btimeshare_[a-z0-9_]+")
SELECTOR = re.compile(r"\b(timeshare_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
VARIABLE = re.compile(r"\$\{?(\w+)")


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["definition"])
    return found


def check_expression(expr: str, variables: set[str]) -> None:
    names = SERIES.findall(expr)
    assert names, f"no timeshare series in {expr!r}"
    unknown = set(names) - set(LABELS)
    assert not unknown, f"{expr!r} names series no exporter writes: {unknown}"
    for series, matchers in SELECTOR.findall(expr):
        used = set(MATCHER.findall(matchers))
        assert used <= LABELS[series], f"{series} has no label {used - LABELS[series]}"
    available: set[str] = set().union(*(LABELS[name] for name in names))
    if any(name.endswith("_bucket") for name in names):
        available.add("le")
    for grouping in GROUPING.findall(expr):
        used = {label.strip() for label in grouping.split(",") if label.strip()}
        assert used <= available, f"{expr!r} groups by missing labels {used - available}"
    assert set(VARIABLE.findall(expr)) <= variables | BUILTIN_VARIABLES, expr


def test_every_expression_names_only_exported_series() -> None:
    dashboard = load()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for expr in expressions(dashboard):
        check_expression(expr, variables)


def test_every_metric_has_a_panel() -> None:
    used = {name for expr in expressions(load()) for name in SERIES.findall(expr)}
    for metric in METRICS:
        assert metric.series() & used, f"no panel shows {metric.name}"


def test_panels_use_the_datasource_and_group_variables() -> None:
    dashboard = load()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["group"]["type"] == "query"
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


# Guards the guard: each is a mistake the checks above must catch.
@pytest.mark.parametrize(
    "wrong",
    [
        "rate(timeshare_bytes_moved_total[5m])",  # the unit suffix forgotten
        'timeshare_queue_depth{node="a"}',  # a label the gauge lacks
        "sum by (job) (timeshare_gpu_utilization)",  # likewise, in a grouping
        'timeshare_queue_depth{group=~"$team"}',  # an undefined variable
    ],
)
def test_the_checker_catches_a_wrong_expression(wrong: str) -> None:
    with pytest.raises(AssertionError):
        check_expression(wrong, {"group"})


def test_the_metrics_listed_are_those_the_scheduler_makes() -> None:
    """The backfill gauges' names here are the ones the workflow creates."""
    from timeshare.workflows.backfill_gauges import GAUGES

    listed = {metric.name for metric in METRICS if metric.name.startswith("timeshare.backfill.")}
    assert listed == set(GAUGES)
