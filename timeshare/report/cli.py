"""`timeshare report GROUP --out FILE`: fetch a group's history and draw it.
Every failure is one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from timeshare.errors import TimeshareError
from timeshare.history import GroupHistory
from timeshare.report import check_format, write_report
from timeshare.report.png import MissingMatplotlib


class ReportInputError(Exception):
    pass


def load_history(path: Path) -> GroupHistory:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ReportInputError(f"cannot read {path}: {error}") from None
    try:
        return GroupHistory.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise ReportInputError(
            f"{path} is not a group history: {where}: {first['msg']} "
            f"({error.error_count()} problem(s))"
        ) from None


def gateway_history(address: str | None, group: str) -> GroupHistory:
    import timeshare

    with timeshare.connect(address) as client:
        return client.group_history(group)


def run_report(group: str, out: Path, fetch: Callable[[], GroupHistory]) -> int:
    """Draw the history ``fetch`` returns into ``out``; print the path written."""
    try:
        check_format(out)
        history = fetch()
        if history.group != group:
            raise ReportInputError(f"the history is of group {history.group!r}, not {group!r}")
        written = write_report(history, out)
    except (ReportInputError, TimeshareError, ValueError) as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"cannot write {out}: {error.strerror or error}")
    except MissingMatplotlib as error:
        return _fail(str(error))
    print(written)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    source: Path | None = args.from_json
    if source is not None:
        return run_report(args.group, args.out, lambda: load_history(source))
    return run_report(args.group, args.out, lambda: gateway_history(args.address, args.group))


def _fail(message: str) -> int:
    print(f"timeshare report: {message}", file=sys.stderr)
    return 1
