"""The timeline as one self-contained HTML file: inline CSS and SVG, no
scripts, no fetched resources, so it can be mailed, attached to an issue or
opened offline. Hovering any bar shows its details (SVG <title>)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape

from timeshare.report.data import (
    KIND_COLOURS,
    SWITCH,
    WAIT,
    Bucket,
    Lane,
    Segment,
    Timeline,
    human_bytes,
    summary_line,
)

WIDTH = 1000
LABEL = 150
RIGHT = 20
PLOT = WIDTH - LABEL - RIGHT
LANE = 24
GAP = 6
HEADING = 22
AXIS = 28
CHART = 110
# Room above the chart for the top "100%" label.
CHART_TOP = 10

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d232a; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.summary { margin: 0 0 16px; color: #4a535c; }
svg { display: block; margin-bottom: 12px; }
svg text { font: 12px system-ui, sans-serif; fill: #1d232a; }
svg text.heading { font-weight: 600; }
svg text.tick { fill: #6a737c; font-size: 11px; }
svg line.grid { stroke: #e3e6ea; }
svg rect.seg:hover, svg rect.bar:hover { stroke: #1d232a; stroke-width: 1; }
ul.legend { list-style: none; padding: 0; margin: 0 0 16px; }
ul.legend li { display: inline-block; margin-right: 16px; }
span.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; border: 1px solid #c5cad0; }
table { border-collapse: collapse; }
th, td { padding: 3px 12px; border-bottom: 1px solid #e3e6ea; text-align: right; }
th:first-child, td:first-child { text-align: left; }
"""


def _x(timeline: Timeline, seconds: float) -> float:
    scale = PLOT / timeline.span if timeline.span > 0 else 0.0
    return LABEL + seconds * scale


def _tick_step(span: float) -> float:
    if span <= 0:
        return 1.0
    rough = span / 8
    power = 10.0 ** math.floor(math.log10(rough))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= rough)


def _ticks(timeline: Timeline, top: float, bottom: float) -> list[str]:
    step = _tick_step(timeline.span)
    parts = []
    for index in range(int(timeline.span / step) + 1):
        x = _x(timeline, index * step)
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>')
        label = f"{index * step:g} s"
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{label}</text>'
        )
    return parts


def _fill(timeline: Timeline, segment: Segment) -> str:
    return timeline.colour(segment.job) if segment.job else KIND_COLOURS[segment.kind]


def _lane(timeline: Timeline, lane: Lane, y: float) -> str:
    parts = [f'<g class="lane {lane.kind}" data-lane="{escape(lane.name)}">']
    parts.append(
        f'<text x="{LABEL - 8}" y="{y + LANE / 2 + 4}" text-anchor="end">{escape(lane.name)}</text>'
    )
    parts.append(f'<rect x="{LABEL}" y="{y}" width="{PLOT}" height="{LANE}" fill="#fafbfc"/>')
    for segment in lane.segments:
        x = _x(timeline, segment.start)
        # A sub-pixel segment (an instant switch) still gets a visible sliver to hover.
        width = max(1.0, _x(timeline, segment.end) - x)
        parts.append(
            f'<rect class="seg {segment.kind}" x="{x:.2f}" y="{y + 2}" width="{width:.2f}" '
            f'height="{LANE - 4}" fill="{_fill(timeline, segment)}">'
            f"<title>{escape(segment.title)}</title></rect>"
        )
    parts.append("</g>")
    return "".join(parts)


def _lanes_svg(timeline: Timeline) -> str:
    parts: list[str] = []
    y = 0.0
    for heading, lanes in (("jobs", timeline.jobs), ("nodes", timeline.nodes)):
        parts.append(f'<text class="heading" x="0" y="{y + 15}">{heading}</text>')
        y += HEADING
        for lane in lanes:
            parts.append(_lane(timeline, lane, y))
            y += LANE + GAP
    height = y + AXIS
    grid = _ticks(timeline, 0, y)
    return (
        f'<svg class="timeline" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" role="img" aria-label="timeline">'
        + "".join(grid)
        + "".join(parts)
        + "</svg>"
    )


