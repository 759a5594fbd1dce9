"""The CLI's habits, as kubectl's, ray's and temporal's users expect them:
every help shows its defaults and an example (each of which parses), choices
are listed, one flag style names a group, a job and a node (the old
positional forms still work, with a note), arguments are checked before
anything starts, errors read as sentences, exit codes are documented in one
place, and `timeshare --version` answers."""

from __future__ import annotations

import argparse
import importlib.metadata
import shlex
import tomllib
from pathlib import Path

import pytest

import timeshare
from timeshare import cli
from timeshare.cli.backend_names import chosen_backend, known_backends
from timeshare.cli.examples import EXAMPLES, example_lines
from timeshare.cli.exit_codes import ExitCode
from timeshare.cli.help_format import shows_default

REPO = Path(__file__).resolve().parents[2]
PARSERS = cli.subcommand_parsers(cli.build_parser())


def run_cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    return int(exited.value.code or 0)


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert timeshare.__version__ == importlib.metadata.version("timeshare") == project["version"]
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"timeshare {project['version']}"


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_help_shows_its_defaults_and_an_example(command: str) -> None:
    parser = PARSERS[command]
    text = parser.format_help()
    assert example_lines(command), f"`timeshare {command}` has no example in timeshare.cli.examples"
    assert "examples:" in text and example_lines(command)[0] in text
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{command} {action.option_strings or action.dest} has no help"
        if shows_default(action):
            assert f"(default: {action.default})" in " ".join(text.split()), (command, action.dest)


def test_the_formatter_shows_defaults_that_say_something() -> None:
    parser = cli.build_parser()
    up = " ".join(cli.subcommand_parsers(parser)["up"].format_help().split())
    for shown in ("(default: 7233)", "(default: 8233)", "(default: 127.0.0.1:50051)",
                  "(default: 10.0)", "(default: 300.0)", "(default: 20.0)"):  # fmt: skip
        assert shown in up, shown
    assert "(default: None)" not in up and "(default: False)" not in up


@pytest.mark.parametrize(
    "command, example",
    [(command, line) for command, lines in EXAMPLES.items() for line in lines],
)
def test_every_example_parses_with_its_commands_parser(command: str, example: str) -> None:
    words = shlex.split(example, comments=True)
    words = words[words.index("timeshare") + 1 :]
    assert words[0] == command
    cli.build_parser().parse_args(words)  # exits 2, failing the test, on a lost flag


def test_every_command_has_an_example_and_every_example_a_command() -> None:
    assert set(EXAMPLES) == set(PARSERS)


def test_backend_lists_its_choices_and_says_that_they_stack() -> None:
    help_text = " ".join(PARSERS["agent"].format_help().split())
    for name in known_backends():
        assert name in help_text
    assert "app+cuda" in help_text and "SIMULATED" in help_text


@pytest.mark.parametrize("name", ["cuda", "app+cuda", "freeze+cuda", "app+sim", "sim"])
def test_a_stack_of_known_backends_is_taken(name: str) -> None:
    assert cli.build_parser().parse_args(["agent", "--backend", name]).backend == name


def test_up_with_an_unknown_backend_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The unit tests' conftest fails a test that starts a process: the
    refusal comes while the command line is read, before Temporal starts."""
    assert run_cli(["up", "--backend", "gpu"]) == ExitCode.USAGE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "there is no backend 'gpu'" in line and "app+cuda" in line


def test_a_host_with_gpus_and_no_backend_is_warned_loudly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("timeshare.cli.backend_names.nvidia_devices", lambda: ["/dev/nvidia0"])
    assert chosen_backend(None, "up") == "sim"
    warning = capsys.readouterr().err
    assert "WARNING" in warning and "SIMULATED" in warning and "--backend cuda" in warning
    assert chosen_backend("cuda", "up") == "cuda"
    assert capsys.readouterr().err == ""


def test_no_warning_without_gpus(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("timeshare.cli.backend_names.nvidia_devices", lambda: [])
    assert chosen_backend(None, "agent") == "sim"
    assert capsys.readouterr().err == ""


def test_a_bad_pid_reads_as_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["register", "--group", "g", "--job", "j", "--pid", "1"]) == ExitCode.USAGE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "1 is out of range: give a whole number from 2 to 4194304" in line
    assert "e+" not in line


@pytest.mark.parametrize(
    "argv, flags",
    [
        (["evict", "g", "j"], {"group": "g", "job": "j"}),
        (["status", "g"], {"group": "g"}),
        (["pause", "g"], {"group": "g"}),
        (["report", "g", "--out", "x.html"], {"group": "g"}),
        (["drain", "n1"], {"node": "n1"}),
        (["profile", "g"], {"group": "g"}),
    ],
)
def test_the_old_positional_forms_still_work_with_a_deprecation_note(
    argv: list[str], flags: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    cli.resolve_subjects(args, args.parser)
    assert {name: getattr(args, name) for name in flags} == flags
    note = capsys.readouterr().err
    assert "deprecated" in note and f"--{next(iter(flags))}" in note


def test_the_flag_form_says_nothing_and_a_contradiction_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["evict", "--group", "g", "--job", "j"])
    cli.resolve_subjects(args, args.parser)
    assert (args.group, args.job) == ("g", "j") and capsys.readouterr().err == ""
    args = parser.parse_args(["evict", "g", "--group", "h", "--job", "j"])
    with pytest.raises(SystemExit) as exited:
        cli.resolve_subjects(args, args.parser)
    assert exited.value.code == ExitCode.USAGE


def test_synthetic_jobs_agent_socket_is_socket_as_everywhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = cli.build_parser()
    new = parser.parse_args(["synthetic-job", "--group", "g", "--job", "j", "--socket", "/s"])
    assert new.agent_socket == "/s" and capsys.readouterr().err == ""
    old = parser.parse_args(["synthetic-job", "--group", "g", "--job", "j", "--agent-socket", "/s"])
    assert old.agent_socket == "/s" and "--agent-socket is deprecated" in capsys.readouterr().err


def test_exit_codes_are_documented_in_one_place() -> None:
    help_text = cli.build_parser().format_help()
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    for code in ExitCode:
        assert f"\n  {int(code)} " in help_text, code
        assert f"| {int(code)} |" in page, f"docs/troubleshooting.md lacks exit code {int(code)}"
