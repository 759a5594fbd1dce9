"""The processes' behaviour at the edges: one clear line and a non-zero exit
when they cannot start, and a client library free of temporalio.

Here the tests that start no process; the others are in
tests/integration/test_cli.py."""

from __future__ import annotations

import grp
from pathlib import Path

import pytest

from timeshare import cli
from timeshare.cli.server_settings import AGENT_OPTIONS, agent_arguments, job_state, socket_group
from timeshare.credentials import llmd_job_token
from timeshare.workers.temporal.dev_server import (
    MAX_IN_FLIGHT_UPDATES,
    TIMER_FLOOR,
    TIMER_FLOOR_SETTING,
    TRANSFER_QUEUE_READS_PER_SECOND,
    TRANSFER_READS_SETTING,
    dev_server_command,
)

CLOSED = "127.0.0.1:1"


BAD_ARGUMENTS = [
    [],
    ["nope"],
    ["temporal", "--port", "99999"],
    ["temporal", "--ui-port", "http"],
    ["up", "--port", "0"],
    ["agent", "--lock-timeout", "nan"],
    ["agent", "--sim-capacity-gib", "-5"],
    ["agent", "--call-timeout", "inf"],
    ["gateway", "--max-groups", "0"],
    ["gateway", "--listen"],
    ["evict", "--group", "g"],
    ["register", "--group", "g", "--job", "j", "--pid", "1"],
    ["demo", "--iterations", "-1"],
    ["synthetic-job", "--group", "g", "--job", "j", "--train-seconds", "-1"],
    ["synthetic-job", "--group", "g", "--job", "j", "--iteration", "gpu:1,tpu:2"],
    ["synthetic-job", "--group", "g", "--job", "j", "--iteration", "cpu:1"],
    ["synthetic-job", "--group", "g", "--job", "j", "--iteration", "gpu:1,cpu:1:train"],
    ["synthetic-job", "--group", "g", "--job", "j", "--weight", "0"],
    ["agent", "--sim-job-state", "Big Job=2"],
    ["agent", "--sim-job-state", "big=lots"],
    ["agent", "--socket-group", "no-such-group-here"],
    ["up", "--socket-group", "no-such-group-here"],
    ["profile", "--group", "g", "--address", CLOSED],
    ["plan", "--from-groups", "--address", CLOSED],
    ["plan", "/nonexistent.yaml"],
    ["status", "--address", CLOSED],
    ["status", "--group", "Bad Group", "--address", CLOSED],
    ["pause", "--group", "g", "--address", CLOSED],
    ["resume", "--group", "g\x00", "--address", CLOSED],
    ["evict", "--group", "g", "--job", "j", "--address", CLOSED],
    ["drain", "--node", "Node!", "--address", CLOSED],
    ["undrain", "--node", "n", "--address", CLOSED],
    ["up", "--backend", "gpu"],
    ["up", "--node", "Bad Node"],
    ["up", "--listen", "50051"],
    ["agent", "--backend", "cuda+app"],
    ["register", "--group", "g", "--job", "j", "--pid", "4242", "--socket", "/nonexistent.sock"],
    ["temporal", "--dynamic-config", "history.transferProcessorMaxPollRPS"],
    ["temporal", "--dynamic-config", "=5"],
]


