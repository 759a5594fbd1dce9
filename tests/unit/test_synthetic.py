"""The synthetic job's start: with --start-at, its first iteration waits for
the given moment, so that benchmark jobs begin together."""

from __future__ import annotations

import time

import pytest

from timeshare.cli import build_parser
from timeshare.synthetic import _sleep_until


def test_a_job_does_not_start_before_its_start_time(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.time() + 0.2
    _sleep_until("job-0", start)
    assert time.time() >= start
    assert capsys.readouterr().out == ""


def test_a_job_that_joined_late_says_so_and_starts_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _sleep_until("job-1", time.time() - 2.0)
    out = capsys.readouterr().out
    assert out.startswith("job-1: joined 2.") and "give the jobs longer to start" in out


def test_the_start_time_is_an_option_of_synthetic_job() -> None:
    args = build_parser().parse_args(
        ["synthetic-job", "--group", "g", "--job", "j", "--start-at", "1796300000.5"]
    )
    assert args.start_at == 1796300000.5
