"""`write_report`: a group's history drawn as a timeline, in the format its
file name asks for."""

from __future__ import annotations

from pathlib import Path

from timeshare.history import GroupHistory
from timeshare.report.data import ReportSummary, build_timeline, summarise
from timeshare.report.html import render_html

FORMATS = (".html", ".png")

__all__ = ["FORMATS", "ReportSummary", "check_format", "summarise", "write_report"]


def check_format(out: Path) -> str:
    """The format ``out`` names, or a ValueError that lists the supported ones."""
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"cannot write a report as {out.name!r}: the file name must end in "
            f"{' or '.join(FORMATS)}"
        )
    return suffix


def write_report(history: GroupHistory, out: Path) -> Path:
    """Draw ``history`` into ``out`` (.html: self-contained, .png: needs matplotlib)
    and return the path written."""
    suffix = check_format(out)
    timeline = build_timeline(history)
    if suffix == ".png":
        from timeshare.report.png import render_png

        render_png(timeline, out)
    else:
        out.write_text(render_html(timeline), encoding="utf-8")
    return out
