"""The timeline report: the figures it computes from a recorded history, a
valid PNG, a self-contained well-formed HTML page that Chromium opens without
errors, and `timeshare report` at the edges.

Here the tests that start no process; the others are in
tests/integration/test_report.py. PNG reports are drawn there: matplotlib
lists the system's fonts with `fc-list` the first time it draws on a machine,
so a PNG test here would pass only where an earlier run left its font cache."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.report_history import GIB, JOBS, NODES, T, recorded_history
from timeshare.history import GroupHistory
from timeshare.report import summarise, write_report
from timeshare.report.data import FAILED, RESIDENT, SWITCHING, TURN, UNKNOWN, build_timeline

VOID_TAGS = {"meta", "br", "img", "hr", "link", "input"}


class _Balanced(HTMLParser):
    """Fails on any element closed out of order or left open."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID_TAGS:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, f"</{tag}> closes {self.open}"


def test_summary_figures() -> None:
    summary = summarise(recorded_history())
    jobs = {job.job: job for job in summary.jobs}
    assert list(jobs) == list(JOBS)
    assert jobs["job-a"].turns == 2
    assert jobs["job-a"].wait_seconds == pytest.approx(0.5 + 6)
    # The turn still held counts up to the capture.
    assert jobs["job-a"].held_seconds == pytest.approx(2.5 + 3)
    assert jobs["job-a"].still_holding
    assert (jobs["job-b"].wait_seconds, jobs["job-b"].held_seconds) == pytest.approx((3, 2))
    assert not jobs["job-c"].still_holding
    assert (summary.switches, summary.failed_switches) == (9, 1)
    assert summary.bytes_moved == 27 * GIB
    assert summary.span_seconds == pytest.approx(14)
    # Held 2.5 + 2 + 1.5 + 3 s of 14, none of it while a node switched.
    assert summary.utilisation == pytest.approx(9 / 14)


def test_node_residency_follows_the_switches() -> None:
    timeline = build_timeline(recorded_history())
    node_b = next(lane for lane in timeline.nodes if lane.name == "node-b")
    kinds = [(s.kind, s.job) for s in node_b.segments]
    assert kinds == [
        (SWITCHING, ""),
        (RESIDENT, "job-a"),
        (SWITCHING, ""),
        (RESIDENT, "job-b"),
        (FAILED, ""),
        (UNKNOWN, ""),
        (SWITCHING, ""),
        (RESIDENT, "job-c"),
        (SWITCHING, ""),
        (RESIDENT, "job-a"),
    ]
    assert (node_b.segments[1].start, node_b.segments[1].end) == pytest.approx((0.4, 3))
    assert node_b.segments[-1].end == pytest.approx(14)
    assert "restore timed out" in node_b.segments[4].title
    job_a = next(lane for lane in timeline.jobs if lane.name == "job-a")
    last_turn = [s for s in job_a.segments if s.kind == TURN][-1]
    assert (last_turn.start, last_turn.end) == pytest.approx((11, 14))


def test_utilisation_buckets_average_to_the_total() -> None:
    timeline = build_timeline(recorded_history(), buckets=14)
    assert [b.busy for b in timeline.buckets][:4] == pytest.approx([0.5, 1, 1, 0])
    mean = sum(b.busy for b in timeline.buckets) / len(timeline.buckets)
    assert mean == pytest.approx(timeline.summary.utilisation)


def test_html_is_well_formed_and_self_contained(tmp_path: Path) -> None:
    out = write_report(recorded_history(), tmp_path / "pair.html")
    text = out.read_text(encoding="utf-8")
    parser = _Balanced()
    parser.feed(text)
    parser.close()
    assert parser.open == []
    # Written as XML-compatible markup, so the SVG is checked by a strict parser.
    document = ET.fromstring(text.split("\n", 1)[1])
    svgs = document.findall(".//svg")
    assert [svg.get("class") for svg in svgs] == ["timeline", "utilisation"]
    lanes = svgs[0].findall(".//g")
    assert [g.get("data-lane") for g in lanes if "job" in (g.get("class") or "")] == list(JOBS)
    assert [g.get("data-lane") for g in lanes if "node" in (g.get("class") or "")] == list(NODES)
    hovers = [t.text or "" for t in svgs[0].iter("title")]
    assert any("FAILED" in h and "restore timed out" in h for h in hovers)
    assert any("still held" in h for h in hovers)
    lowered = text.lower()
    for outside in ("http", "src=", "href", "url(", "@import", "<script"):
        assert outside not in lowered


def test_an_empty_history_still_renders(tmp_path: Path) -> None:
    empty = GroupHistory(group="idle", captured_at=T)
    assert summarise(empty).utilisation == 0
    assert "No turns" in write_report(empty, tmp_path / "idle.html").read_text()


def test_other_extensions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.html or \.png"):
        write_report(recorded_history(), tmp_path / "pair.svg")
    assert not (tmp_path / "pair.svg").exists()
