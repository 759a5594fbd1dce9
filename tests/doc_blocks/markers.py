"""What a documentation block's marker says: an HTML comment on the line
before its fence, invisible on the rendered page.

    <!-- check: run -->                  run as it is, in a scratch folder
    <!-- check: run with a stack -->     likewise, TIMESHARE_ADDRESS and
                                         TIMESHARE_AGENT_SOCKET set to a LocalStack's
    <!-- check: run, save as job.py -->  a Python block: written to job.py for
                                         the blocks after it (run with a stack)
    <!-- check: run as a test -->        a Python block that is a test file:
                                         run with pytest
    <!-- check: not run: REASON[: what it needs] -->

A block that is not run still has its flags and names checked. REASON is one
of NOT_RUN_REASONS; ``tested by PATH`` names the test that runs it."""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile(r"<!--\s*check:\s*(?P<body>.*?)\s*-->")
NOT_RUN_REASONS = {
    "gpu": "needs an NVIDIA GPU and its driver",
    "kubernetes": "needs a Kubernetes cluster",
    "slurm": "needs a Slurm cluster",
    "another host": "runs on, or reaches, another host",
    "network": "downloads packages from an index",
    "serves": "runs until it is stopped (a server, a stack)",
    "long": "takes minutes (a benchmark, a training run, the whole suite)",
    "fragment": "a part of a program: the names around it are the reader's",
    "root": "needs root, or changes this machine's configuration",
    "tested by": "a test of the suite runs it: the path after the reason",
}


class MarkerError(ValueError):
    """A marker that says nothing this check understands."""


@dataclass(frozen=True)
class Marker:
    run: bool
    with_stack: bool = False
    save_as: str = ""
    as_test: bool = False
    reason: str = ""
    # For "tested by": the test file, relative to the repository.
    tested_by: str = ""


def parse_marker(body: str) -> Marker:
    if body == "run":
        return Marker(run=True)
    if body == "run with a stack":
        return Marker(run=True, with_stack=True)
    if body == "run as a test":
        return Marker(run=True, as_test=True)
    saved = re.fullmatch(r"run, save as (?P<name>[\w.-]+\.py)", body)
    if saved:
        return Marker(run=True, with_stack=True, save_as=saved["name"])
    said = body.removeprefix("not run:").strip() if body.startswith("not run:") else None
    reason = next(
        (
            known
            for known in sorted(NOT_RUN_REASONS, key=len, reverse=True)
            if said is not None and re.match(rf"{known}(?:$|[: ])", said)
        ),
        None,
    )
    if said is None or reason is None:
        raise MarkerError(
            f"marker {body!r}: write 'run', 'run with a stack', 'run, save as NAME.py', "
            f"'run as a test' or 'not run: REASON' with REASON one of "
            f"{', '.join(NOT_RUN_REASONS)}"
        )
    rest = said.removeprefix(reason).strip(" :")
    if reason == "tested by":
        if not rest:
            raise MarkerError(f"marker {body!r}: name the test after 'tested by'")
        return Marker(run=False, reason=reason, tested_by=rest.split()[0])
    return Marker(run=False, reason=reason)
