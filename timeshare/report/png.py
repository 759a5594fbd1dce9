"""The timeline as a PNG through matplotlib (the `report` extra). matplotlib is
imported here, inside the function, so the client library never pays for it
and HTML reports work without it."""

from __future__ import annotations

from pathlib import Path

from timeshare.report.data import (
    EMPTY,
    FAILED,
    KIND_COLOURS,
    SWITCH,
    UNKNOWN,
    WAIT,
    Lane,
    Timeline,
    summary_line,
)

LANE_INCHES = 0.38
DPI = 100


class MissingMatplotlib(RuntimeError):
    pass


def render_png(timeline: Timeline, out: Path) -> None:
    try:
        # Figure without pyplot: no global state, no GUI backend chosen from the
        # environment, safe in a headless process.
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as error:
        raise MissingMatplotlib(
            "PNG reports need matplotlib: pip install 'timeshare[report]' (or write .html)"
        ) from error

    lanes: list[Lane] = [*timeline.jobs, *timeline.nodes]
    height = 2.6 + LANE_INCHES * max(1, len(lanes))
    figure = Figure(figsize=(12, height), dpi=DPI, layout="constrained")
    figure.suptitle(f"timeshare group {timeline.group}\n{summary_line(timeline.summary)}")
    if not lanes:
        figure.text(0.5, 0.5, "No turns or switches recorded.", ha="center", va="center")
        figure.savefig(out, format="png")
        return

    grid = figure.add_gridspec(2, 1, height_ratios=[max(1, len(lanes)), 3])
    lanes_axes = figure.add_subplot(grid[0])
    chart = figure.add_subplot(grid[1], sharex=lanes_axes)

    # Top to bottom: jobs, then nodes, as in the HTML.
    for row, lane in enumerate(reversed(lanes)):
        spans = [(s.start, max(s.end - s.start, 0.0)) for s in lane.segments]
        colours = [timeline.colour(s.job) if s.job else KIND_COLOURS[s.kind] for s in lane.segments]
        if spans:
            lanes_axes.broken_barh(spans, (row + 0.1, 0.8), facecolors=colours)
    lanes_axes.set_yticks([r + 0.5 for r in range(len(lanes))])
    lanes_axes.set_yticklabels([lane.name for lane in reversed(lanes)])
    lanes_axes.set_ylim(0, len(lanes))
    if timeline.jobs and timeline.nodes:
        lanes_axes.axhline(len(timeline.nodes), color="#1d232a", linewidth=0.8)
    lanes_axes.set_xlim(0, max(timeline.span, 1e-9))
    lanes_axes.tick_params(labelbottom=False)

    handles = [
        Patch(facecolor=timeline.colour(lane.name), label=lane.name) for lane in timeline.jobs
    ]
    for kind, label in (
        (WAIT, "waiting"),
        (SWITCH, "switching"),
        (FAILED, "failed switch"),
        (UNKNOWN, "residency unknown"),
        (EMPTY, "no job resident"),
    ):
        handles.append(Patch(facecolor=KIND_COLOURS[kind], edgecolor="#c5cad0", label=label))
    lanes_axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)

    chart.bar(
        [b.start for b in timeline.buckets],
        [b.busy * 100 for b in timeline.buckets],
        width=[(b.end - b.start) * 0.95 for b in timeline.buckets],
        align="edge",
        color="#3f9a5b",
    )
    overall = timeline.summary.utilisation * 100
    chart.axhline(overall, color="#1d232a", linestyle="--", linewidth=0.8)
    chart.set_ylim(0, 100)
    chart.set_ylabel("GPUs in use %")
    chart.set_xlabel("seconds since the first request")
    figure.savefig(out, format="png")
