"""The Kubernetes deployment files under deploy/kubernetes, against the code.

The kustomizations render with kubectl; every object they produce validates
strictly against Kubernetes' own schemas (tests/unit/test_deploy.py), and
beyond the schemas: container arguments are accepted by timeshare's own CLI
parser, the agent's probe really answers against a served agent socket, the
gateway serves TLS and its probe checks health, and network policies select
the pods they mean to."""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.metadata
import importlib.resources
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.credentials import known_jobs
from tests.deploy_files import (
    KUBE,
    Obj,
    load,
    parse_cli,
    plain_env,
    pod_spec,
    validate_strictly,
)
from tests.integration.test_access import make_certificates
from timeshare.activities.backends.processes import ProcessTable
from timeshare.cli import gateway_security, temporal_settings
from timeshare.workers.agent.registration_socket import serve_agent_socket
from timeshare.workers.gateway.serve import SERVICE_NAME

METRICS_PORT = 9464


KUBECTL = shutil.which("kubectl")


needs_kubectl = pytest.mark.kubectl


@functools.cache
def render(directory: str) -> tuple[Obj, ...]:
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(KUBE / directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def one(objects: tuple[Obj, ...] | list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(workload: Obj) -> Obj:
    containers: list[Obj] = pod_spec(workload)["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def settings(objects: tuple[Obj, ...]) -> dict[str, str]:
    maps = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("timeshare-settings-")
    ]
    assert len(maps) == 1  # one, under a hashed name
    data: dict[str, str] = maps[0]["data"]
    return data


def container_cli(
    workload: Obj, config: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[argparse.Namespace, list[str]]:
    """The container's arguments as Kubernetes expands $(VAR) and as the CLI parses them."""
    item = container(workload)
    environment = {**config, **plain_env(item)}
    arguments = [
        re.sub(r"\$\((\w+)\)", lambda match: environment[match.group(1)], argument)
        for argument in item["args"]
    ]
    return parse_cli(arguments, environment, monkeypatch)


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def workloads(objects: tuple[Obj, ...]) -> dict[str, Obj]:
    return {
        "scheduler": one(objects, "Deployment", "timeshare-scheduler"),
        "gateway": one(objects, "Deployment", "timeshare-gateway"),
        "agent": one(objects, "DaemonSet", "timeshare-agent"),
    }


def volume_of(workload: Obj, path: Path | str) -> Obj:
    """The volume a container path lies on (the longest mount that holds it)."""
    mounts = [
        m for m in container(workload)["volumeMounts"] if Path(path).is_relative_to(m["mountPath"])
    ]
    assert mounts, f"{path} is on no volume"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume: Obj = next(v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"])
    return volume


@needs_kubectl
def test_base_renders_and_validates() -> None:
    objects = render(".")
    assert objects == render("base")
    assert validate_strictly(objects) == []
    kinds = Counter(o["kind"] for o in objects)
    assert kinds == Counter(
        {
            "Namespace": 1,
            "ServiceAccount": 3,
            "ConfigMap": 2,
            "Deployment": 2,
            "DaemonSet": 1,
            "Service": 1,
            "PodDisruptionBudget": 2,
            "NetworkPolicy": 4,
        }
    )
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "timeshare", obj["metadata"]["name"]
    namespace = one(objects, "Namespace", "timeshare")
    # The privileged agent is refused at any lower Pod Security level.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for workload in workloads(objects).values():
        assert container(workload)["image"] == "registry.example.com/timeshare:0.1.0"
        assert pod_labels(workload)["app.kubernetes.io/part-of"] == "timeshare"


@needs_kubectl
def test_agent_daemonset_is_privileged_on_gpu_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(".")
    agent = one(objects, "DaemonSet", "timeshare-agent")
    spec, item = pod_spec(agent), container(agent)
    assert spec["hostPID"] is True
    assert item["securityContext"]["privileged"] is True
    assert item["securityContext"]["runAsUser"] == 0
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(
        t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"]
    )
    resources = item["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]
    # The agent moves the jobs' state; it must not take a GPU from them.
    assert not any("gpu" in name for name in [*resources["requests"], *resources["limits"]])
    assert "resourceClaims" not in spec

    node = next(e for e in item["env"] if e["name"] == "TIMESHARE_NODE")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    socket_path = plain_env(item)["TIMESHARE_AGENT_SOCKET"]
    assert socket_path.startswith("/run/timeshare/")
    mount = next(m for m in item["volumeMounts"] if m["mountPath"] == "/run/timeshare")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/run/timeshare"

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = item[probe]["exec"]["command"]
        assert command[0] == "python" and command[-1] == socket_path, probe

    config = settings(objects)
    args, unknown = container_cli(agent, config, monkeypatch)
    assert unknown == []
    assert args.command == "agent"
    assert args.socket == socket_path
    backends = {e.name for e in importlib.metadata.entry_points(group="timeshare.backends")}
    assert set(args.backend.split("+")) <= backends, args.backend
    assert args.backend == config["TIMESHARE_AGENT_BACKEND"]
    # A dedicated group owns the socket, never root's.
    assert args.socket_group == int(config["TIMESHARE_AGENT_SOCKET_GROUP"]) != 0


async def test_agent_probe_answers_only_while_the_agent_socket_serves(tmp_path: Path) -> None:
    agent = one(load(KUBE / "base" / "agent.yaml"), "DaemonSet", "timeshare-agent")
    command = container(agent)["livenessProbe"]["exec"]["command"]
    socket_path = tmp_path / "agent.sock"
    probe = [sys.executable, *command[1:-1], str(socket_path)]

    async def run_probe() -> int:
        process = await asyncio.create_subprocess_exec(
            *probe, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        return await asyncio.wait_for(process.wait(), 30)

    assert await run_probe() != 0  # nothing serves yet
    server = await serve_agent_socket(str(socket_path), ProcessTable(), credentials=known_jobs())
    try:
        assert await run_probe() == 0
    finally:
        server.close()
        await server.wait_closed()
        socket_path.unlink()
    assert await run_probe() != 0


@needs_kubectl
def test_gateway_serves_tls_with_tokens_and_probes_its_health(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render(".")
    gateway = one(objects, "Deployment", "timeshare-gateway")
    item = container(gateway)
    args, unknown = container_cli(gateway, settings(objects), monkeypatch)
    assert (args.command, unknown) == ("gateway", [])
    host, _, port = args.listen.rpartition(":")
    assert host == "0.0.0.0"  # reachable by the Service
    # What the gateway itself demands before serving beyond loopback.
    security = gateway_security(args)
    security.check()
    assert not args.insecure
    tls = volume_of(gateway, args.tls_cert)
    assert tls == volume_of(gateway, args.tls_key)
    assert tls["secret"]["secretName"] == "timeshare-gateway-tls"
    assert volume_of(gateway, args.tokens_file)["secret"]["secretName"] == (
        "timeshare-gateway-tokens"
    )
    ports = {p["name"]: p["containerPort"] for p in item["ports"]}
    assert ports["grpc"] == int(port)
    assert gateway["spec"]["replicas"] >= 2

    service = one(objects, "Service", "timeshare-gateway")
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(gateway))
    [service_port] = service["spec"]["ports"]
    assert service_port["port"] == 50051 and service_port["targetPort"] == "grpc"
    service_name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"

    script = KUBE / "base" / "probes" / "gateway_health.py"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        program, path, address, server_name, ca, *service_names = item[probe]["exec"]["command"]
        assert program == "python", probe
        assert address == f"127.0.0.1:{port}", probe
        assert server_name == service_name, probe  # the name jobs verify
        assert volume_of(gateway, ca) == tls, probe
        assert service_names == ([SERVICE_NAME] if probe == "readinessProbe" else []), probe
        probes = volume_of(gateway, path)["configMap"]["name"]
        [shipped] = [o for o in objects if o["metadata"]["name"] == probes]
        assert shipped["data"][Path(path).name] == script.read_text(), probe


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificates")
async def test_gateway_probe_checks_health_over_tls(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path)  # the server's names: localhost, 127.0.0.1
    server = grpc.aio.server()
    service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(service, server)
    key_and_chain = (
        certificates["server.key"].read_bytes(),
        certificates["server.pem"].read_bytes(),
    )
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([key_and_chain]))
    script = KUBE / "base" / "probes" / "gateway_health.py"
    ca = str(certificates["ca.pem"])

    async def probe(server_name: str, *service_name: str) -> int:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(script), f"127.0.0.1:{port}", server_name, ca, *service_name,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        return await asyncio.wait_for(process.wait(), 30)

    await server.start()
    try:
        await service.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await probe("localhost") == 1
        await service.set("", health_pb2.HealthCheckResponse.SERVING)
        assert await probe("localhost") == 0
        assert await probe("localhost", SERVICE_NAME) == 1  # unknown service: NOT_FOUND
        await service.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        assert await probe("localhost", SERVICE_NAME) == 0
        # A certificate that does not name what jobs call it by fails the probe.
        assert await probe("timeshare-gateway.timeshare.svc") == 1
    finally:
        await server.stop(grace=None)
    assert await probe("localhost") == 1


@needs_kubectl
def test_scheduler_runs_two_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(".")
    scheduler = one(objects, "Deployment", "timeshare-scheduler")
    assert scheduler["spec"]["replicas"] == 2
    args, unknown = container_cli(scheduler, settings(objects), monkeypatch)
    assert (args.command, unknown) == ("scheduler", [])
    temporal = temporal_settings(args)  # flags, then the environment
    assert temporal.address == settings(objects)["TEMPORAL_ADDRESS"]
    assert temporal.namespace == settings(objects)["TEMPORAL_NAMESPACE"]
    budget = one(objects, "PodDisruptionBudget", "timeshare-scheduler")
    assert selects(budget["spec"]["selector"], pod_labels(scheduler))


@needs_kubectl
def test_service_accounts_carry_no_token_and_no_role() -> None:
    objects = render(".")
    assert not any(o["kind"] in {"Role", "RoleBinding", "ClusterRole"} for o in objects)
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    for name, workload in workloads(objects).items():
        spec = pod_spec(workload)
        assert spec["serviceAccountName"] == f"timeshare-{name}"
        assert accounts[f"timeshare-{name}"]["automountServiceAccountToken"] is False
        assert spec["automountServiceAccountToken"] is False
    for name in ("scheduler", "gateway"):
        security = pod_spec(workloads(objects)[name])["securityContext"]
        assert security["runAsNonRoot"] is True


@needs_kubectl
def test_network_policies_admit_only_what_is_needed() -> None:
    objects = render(".")
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    pods = {name: pod_labels(w) for name, w in workloads(objects).items()}

    deny = policies["default-deny"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny

    # Only the gateway takes connections, only from job namespaces, only on its port.
    ingress = {name: spec for name, spec in policies.items() if spec.get("ingress") is not None}
    assert list(ingress) == ["gateway-from-job-namespaces"]
    gateway_policy = ingress["gateway-from-job-namespaces"]
    assert [n for n, labels in pods.items() if selects(gateway_policy["podSelector"], labels)] == [
        "gateway"
    ]
    [rule] = gateway_policy["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"timeshare.io/jobs": "true"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 50051}]

    # Every process reaches the Temporal frontend the settings name.
    host, _, port = settings(objects)["TEMPORAL_ADDRESS"].rpartition(":")
    service, temporal_namespace = host.split(".")[:2]
    temporal = policies["temporal-frontend"]
    assert all(selects(temporal["podSelector"], labels) for labels in pods.values())
    [rule] = temporal["egress"]
    [peer] = rule["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": temporal_namespace
    }
    assert service == "temporal-frontend"
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "frontend"
    assert rule["ports"] == [{"protocol": "TCP", "port": int(port)}]

    dns = policies["dns"]
    assert dns["podSelector"] == {}
    assert {p["port"] for p in dns["egress"][0]["ports"]} == {53}


@needs_kubectl
def test_monitoring_overlay_scrapes_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render("overlays/monitoring")
    custom = validate_strictly(objects)
    assert [o["kind"] for o in custom] == ["PodMonitor"]
    base_names = {(o["kind"], o["metadata"]["name"]) for o in render(".")}
    assert base_names <= {(o["kind"], o["metadata"]["name"]) for o in objects}

    for name, workload in workloads(objects).items():
        item = container(workload)
        ports = {p["name"]: p["containerPort"] for p in item["ports"]}
        assert ports["metrics"] == METRICS_PORT, name
        assert f"--metrics-port={METRICS_PORT}" in item["args"], name
        args, unknown = container_cli(workload, settings(objects), monkeypatch)
        assert (args.command, unknown) == (name, [])
        assert args.metrics_port == METRICS_PORT

    # No schema for the PodMonitor custom resource ships with Kubernetes: its
    # shape, by hand, after the Prometheus Operator's monitoring.coreos.com/v1.
    [monitor] = custom
    assert monitor["metadata"]["namespace"] == "timeshare"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    selected = [
        n
        for n, w in workloads(objects).items()
        if selects(monitor["spec"]["selector"], pod_labels(w))
    ]
    assert selected == ["scheduler", "gateway", "agent"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s"}

    scrape = one(objects, "NetworkPolicy", "metrics-from-monitoring")["spec"]
    assert all(selects(scrape["podSelector"], pod_labels(w)) for w in workloads(objects).values())
    [rule] = scrape["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]


@needs_kubectl
def test_example_jobs_share_one_claim_and_reach_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = load(KUBE / "examples" / "rl-jobs.yaml")
    base = render(".")
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    jobs = [o for o in objects if o["kind"] == "Job"]
    [claim] = [o for o in objects if o["kind"] == "ResourceClaim"]
    assert len(jobs) == 2
    assert {o["metadata"]["namespace"] for o in [claim, *jobs]} == {namespace["metadata"]["name"]}
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "All"

    # The gateway's policy admits this namespace.
    gateway_policy = one(base, "NetworkPolicy", "gateway-from-job-namespaces")["spec"]
    [rule] = gateway_policy["ingress"]
    assert selects(rule["from"][0]["namespaceSelector"], namespace["metadata"]["labels"])

    service = one(base, "Service", "timeshare-gateway")
    gateway_address = (
        f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:"
        f"{service['spec']['ports'][0]['port']}"
    )
    daemon_set = one(base, "DaemonSet", "timeshare-agent")
    agent = container(daemon_set)
    agent_socket = plain_env(agent)["TIMESHARE_AGENT_SOCKET"]
    socket_group = container_cli(daemon_set, settings(base), monkeypatch)[0].socket_group

    seen_jobs, seen_groups = set(), set()
    for job in jobs:
        spec, item = pod_spec(job), container(job)
        [claim_ref] = spec["resourceClaims"]
        assert claim_ref["resourceClaimName"] == claim["metadata"]["name"]
        assert item["resources"]["claims"] == [{"name": claim_ref["name"]}]
        environment = plain_env(item)
        assert environment["TIMESHARE_ADDRESS"] == gateway_address
        assert environment["TIMESHARE_AGENT_SOCKET"] == agent_socket
        nodes = next(e for e in item["env"] if e["name"] == "TIMESHARE_NODES")
        assert nodes["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        mount = next(m for m in item["volumeMounts"] if m["mountPath"] == "/run/timeshare")
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["hostPath"] == {"path": "/run/timeshare", "type": "Directory"}
        # The agent's socket is root:<its group>, mode 0660: the job has that
        # group and not root's.
        groups = spec["securityContext"]["supplementalGroups"]
        assert socket_group in groups and 0 not in groups
        assert spec["securityContext"]["runAsGroup"] != 0
        # The gateway serves TLS and asks for a bearer token.
        ca_volume = volume_of(job, environment["TIMESHARE_TLS_CA"])
        assert ca_volume["configMap"]["name"] == "timeshare-gateway-ca"
        token = next(e for e in item["env"] if e["name"] == "TIMESHARE_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "timeshare-token", "key": "token"}
        args, unknown = container_cli(job, {}, monkeypatch)
        assert (args.command, unknown) == ("synthetic-job", [])
        assert (args.group, args.job) == (
            environment["TIMESHARE_GROUP"],
            environment["TIMESHARE_JOB"],
        )
        seen_jobs.add(args.job)
        seen_groups.add(args.group)
    assert len(seen_jobs) == 2 and len(seen_groups) == 1


@needs_kubectl
def test_the_fleet_overlay_adds_schedulers_and_gateways_to_the_whole_base() -> None:
    objects = render("overlays/fleet-1000")
    base_names = {(o["kind"], o["metadata"]["name"]) for o in render(".")}
    assert base_names <= {(o["kind"], o["metadata"]["name"]) for o in objects}
    for name, replicas in (("timeshare-scheduler", 4), ("timeshare-gateway", 3)):
        deployment = one(objects, "Deployment", name)
        assert deployment["spec"]["replicas"] == replicas
        assert container(deployment)["resources"]["requests"]["cpu"] == "1"
