"""Where the operator places llm-d groups: `--llmd-gpus PATTERN=NODE:GPU[,GPU...]`.

llm-d's clients name no nodes and no GPUs, so a group they create would claim
every GPU of its node, and two groups could never share a node. Each value
places the groups whose id matches PATTERN (fnmatch, the first matching value
wins) on those GPUs of NODE.
"""

from __future__ import annotations

import fnmatch

from pydantic import BaseModel, ValidationError

from timeshare.models import GroupPolicy
from timeshare.names import check_name

FLAG = "--llmd-gpus"
FORM = "PATTERN=NODE:GPU[,GPU...] (trainers-*=node-0:0,1, say)"


class LlmdPlacement(BaseModel):
    pattern: str
    node: str
    gpus: list[int]

    def matches(self, group: str) -> bool:
        return fnmatch.fnmatchcase(group, self.pattern)

    def describe(self) -> str:
        return f"{self.pattern}={self.node}:{','.join(str(g) for g in self.gpus)}"


def parse_placement(text: str) -> LlmdPlacement:
    """One value of the flag; ValueError names the flag, the value and the form."""
    pattern, equals, where = text.partition("=")
    node, colon, indices = where.partition(":")
    pattern, node = pattern.strip(), node.strip()
    if not equals or not colon or not pattern or not node or not indices.strip():
        raise ValueError(f"{FLAG} {text!r}: expected {FORM}")
    try:
        check_name("node", node)
    except ValueError as error:
        raise ValueError(f"{FLAG} {text!r}: {error}") from None
    bad = [index for index in indices.split(",") if not index.strip().isdigit()]
    if bad:
        raise ValueError(f"{FLAG} {text!r}: {bad[0]!r} is not a GPU index; expected {FORM}")
    try:
        # The same rules as a group policy's gpus (range, no index twice).
        gpus = GroupPolicy(gpus=[int(index) for index in indices.split(",")]).gpus
    except ValidationError as error:
        problem = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(f"{FLAG} {text!r}: {problem}") from None
    return LlmdPlacement(pattern=pattern, node=node, gpus=gpus)


def parse_placements(values: list[str] | None) -> list[LlmdPlacement]:
    return [parse_placement(value) for value in values or []]


def placement_for(placements: list[LlmdPlacement], group: str) -> LlmdPlacement | None:
    return next((p for p in placements if p.matches(group)), None)
