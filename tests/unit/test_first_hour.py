"""What a new user met in their first hour, each fixed here with
a test that fails on the old behaviour: `join`'s options are keyword-only, a
half-configured integration says which variable is missing, a job finds the
agent of `timeshare up` with no variable set, every process timeshare
starts runs with `-P`, and the demo's two counts say what each counts."""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import timeshare
import timeshare.aio
from timeshare import agent_socket
from timeshare.errors import InvalidArgument
from timeshare.integrations.environment import turns_from_env
from timeshare.integrations.turns import ENV_GROUP, ENV_JOB, ENV_TURNS_FD, NoTurns
from timeshare.report.data import ReportSummary, summary_line
from timeshare.self_command import SAFE_PATH, timeshare_command
from timeshare.timeline import UtilisationFigures, summary
from timeshare.workers.stack.up_checks import check_agent_socket_free

REPO = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("timeshare", "workers", "activities", "workflows")


@pytest.mark.parametrize("join", [timeshare.Client.join, timeshare.aio.Client.join])
def test_join_takes_only_group_and_job_by_position(join: object) -> None:
    parameters = inspect.signature(join).parameters  # type: ignore[arg-type]
    positional = [
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self"
    ]
    assert positional == ["group", "job"]
    for name in ("nodes", "policy", "register", "weight", "priority", "backfill"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_a_positional_weight_is_a_type_error_not_a_policy() -> None:
    with pytest.raises(TypeError):
        timeshare.Client.join(object(), "g", "j", ["n"], 2.0)  # type: ignore[arg-type, call-arg]


@pytest.fixture
def no_turns_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (ENV_GROUP, ENV_JOB, ENV_TURNS_FD):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("given, missing", [(ENV_GROUP, ENV_JOB), (ENV_JOB, ENV_GROUP)])
def test_a_half_configured_integration_names_the_missing_variable(
    no_turns_environment: pytest.MonkeyPatch, given: str, missing: str
) -> None:
    no_turns_environment.setenv(given, "grpo-pair")
    with pytest.raises(InvalidArgument) as refused:
        turns_from_env()
    assert f"{missing} is not" in str(refused.value) and given in str(refused.value)


def test_neither_variable_is_timeshare_absent(no_turns_environment: pytest.MonkeyPatch) -> None:
    assert isinstance(turns_from_env(), NoTurns)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's runtime folder (XDG_RUNTIME_DIR), with no socket set by hand."""
    monkeypatch.delenv(agent_socket.AGENT_SOCKET_ENV, raising=False)
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


@pytest.fixture
def serving(runtime_dir: Path) -> Iterator[str]:
    """A listening socket where `timeshare up` puts its agent's by default,
    its folder made as `up` makes it."""
    path = agent_socket.local_agent_socket()
    check_agent_socket_free(path, given=False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()
        yield path


def test_a_job_finds_the_socket_of_up_with_no_variable_set(serving: str) -> None:
    if os.path.exists(agent_socket.SYSTEM_AGENT_SOCKET):
        pytest.skip("this host runs a node agent as a service, which a job asks first")
    assert serving.startswith(os.environ["XDG_RUNTIME_DIR"])
    assert agent_socket.agent_socket() == serving


def test_a_second_up_does_not_take_a_served_socket(serving: str) -> None:
    with pytest.raises(Exception, match="an agent already serves"):
        check_agent_socket_free(serving, given=False)


def test_the_variable_wins_where_it_is_set(
    runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(agent_socket.AGENT_SOCKET_ENV, "/elsewhere/agent.sock")
    assert agent_socket.local_agent_socket() == "/elsewhere/agent.sock"
    assert agent_socket.agent_socket() == "/elsewhere/agent.sock"


def test_a_socket_in_a_folder_others_may_write_to_is_not_trusted(runtime_dir: Path) -> None:
    folder = runtime_dir / "timeshare"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    path = str(folder / "agent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        assert not agent_socket.trusted(path)
        assert agent_socket.agent_socket() != path
    with pytest.raises(Exception, match="not this user's alone"):
        check_agent_socket_free(path, given=False)


def test_every_timeshare_child_runs_with_safe_path() -> None:
    """`python -m` puts the working directory first on sys.path: a child
    started inside a clone would import the clone's timeshare/ folder, which
    lacks timeshare.workers. Every child timeshare starts goes through
    timeshare.self_command, which adds -P."""
    assert timeshare_command("up")[1] == SAFE_PATH
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            if path.name == "self_command.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.List | ast.Tuple) and _runs_a_module(node.elts):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"start these through timeshare.self_command: {offenders}"


def _runs_a_module(elements: list[ast.expr]) -> bool:
    """[sys.executable, "-m", ...]: a Python child started without -P."""
    return any(
        isinstance(first, ast.Attribute)
        and first.attr == "executable"
        and isinstance(second, ast.Constant)
        and second.value == "-m"
        for first, second in itertools.pairwise(elements)
    )


def test_the_demos_lines_and_its_report_each_say_what_they_count() -> None:
    """`make demo` printed "4 switches took 0.63 s in all" while its report
    said "14 switches": one counts the switches a job waited for, the other
    every switch, prefetches included. Each now says which."""
    figures = UtilisationFigures(
        jobs=2, span_seconds=20.0, gpu_busy_seconds=15.0, dedicated_gpu_seconds=36.0,
        dedicated_utilisation=15 / 36, shared_gpu_seconds=20.0, shared_utilisation=0.75,
        switches=4, switch_seconds=0.63, wait_seconds=2.0,
    )  # fmt: skip
    terminal = summary(figures)
    assert "4 switches a job waited for took 0.63 s" in terminal
    assert "busy 75% (the jobs' GPU phases over the run)" in terminal
    report = ReportSummary(
        group="demo", captured_at=20.0, span_seconds=20.0, jobs=[], switches=14,
        failed_switches=0, switch_seconds=3.2, bytes_moved=0, utilisation=0.788,
    )  # fmt: skip
    line = summary_line(report)
    assert "14 switches in all, those done ahead of a request included" in line
    assert "GPUs held by a job 79% of the time" in line
