"""Reading a plan's input: YAML (the `plan` extra's PyYAML) or JSON (no
extra needed), validated by the spec's models. Every problem is one line
that names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from timeshare.placement.spec import PlanInput

YAML_SUFFIXES = (".yaml", ".yml")


class PlanInputError(ValueError):
    pass


class MissingYaml(PlanInputError):
    pass


def load_plan_input(path: Path) -> PlanInput:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise PlanInputError(f"cannot read {path}: {error}") from None
    document = _parse(path, text)
    if not isinstance(document, dict):
        raise PlanInputError(f"{path}: not a mapping; give jobs: and gpu_sets: (see --help)")
    try:
        return PlanInput.model_validate(document)
    except ValidationError as error:
        raise PlanInputError(f"{path}: {first_problem(error, document)}") from None


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() not in YAML_SUFFIXES:
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise PlanInputError(
                f"{path}: line {error.lineno}, column {error.colno}: {error.msg} "
                "(JSON; name the file .yaml for YAML)"
            ) from None
    try:
        import yaml
    except ImportError:
        raise MissingYaml(
            f"{path}: YAML input needs PyYAML: pip install 'timeshare[plan]' (or give JSON)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise PlanInputError(f"{path}: {where}{problem}") from None


def first_problem(error: ValidationError, document: Any) -> str:
    """The first problem as `field.path: message`, the job named where there is one."""
    first = error.errors()[0]
    where = _path(first["loc"], document)
    message = str(first["msg"]).removeprefix("Value error, ")
    count = error.error_count()
    more = f" (and {count - 1} more problem{'s' if count > 2 else ''})" if count > 1 else ""
    if not where:
        return f"{message}{more}"
    return f"{where}: {message}{more}"


def _path(location: tuple[int | str, ...], document: Any) -> str:
    parts: list[str] = []
    node = document
    for step in location:
        if isinstance(step, int):
            parts[-1:] = [f"{parts[-1] if parts else ''}[{step}]"]
            node = node[step] if isinstance(node, list) and step < len(node) else None
            name = node.get("name") if isinstance(node, dict) else None
            if isinstance(name, str) and parts and parts[-1].startswith("jobs["):
                parts[-1] += f" ({name})"
        else:
            parts.append(str(step))
            node = node.get(step) if isinstance(node, dict) else None
    return ".".join(parts)