def _bar(timeline: Timeline, bucket: Bucket) -> str:
    x = _x(timeline, bucket.start)
    width = max(1.0, _x(timeline, bucket.end) - x - 1)
    height = CHART * bucket.busy
    title = f"{bucket.start:.1f} to {bucket.end:.1f} s: GPUs in use {bucket.busy:.0%}"
    return (
        f'<rect class="bar" x="{x:.2f}" y="{CHART_TOP + CHART - height:.2f}" width="{width:.2f}" '
        f'height="{height:.2f}" fill="#3f9a5b"><title>{escape(title)}</title></rect>'
    )


def _utilisation_svg(timeline: Timeline) -> str:
    height = CHART_TOP + CHART + AXIS
    parts = _ticks(timeline, CHART_TOP, CHART_TOP + CHART)
    for fraction in (0.0, 0.5, 1.0):
        y = CHART_TOP + CHART * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{LABEL}" y1="{y}" x2="{LABEL + PLOT}" y2="{y}"/>'
            f'<text class="tick" x="{LABEL - 8}" y="{y + 4}" text-anchor="end">'
            f"{fraction:.0%}</text>"
        )
    parts.append(f'<text class="heading" x="0" y="{CHART_TOP + 15}">utilisation</text>')
    parts += [_bar(timeline, bucket) for bucket in timeline.buckets]
    overall = timeline.summary.utilisation
    y = CHART_TOP + CHART * (1 - overall)
    parts.append(
        f'<line x1="{LABEL}" y1="{y:.2f}" x2="{LABEL + PLOT}" y2="{y:.2f}" stroke="#1d232a" '
        f'stroke-dasharray="4 3"><title>overall {overall:.1%}</title></line>'
    )
    return (
        f'<svg class="utilisation" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="utilisation">'
        + "".join(parts)
        + "</svg>"
    )


def _legend(timeline: Timeline) -> str:
    items = [
        (timeline.colour(lane.name), f"{lane.name}: turn / resident") for lane in timeline.jobs
    ]
    items += [
        (KIND_COLOURS[WAIT], "waiting"),
        (KIND_COLOURS[SWITCH], "switching"),
        (KIND_COLOURS["failed"], "failed switch"),
        (KIND_COLOURS["unknown"], "residency unknown"),
        (KIND_COLOURS["empty"], "no job resident"),
    ]
    entries = "".join(
        f'<li><span class="swatch" style="background:{colour}"></span>{escape(text)}</li>'
        for colour, text in items
    )
    return f'<ul class="legend">{entries}</ul>'


def _table(timeline: Timeline) -> str:
    headers = ["job", "turns", "waited s", "held s", "switch s", "holding now"]
    rows = [
        [
            escape(job.job),
            str(job.turns),
            f"{job.wait_seconds:.3f}",
            f"{job.held_seconds:.3f}",
            f"{job.switch_seconds:.3f}",
            "yes" if job.still_holding else "no",
        ]
        for job in timeline.summary.jobs
    ]
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _totals(timeline: Timeline) -> str:
    summary = timeline.summary
    return (
        f"<p>{summary.switches} switches in all ({summary.failed_switches} failed), those "
        "done ahead of a request (prefetch) included, took "
        f"{summary.switch_seconds:.3f} node-seconds and moved {human_bytes(summary.bytes_moved)}; "
        f"GPUs held by a job with no switch running {summary.utilisation:.0%} of "
        f"{summary.span_seconds:.1f} s. A job's own count (`timeshare demo`) has only "
        "the switches it waited for, and its GPU phases for busy.</p>"
    )


def render_html(timeline: Timeline) -> str:
    summary = timeline.summary
    start = datetime.fromtimestamp(timeline.origin, UTC).isoformat(timespec="seconds")
    captured = datetime.fromtimestamp(summary.captured_at, UTC).isoformat(timespec="seconds")
    group = escape(timeline.group)
    body = (
        [
            f"<h1>timeshare group {group}</h1>",
            f'<p class="summary">{escape(summary_line(summary))}. '
            f"Time 0 is {start}; captured {captured}.</p>",
            _legend(timeline),
            _lanes_svg(timeline),
            _utilisation_svg(timeline),
            _table(timeline),
            _totals(timeline),
        ]
        if timeline.jobs or timeline.nodes
        else [f"<h1>timeshare group {group}</h1>", "<p>No turns or switches recorded.</p>"]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        f"<title>timeshare: {group}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