@pytest.mark.parametrize("argv", BAD_ARGUMENTS, ids=lambda argv: " ".join(argv) or "(none)")
def test_every_bad_argument_is_one_line_and_no_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_unknown_socket_group_is_named_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["agent", "--socket-group", "no-such-group-here"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--socket-group" in line and "no group named 'no-such-group-here'" in line
    # A number is a GID as it stands (a container need not list the group).
    assert cli.build_parser().parse_args(["agent", "--socket-group", "4711"]).socket_group == 4711
    root = grp.getgrgid(0).gr_name
    assert cli.build_parser().parse_args(["agent", "--socket-group", root]).socket_group == 0


def test_llmd_token_derives_the_jobs_token_from_the_gateways_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIMESHARE_LLMD_SECRET", "s3cret")
    with pytest.raises(SystemExit) as exited:
        cli.main(["llmd-token", "--group", "g", "--job", "a"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == llmd_job_token(b"s3cret", "g", "a")
    monkeypatch.delenv("TIMESHARE_LLMD_SECRET")
    with pytest.raises(SystemExit) as exited:
        cli.main(["llmd-token", "--group", "g", "--job", "a"])
    assert exited.value.code == 2 and "TIMESHARE_LLMD_SECRET" in capsys.readouterr().err


def test_the_benchmarks_zero_byte_sim_state_is_accepted() -> None:
    """`python -m bench handover` (`--two-nodes --state-gib 0` too) and `bench.scale`
    start their agents with no simulated state, to time the orchestration alone."""
    args = cli.build_parser().parse_args(["agent", "--sim-state-gib", "0"])
    assert args.sim_state_gib == 0.0


def test_up_passes_every_agent_flag_on_to_its_agent() -> None:
    """Each agent option given to `timeshare up` reaches the agent it starts
    with the same value; a new agent option is covered by being in the list."""
    given: list[str] = []
    for option in AGENT_OPTIONS:
        default, kind = option.kwargs.get("default"), option.kwargs.get("type")
        value = "/tmp/x" if kind in (Path, None) else str((default or 0) + 0.5)
        if getattr(kind, "__name__", "") == "int":
            value = str((default or 0) + 1)
        if kind is job_state:
            value = "job-x=0.5"
        if kind is socket_group:
            value = "4711"
        if option.kwargs.get("action") == "store_true":
            given.append(option.flag)
            continue
        given.append(f"{option.flag}={value}")
    up = cli.build_parser().parse_args(["up", *given])
    agent = cli.build_parser().parse_args(["agent", *agent_arguments(up)])
    for option in AGENT_OPTIONS:
        assert getattr(agent, option.dest) == getattr(up, option.dest), option.flag
        assert getattr(agent, option.dest) != option.kwargs.get("default"), option.flag


def test_the_scheduler_refuses_an_event_loop_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown loop named by the environment, or uvloop where it is not
    installed: one line saying what to do, before anything connects."""
    from timeshare.cli import server_commands

    monkeypatch.setenv("TIMESHARE_EVENT_LOOP", "libev")
    args = cli.build_parser().parse_args(["scheduler", "--temporal=127.0.0.1:1"])
    assert args.handler(args) == 1
    assert "unknown event loop 'libev'" in capsys.readouterr().err
    monkeypatch.setattr(server_commands, "uvloop_installed", lambda: False)
    args = cli.build_parser().parse_args(["scheduler", "--event-loop=uvloop"])
    assert args.handler(args) == 1
    said = capsys.readouterr().err.strip()
    assert said.count("\n") == 0 and "--event-loop asyncio" in said, said


def test_temporal_dynamic_config_goes_over_timeshares_own() -> None:
    """`timeshare temporal --dynamic-config KEY=VALUE`: one value per key
    reaches the dev server, the given one; the other settings stay."""
    args = cli.build_parser().parse_args(
        ["temporal", f"--dynamic-config={TRANSFER_READS_SETTING}=20", "--dynamic-config=a.b=c"]
    )
    command = dev_server_command(
        7233, 8233, Path("/tmp/x"), dynamic_config=dict(args.dynamic_config)
    )
    values = [command[i + 1] for i, part in enumerate(command) if part == "--dynamic-config-value"]
    transfer = [v for v in values if v.startswith(f"{TRANSFER_READS_SETTING}=")]
    assert transfer == [f"{TRANSFER_READS_SETTING}=20"] and "a.b=c" in values
    assert f"history.maxInFlightUpdates={MAX_IN_FLIGHT_UPDATES}" in values
    default = dev_server_command(7233, 8233, Path("/tmp/x"))
    assert f"{TRANSFER_READS_SETTING}={TRANSFER_QUEUE_READS_PER_SECOND}" in default
    # Sub-second timers ring on time, not a second after they are set.
    assert f"{TIMER_FLOOR_SETTING}={TIMER_FLOOR}" in default
