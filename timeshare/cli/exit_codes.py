"""What a `timeshare` command's exit status means: one table for every
command, shown at the end of `timeshare --help` and in docs/troubleshooting.md
(tests/unit/test_cli_help.py checks that the page lists each one)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # A call was refused, a process could not start or stopped on an error,
    # a check failed: the last line on stderr says which and what to do.
    FAILED = 1
    # The command line or an input file is wrong, or a part is not installed:
    # nothing was started or changed.
    USAGE = 2
    # Ctrl-C (SIGINT); 128 + N in general for a command ended by signal N.
    INTERRUPTED = 130


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "done",
    ExitCode.FAILED: "refused or failed; the last line on stderr says why and what to do",
    ExitCode.USAGE: "a wrong argument, input file or missing extra; nothing was started",
    ExitCode.INTERRUPTED: "stopped by Ctrl-C (128 + N: ended by signal N)",
}


def exit_codes_epilog() -> str:
    rows = [f"  {int(code):<4}{MEANINGS[code]}" for code in ExitCode]
    return "\n".join(["exit codes:", *rows])
