"""The deployment files under deploy/, read without starting anything: every
object the Kubernetes files hold (and the example jobs, and the Job in the
Temporal Helm values) validates strictly against Kubernetes 1.34's own
schemas, offline, with kubernetes-validate; the Temporal values register
exactly the search attributes the scheduler writes; a systemd unit's command
is one the CLI accepts; the Slurm example oversubscribes a partition that
allows it. What starts processes (kubectl, systemd-analyze, a served agent
socket): tests/integration/test_deploy_kubernetes.py and
tests/integration/test_deploy_hosts.py."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.deploy_files import (
    DEPLOY,
    KUBE,
    KUBERNETES_VERSION,
    SLURM,
    UNITS,
    Obj,
    env_file,
    exec_start_arguments,
    fill_helm_template,
    load,
    parse_cli,
    plain_env,
    pod_spec,
    unit_settings,
    validate_strictly,
)
from timeshare.cli import gateway_security, temporal_settings
from timeshare.workers.common.temporal_settings import DEFAULT_WAIT_SECONDS
from timeshare.workers.temporal.dev_server import (
    MAX_IN_FLIGHT_UPDATES,
    SEARCH_ATTRIBUTES,
    TIMER_FLOOR_SETTING,
    TRANSFER_QUEUE_READS_PER_SECOND,
    TRANSFER_READS_SETTING,
)


@pytest.fixture(scope="module")
def temporal_values() -> Obj:
    values: Obj = yaml.safe_load((DEPLOY / "temporal" / "values.yaml").read_text())
    return values


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
    # Sub-second deadlines ring well under Temporal's default floor of 1 s.
    [floor] = server["dynamicConfig"][TIMER_FLOOR_SETTING]
    assert floor["value"].endswith("ms") and int(floor["value"][:-2]) < 1000


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


@pytest.mark.parametrize("workload", ["gateway.yaml", "agent.yaml"])
def test_a_pod_waiting_for_temporal_is_not_restarted_by_its_startup_probe(workload: str) -> None:
    """A service started before Temporal (or during its restart) waits for it
    up to --temporal-wait and says it is ready only then: its startup probe
    must give it that long."""
    (obj,) = [o for o in load(KUBE / "base" / workload) if "template" in o.get("spec", {})]
    (container,) = pod_spec(obj)["containers"]
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= DEFAULT_WAIT_SECONDS


def test_the_fleet_values_only_add_to_the_base_values(temporal_values: Obj) -> None:
    """Given after values.yaml, they size the services and the store's
    connections and leave every setting timeshare needs as it was."""
    fleet: Obj = yaml.safe_load((DEPLOY / "temporal" / "values-1000-groups.yaml").read_text())
    assert set(fleet) == {"server"}
    assert "dynamicConfig" not in fleet["server"]
    assert "numHistoryShards" not in fleet["server"]["config"]["persistence"]
    for service in ("frontend", "history", "matching"):
        assert fleet["server"][service]["replicaCount"] > temporal_values["server"]["replicaCount"]
    stores = fleet["server"]["config"]["persistence"]["datastores"]
    assert set(stores) <= set(temporal_values["server"]["config"]["persistence"]["datastores"])
