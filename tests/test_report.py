"""The timeline report: the figures it computes from a recorded history, a
valid PNG, a self-contained well-formed HTML page that Chromium opens without
errors, and `timeshare report` at the edges."""

from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.needs import CHROMIUM
from tests.report_history import GIB, JOBS, NODES, T, recorded_history
from tests.test_cli import assert_one_line_failure, run
from timeshare.history import GroupHistory
from timeshare.report import summarise, write_report
from timeshare.report_data import FAILED, RESIDENT, SWITCHING, TURN, UNKNOWN, build_timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID_TAGS = {"meta", "br", "img", "hr", "link", "input"}


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


def test_png_is_a_valid_image(tmp_path: Path) -> None:
    out = write_report(recorded_history(), tmp_path / "pair.png")
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    length, chunk, width, height = struct.unpack(">I4sII", data[8:24])
    assert (length, chunk) == (13, b"IHDR")
    assert width > 600 and height > 200
    image = pytest.importorskip("matplotlib.image").imread(out)
    assert image.shape[:2] == (height, width)


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


@pytest.mark.browser
def test_html_opens_in_headless_chromium(tmp_path: Path) -> None:
    browser = CHROMIUM
    out = write_report(recorded_history(), tmp_path / "pair.html")
    result = subprocess.run(
        [
            str(browser),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            out.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert '<svg class="timeline"' in result.stdout
    for lane in (*JOBS, *NODES):
        assert f'data-lane="{lane}"' in result.stdout
    for error in ("Uncaught", "ERROR:CONSOLE"):
        assert error not in result.stderr, result.stderr[-2000:]


def test_an_empty_history_still_renders(tmp_path: Path) -> None:
    empty = GroupHistory(group="idle", captured_at=T)
    assert summarise(empty).utilisation == 0
    assert "No turns" in write_report(empty, tmp_path / "idle.html").read_text()
    assert write_report(empty, tmp_path / "idle.png").read_bytes().startswith(PNG_SIGNATURE)


def test_other_extensions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.html or \.png"):
        write_report(recorded_history(), tmp_path / "pair.svg")
    assert not (tmp_path / "pair.svg").exists()


def test_cli_draws_a_saved_history(tmp_path: Path) -> None:
    saved = tmp_path / "pair.json"
    saved.write_text(recorded_history().model_dump_json())
    out = tmp_path / "pair.html"
    result = run("report", "pair", f"--out={out}", f"--from-json={saved}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert 'data-lane="job-c"' in out.read_text()


def test_cli_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    saved = tmp_path / "pair.json"
    saved.write_text(recorded_history().model_dump_json())
    result = run("report", "pair", f"--out={tmp_path / 'pair.pdf'}", f"--from-json={saved}")
    assert_one_line_failure(result, ".html or .png")
    broken = tmp_path / "broken.json"
    broken.write_text('{"group": "pair", "turns": "no"}')
    result = run("report", "pair", f"--out={tmp_path / 'x.html'}", f"--from-json={broken}")
    assert_one_line_failure(result, "not a group history")
    result = run("report", "other", f"--out={tmp_path / 'x.html'}", f"--from-json={saved}")
    assert_one_line_failure(result, "'pair'", "'other'")
    result = run("report", "pair", f"--out={tmp_path / 'x.html'}", "--from-json=/nonexistent")
    assert_one_line_failure(result, "cannot read")
    assert not (tmp_path / "x.html").exists()


def test_cli_without_a_gateway_says_what_to_do() -> None:
    result = run("report", "pair", "--out=never.html", "--address=127.0.0.1:1")
    assert_one_line_failure(result, "UNAVAILABLE", "timeshare up")
    assert not (REPO / "never.html").exists()


def test_client_library_loads_no_matplotlib() -> None:
    probe = (
        "import sys, timeshare, timeshare.report, timeshare.report_cli;"
        "bad = [m for m in sys.modules if m.startswith(('matplotlib', 'temporalio'))];"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO).returncode == 0
