"""The timeline report: the figures it computes from a recorded history, a
valid PNG, a self-contained well-formed HTML page that Chromium opens without
errors, and `timeshare report` at the edges.

Here the tests that start processes; the others are in
tests/unit/test_report.py."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import HEADLESS_FLAGS
from tests.conftest import REPO
from tests.integration.test_cli import assert_one_line_failure, run
from tests.needs import CHROMIUM
from tests.report_history import JOBS, NODES, T, recorded_history
from timeshare.history import GroupHistory
from timeshare.report import write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_png_is_a_valid_image(tmp_path: Path) -> None:
    out = write_report(recorded_history(), tmp_path / "pair.png")
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    length, chunk, width, height = struct.unpack(">I4sII", data[8:24])
    assert (length, chunk) == (13, b"IHDR")
    assert width > 600 and height > 200
    image = pytest.importorskip("matplotlib.image").imread(out)
    assert image.shape[:2] == (height, width)


def test_an_empty_history_still_renders_as_png(tmp_path: Path) -> None:
    empty = GroupHistory(group="idle", captured_at=T)
    assert write_report(empty, tmp_path / "idle.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.browser
def test_html_opens_in_headless_chromium(tmp_path: Path) -> None:
    browser = CHROMIUM
    out = write_report(recorded_history(), tmp_path / "pair.html")
    result = subprocess.run(
        [
            str(browser),
            *HEADLESS_FLAGS,
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


def test_cli_draws_a_saved_history(tmp_path: Path) -> None:
    saved = tmp_path / "pair.json"
    saved.write_text(recorded_history().model_dump_json())
    out = tmp_path / "pair.html"
    result = run("report", "--group", "pair", f"--out={out}", f"--from-json={saved}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert 'data-lane="job-c"' in out.read_text()


def test_cli_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    saved = tmp_path / "pair.json"
    saved.write_text(recorded_history().model_dump_json())
    result = run(
        "report", "--group", "pair", f"--out={tmp_path / 'pair.pdf'}", f"--from-json={saved}"
    )
    assert_one_line_failure(result, ".html or .png")
    broken = tmp_path / "broken.json"
    broken.write_text('{"group": "pair", "turns": "no"}')
    result = run(
        "report", "--group", "pair", f"--out={tmp_path / 'x.html'}", f"--from-json={broken}"
    )
    assert_one_line_failure(result, "not a group history")
    result = run(
        "report", "--group", "other", f"--out={tmp_path / 'x.html'}", f"--from-json={saved}"
    )
    assert_one_line_failure(result, "'pair'", "'other'")
    result = run(
        "report", "--group", "pair", f"--out={tmp_path / 'x.html'}", "--from-json=/nonexistent"
    )
    assert_one_line_failure(result, "cannot read")
    assert not (tmp_path / "x.html").exists()


def test_cli_without_a_gateway_says_what_to_do() -> None:
    result = run("report", "--group", "pair", "--out=never.html", "--address=127.0.0.1:1")
    assert_one_line_failure(result, "UNAVAILABLE", "timeshare up")
    assert not (REPO / "never.html").exists()


def test_client_library_loads_no_matplotlib() -> None:
    probe = (
        "import sys, timeshare, timeshare.report, timeshare.report.cli;"
        "bad = [m for m in sys.modules if m.startswith(('matplotlib', 'temporalio'))];"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO).returncode == 0
