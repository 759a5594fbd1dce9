"""The deployment files under deploy/.

The kustomizations render with kubectl, and every object they produce (and the
example jobs, and the Job in the Temporal Helm values) validates strictly
against Kubernetes 1.34's own schemas, offline, with kubernetes-validate. The
PodMonitor is a Prometheus Operator custom resource with no schema there, so
its shape is checked field by field. Beyond the schemas, the tests check that
the files agree with the code: container arguments are accepted by
timeshare's own CLI parser, the agent's probe really answers against a served
agent socket, network policies select the pods they mean to, and the Temporal
values register exactly the search attributes the scheduler writes. The
systemd units pass `systemd-analyze verify`, and the Slurm scripts parse and
do what they say against a real agent socket.

Here the tests that start no process; the others are in
tests/integration/test_deploy.py."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import os
import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.conftest import REPO
from timeshare.cli import build_parser, gateway_security, temporal_settings
from timeshare.workers.temporal.dev_server import (
    MAX_IN_FLIGHT_UPDATES,
    SEARCH_ATTRIBUTES,
    TRANSFER_QUEUE_READS_PER_SECOND,
    TRANSFER_READS_SETTING,
)

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


@pytest.fixture(scope="module")
def temporal_values() -> Obj:
    values: Obj = yaml.safe_load((DEPLOY / "temporal" / "values.yaml").read_text())
    return values


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


def test_kubernetes_validate_ships_the_pinned_schemas() -> None:
    # kubernetes-validate silently falls back to the newest schemas not newer
    # than the version asked for: make sure 1.34's own are installed.
    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    strict = schemas / f"v{KUBERNETES_VERSION}-local-strict"
    assert (strict / "daemonset-apps-v1.json").is_file()
    assert (strict / "resourceclaim-resource-v1.json").is_file()


def test_example_jobs_validate() -> None:
    assert validate_strictly(load(KUBE / "examples" / "rl-jobs.yaml")) == []


def test_temporal_values_register_the_scheduler_search_attributes(temporal_values: Obj) -> None:
    [template] = temporal_values["extraObjects"]
    job: Obj = yaml.safe_load(fill_helm_template(template))
    assert validate_strictly([job]) == []
    assert job["kind"] == "Job"
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    # After the chart's namespace job, whose hook weight is 0.
    assert int(annotations["helm.sh/hook-weight"]) > 0
    item = pod_spec(job)["containers"][0]
    script = "\n".join(item["args"])
    registered = dict(re.findall(r"\b(\w+)=(Keyword|Int|Bool|Double|Datetime|Text)\b", script))
    assert registered == SEARCH_ATTRIBUTES
    assert "search-attribute create" in script and "search-attribute list" in script

    namespace = plain_env(item)["TEMPORAL_NAMESPACE"]
    created = [n["name"] for n in temporal_values["server"]["config"]["namespaces"]["namespace"]]
    assert temporal_values["server"]["config"]["namespaces"]["create"] is True
    assert namespace in created
    assert namespace == env_file(KUBE / "base" / "settings.env")["TEMPORAL_NAMESPACE"]


def test_temporal_values_use_postgresql_and_admit_every_waiter(temporal_values: Obj) -> None:
    server = temporal_values["server"]
    persistence = server["config"]["persistence"]
    stores = persistence["datastores"]
    assert persistence["defaultStore"] in stores and persistence["visibilityStore"] in stores
    for name in ("default", "visibility"):
        sql = stores[name]["sql"]
        assert sql["pluginName"].startswith("postgres"), name
        assert "existingSecret" in sql and "password" not in sql, name
    [limit] = server["dynamicConfig"]["history.maxInFlightUpdates"]
    assert limit["value"] == MAX_IN_FLIGHT_UPDATES
    # A switch's dispatch and the grant's wait for the transfer queue's next
    # read: faster than Temporal's default of 20 reads a second.
    [reads] = server["dynamicConfig"][TRANSFER_READS_SETTING]
    assert 20 < reads["value"] <= TRANSFER_QUEUE_READS_PER_SECOND


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_runs_a_command_the_cli_accepts(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = unit_settings(DEPLOY / "systemd" / f"timeshare-{name}.service")
    assert unit["EnvironmentFile"] == [f"/etc/timeshare/{name}.env"]
    environment = env_file(DEPLOY / "systemd" / f"{name}.env")
    credentials = Path("/run/credentials") / f"timeshare-{name}.service"
    [command_line] = unit["ExecStart"]
    program, *arguments = exec_start_arguments(command_line, environment, credentials)
    assert program == "/opt/timeshare/bin/timeshare"
    args, unknown = parse_cli(arguments, environment, monkeypatch)
    assert (args.command, unknown) == (name, [])
    temporal = temporal_settings(args)  # flags, then the environment file
    assert temporal.address == environment["TEMPORAL_ADDRESS"]
    assert temporal.namespace == environment["TEMPORAL_NAMESPACE"]
    if name == "agent":
        assert unit["User"] == ["root"]
        assert args.socket == environment["TIMESHARE_AGENT_SOCKET"]
        assert Path(args.socket).parent == Path("/run") / unit["RuntimeDirectory"][0]
        assert unit["RuntimeDirectoryPreserve"] == ["yes"]  # registrations live there
        assert args.backend == environment["TIMESHARE_BACKEND"]
    else:
        assert unit["DynamicUser"] == ["yes"]
    if name == "gateway":
        security = gateway_security(args)
        security.check()  # it listens beyond loopback: TLS and tokens are there
        assert not security.loopback_only and not args.insecure
        # Every file it is given is a credential systemd copies in for it.
        loaded = {c.split(":", 1)[0] for c in unit["LoadCredential"]}
        for path in (args.tls_cert, args.tls_key, args.tokens_file):
            assert path.parent == credentials and path.name in loaded, path


def test_slurm_example_oversubscribes_a_partition_that_allows_it() -> None:
    options = re.findall(r"^#SBATCH (\S+)", (SLURM / "grpo-pair.sbatch").read_text(), re.M)
    assert "--oversubscribe" in options
    assert not any(o.startswith("--gres") for o in options)  # a GRES is never shared
    partition = next(o.split("=", 1)[1] for o in options if o.startswith("--partition="))
    readme = (SLURM / "README.md").read_text()
    assert re.search(rf"PartitionName={partition} .*OverSubscribe=YES:2", readme)
