"""What a command acts on, named one way everywhere: `--group G`, `--job J`,
`--node N`. Commands that took them as positional arguments (`evict GROUP
JOB`, `status GROUP`, ...) still do, with a deprecation note on stderr."""

from __future__ import annotations

import argparse
import sys

SUBJECT_HELP = {
    "group": "the group",
    "job": "the job, in its group",
    "node": "the node, as its agent's --node names it",
}


def positional_dest(name: str) -> str:
    return f"{name}_positional"


def add_subjects(
    parser: argparse.ArgumentParser, *names: str, required: bool = True, help_text: str = ""
) -> None:
    """``--NAME`` for each of ``names``, and the old positional form, hidden
    from the help. ``required``: the command needs every one of them."""
    for name in names:
        text = help_text if help_text and len(names) == 1 else SUBJECT_HELP[name]
        parser.add_argument(f"--{name}", help=f"{text} (required)" if required else text)
    for name in names:
        parser.add_argument(positional_dest(name), nargs="?", help=argparse.SUPPRESS)
    parser.set_defaults(subjects=(names, required))


def resolve_subjects(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fold the positional form into the flags; a missing or contradicting
    one is a usage error (exit 2), as argparse's own are."""
    names, required = getattr(args, "subjects", ((), False))
    old = [getattr(args, positional_dest(name)) for name in names]
    for name, given in zip(names, old, strict=True):
        flagged = getattr(args, name)
        if given is not None and flagged is not None and given != flagged:
            parser.error(
                f"--{name} {flagged} and the positional {given} differ; give --{name} once"
            )
        if given is not None:
            setattr(args, name, given)
    missing = [f"--{name}" for name in names if getattr(args, name) is None]
    if required and missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    if any(value is not None for value in old):
        flags = " ".join(f"--{name} {getattr(args, name)}" for name in names if getattr(args, name))
        print(
            f"timeshare {args.command}: positional {' '.join(n.upper() for n in names)} is "
            f"deprecated; write `timeshare {args.command} {flags}`",
            file=sys.stderr,
        )
