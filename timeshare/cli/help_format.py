"""How every `timeshare` help page reads: each option's default beside it, as
kubectl and ray show theirs, and the examples of the epilog kept as written."""

from __future__ import annotations

import argparse
import textwrap

# Defaults that say nothing a reader needs: an unset value, a switch that is
# off, an empty list. Their help says what happens instead, where it matters.
SILENT_DEFAULTS: tuple[object, ...] = (None, False, "", [], argparse.SUPPRESS)


def shows_default(action: argparse.Action) -> bool:
    """Whether the help line of ``action`` should end with its default."""
    if not action.help or action.help == argparse.SUPPRESS:
        return False
    if any(action.default is silent or action.default == silent for silent in SILENT_DEFAULTS):
        return False
    # The help already words its default ("default: on PATH", "%(default)s").
    return "default" not in action.help.lower()


class HelpFormatter(argparse.HelpFormatter):
    """Defaults shown (argparse's ArgumentDefaultsHelpFormatter, less the
    defaults that say nothing); descriptions and epilogs wrapped line by
    line, and an indented line (an example) kept as it is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            if not line or line.startswith(" "):
                lines.append(indent + line)
            else:
                lines.append(textwrap.fill(line, width, initial_indent=indent,
                                           subsequent_indent=indent))  # fmt: skip
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return f"{text} (default: %(default)s)" if shows_default(action) else text
