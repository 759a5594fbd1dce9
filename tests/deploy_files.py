"""What the tests of deploy/ share: where the files are, how they are read
(YAML, env files, systemd units, the Helm values' template expressions), and
the checks a workload is put through (strict validation against Kubernetes'
own schemas, the CLI parser a container's arguments must pass)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.conftest import REPO
from timeshare.cli import build_parser

Obj = dict[str, Any]


DEPLOY = REPO / "deploy"


KUBE = DEPLOY / "kubernetes"


KUBERNETES_VERSION = "1.34.0"


# Custom resources: no schema for them ships with Kubernetes.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}


def load(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def validate_strictly(objects: tuple[Obj, ...] | list[Obj]) -> list[Obj]:
    """Validate every object with a built-in schema; return the custom resources."""
    custom = []
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            custom.append(obj)
            continue
        try:
            used = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {error.message}")
        assert used == "1.34", f"validated against Kubernetes {used}, not 1.34"
    return custom


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def plain_env(item: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in item.get("env", []) if "value" in e}


def parse_cli(
    arguments: list[str], environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[argparse.Namespace, list[str]]:
    """What `timeshare ARGS` makes of these arguments in this environment (the
    CLI reads its TIMESHARE_* defaults from the environment)."""
    for key in [k for k in os.environ if k.startswith("TIMESHARE_")]:
        monkeypatch.delenv(key)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    return build_parser().parse_known_args(arguments)


# The chart's helpers the values use (temporalio/helm-charts templates/_helpers.tpl),
# with what they give for release "temporal" in namespace "temporal".
HELM_EXPRESSIONS = {
    'include "temporal.fullname" .': "temporal",
    'include "temporal.frontendAddress" .': "temporal-frontend:7233",
    ".Release.Namespace": "temporal",
    ".Values.admintools.image.repository": "temporalio/admin-tools",
    ".Values.admintools.image.tag": "1.31.2",
}


def fill_helm_template(text: str) -> str:
    def value(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        assert expression in HELM_EXPRESSIONS, f"unknown template expression: {expression}"
        return HELM_EXPRESSIONS[expression]

    return re.sub(r"\{\{(.*?)\}\}", value, text)


UNITS = ("agent", "scheduler", "gateway")


def unit_settings(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def exec_start_arguments(
    command_line: str, environment: dict[str, str], credentials: Path
) -> list[str]:
    """systemd's expansion: ${VAR} is one argument, $VAR splits at whitespace,
    %d is the service's credentials directory."""
    arguments = []
    for word in shlex.split(command_line.replace("%d", str(credentials))):
        if whole := re.fullmatch(r"\$\{(\w+)\}", word):
            arguments.append(environment[whole.group(1)])
        elif split := re.fullmatch(r"\$(\w+)", word):
            arguments += environment.get(split.group(1), "").split()
        else:
            assert "$" not in word and "%" not in word, word
            arguments.append(word)
    return arguments


SLURM = DEPLOY / "slurm"
