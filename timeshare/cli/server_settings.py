"""The server processes' flags and how they become settings: the Temporal
connection, telemetry, the gateway's callers and the node agent's backend.

The agent's backend options are declared once, as data, so that `timeshare up`
takes every one of them and passes on those given to the agent it starts.
Worker modules are imported only when a setting is built, so the light client
never imports temporalio."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from timeshare.cli.arguments import (
    AMOUNT,
    FRACTION,
    GPU_COUNT,
    PERIOD,
    PORT,
    RATE,
    SECONDS,
    SIZE,
)
from timeshare.names import check_name

if TYPE_CHECKING:
    from timeshare.activities.backends.base import BackendConfig
    from timeshare.workers.common.telemetry import Telemetry
    from timeshare.workers.common.temporal_settings import TemporalSettings
    from timeshare.workers.gateway.access import GatewaySecurity


def add_temporal_options(parser: argparse.ArgumentParser) -> None:
    # Defaults are None: what is not given comes from Temporal's own
    # environment configuration (workers/common/temporal_settings.py).
    temporal = parser.add_argument_group(
        "Temporal connection (flags > TEMPORAL_* environment > profile in the config file)"
    )
    temporal.add_argument(
        "--temporal", help="frontend HOST:PORT (env TEMPORAL_ADDRESS; default localhost:7233)"
    )
    temporal.add_argument("--namespace", help="namespace (env TEMPORAL_NAMESPACE; default default)")
    temporal.add_argument(
        "--temporal-profile", help="profile of the config file (env TEMPORAL_PROFILE)"
    )
    temporal.add_argument(
        "--config",
        "--temporal-config-file",
        dest="temporal_config_file",
        type=Path,
        help="Temporal's TOML config file (env TEMPORAL_CONFIG_FILE; "
        "default ~/.config/temporalio/temporal.toml)",
    )
    temporal.add_argument(
        "--temporal-tls",
        action="store_const",
        const=True,
        help="TLS with the system's roots (env TEMPORAL_TLS)",
    )
    temporal.add_argument(
        "--temporal-tls-ca", type=Path, help="server CA (env TEMPORAL_TLS_SERVER_CA_CERT_PATH)"
    )
    temporal.add_argument(
        "--temporal-tls-cert", type=Path, help="client cert, mTLS (TEMPORAL_TLS_CLIENT_CERT_PATH)"
    )
    temporal.add_argument(
        "--temporal-tls-key", type=Path, help="client key, mTLS (TEMPORAL_TLS_CLIENT_KEY_PATH)"
    )
    temporal.add_argument(
        "--temporal-tls-server-name", help="server name to verify (TEMPORAL_TLS_SERVER_NAME)"
    )
    temporal.add_argument(
        "--temporal-api-key-file",
        type=Path,
        help="file holding an API key, e.g. Temporal Cloud's (env TEMPORAL_API_KEY)",
    )
    temporal.add_argument(
        "--temporal-wait",
        type=SECONDS,
        metavar="SECONDS",
        help="how long to wait for a Temporal that is starting or restarting before exiting "
        "(env TIMESHARE_TEMPORAL_WAIT; default 300; 0: for ever)",
    )
    temporal.add_argument(
        "--temporal-compression",
        metavar="{none,gzip}",
        help="gRPC compression (env TIMESHARE_TEMPORAL_COMPRESSION; default none; "
        "gzip for a slow link)",
    )


def temporal_settings(args: argparse.Namespace) -> TemporalSettings:
    """Raises SettingsError with one line naming what is wrong."""
    from timeshare.workers.common.temporal_settings import SettingsError, load_temporal_settings

    api_key = None
    if args.temporal_api_key_file is not None:
        try:
            api_key = args.temporal_api_key_file.read_text().strip()
        except OSError as error:
            raise SettingsError(f"--temporal-api-key-file: {error.strerror}") from None
    flags = {
        "address": args.temporal,
        "namespace": args.namespace,
        "profile": args.temporal_profile,
        "config_file": args.temporal_config_file,
        "tls": args.temporal_tls,
        "tls_ca": args.temporal_tls_ca,
        "tls_cert": args.temporal_tls_cert,
        "tls_key": args.temporal_tls_key,
        "tls_server_name": args.temporal_tls_server_name,
        "api_key": api_key,
        "compression": args.temporal_compression,
        "wait_seconds": getattr(args, "temporal_wait", None),
    }
    return load_temporal_settings(flags)


def add_telemetry_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("telemetry (OpenTelemetry; OTEL_* variables apply)")
    exporters = ["otlp", "console", "none"]
    group.add_argument("--traces", choices=exporters, help="env OTEL_TRACES_EXPORTER; default none")
    group.add_argument(
        "--metrics", choices=exporters, help="env OTEL_METRICS_EXPORTER; default none"
    )
    group.add_argument("--metrics-port", type=PORT, help="serve Prometheus /metrics on this port")


def telemetry(args: argparse.Namespace) -> Telemetry:
    """Raises StartupError with one line."""
    from timeshare.workers.common.telemetry import TelemetrySettings, setup_telemetry

    settings = TelemetrySettings.resolve(
        f"timeshare-{args.command}", args.traces, args.metrics, args.metrics_port
    )
    return setup_telemetry(settings)


def gateway_security(args: argparse.Namespace) -> GatewaySecurity:
    """The gateway's transport and caller settings from its flags (pydantic checks them)."""
    from timeshare.workers.gateway.access import GatewaySecurity

    return GatewaySecurity(
        listen=args.listen,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        tokens_file=args.tokens_file,
        insecure=args.insecure,
    )


@dataclass(frozen=True)
class AgentOption:
    """One flag of the node agent's backend, as `add_argument` takes it."""

    flag: str
    group: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return str(self.kwargs.get("dest") or self.flag.removeprefix("--").replace("-", "_"))


def job_state(text: str) -> str:
    """JOB=GIB: one job's own simulated state size, checked and kept as given
    (so that `timeshare up` passes it on as it came)."""
    job, _, size = text.partition("=")
    try:
        check_name("job", job)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    SIZE(size)
    return text


def socket_group(text: str) -> int:
    """NAME or GID of the group that may reach the agent's socket. A number is
    taken as it is: in a container the group need not be in /etc/group."""
    import grp

    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"no group named {text!r} on this host; give a group of /etc/group or a numeric GID"
        ) from None


SOCKET = "registration socket"
PROCESS = "process backends (freeze, cuda, cuda-checkpoint, app)"
SIM = "sim backend (a SIMULATED GPU)"
# Every agent flag that `timeshare up` passes on (all but the node's name, its
# backend, its socket and its Temporal and telemetry settings, which `up` sets).
AGENT_OPTIONS = [
    AgentOption(
        "--socket-group",
        SOCKET,
        {
            "type": socket_group,
            "metavar": "NAME|GID",
            "help": "group that owns the socket (mode 0660): job processes need it, as a "
            "supplementary group; default the agent's own group",
        },
    ),
    AgentOption(
        "--no-evict-exited",
        SOCKET,
        {
            "action": "store_true",
            "default": False,
            "help": "keep a job in its group when all its registered processes here have "
            "exited (default: evicted after a grace, so a killed job frees its turn at once)",
        },
    ),
    AgentOption(
        "--record", PROCESS, {"type": Path, "help": "append what a process backend did (JSONL)"}
    ),
    AgentOption(
        "--cuda-checkpoint",
        PROCESS,
        {"help": "path of the cuda-checkpoint utility (default: on PATH)"},
    ),
    AgentOption(
        "--lock-timeout",
        PROCESS,
        {"type": PERIOD, "default": 10.0, "help": "seconds for a job to stop or lock"},
    ),
    AgentOption(
        "--call-timeout",
        PROCESS,
        {"type": PERIOD, "default": 300.0, "help": "seconds one backend call may take"},
    ),
    AgentOption(
        "--hook-timeout",
        PROCESS,
        {
            "type": PERIOD,
            "default": 120.0,
            "help": "seconds a job's evict or admit hook may take (backend app)",
        },
    ),
    AgentOption(
        "--co-residency-margin-gib",
        PROCESS,
        {
            "type": RATE,
            "default": 2.0,
            "help": "device memory co-residency leaves free on each GPU (NVML figures drift)",
        },
    ),
    AgentOption(
        "--sim-capacity-gib",
        SIM,
        {
            "type": AMOUNT,
            "help": "device memory; unset, the GPU holds one job at a time (no co-residency)",
        },
    ),
    AgentOption(
        "--sim-bandwidth-gbps", SIM, {"type": AMOUNT, "default": 20.0, "help": "GB/s host<->device"}
    ),
    AgentOption(
        "--sim-restore-bandwidth-gbps",
        SIM,
        {"type": AMOUNT, "help": "GB/s host->device for restores (unset: --sim-bandwidth-gbps)"},
    ),
    AgentOption(
        "--sim-state-gib",
        SIM,
        {
            "type": SIZE,
            "default": 2.0,
            "help": "device state per job (0: switches that move no bytes, orchestration only)",
        },
    ),
    AgentOption(
        "--sim-job-state",
        SIM,
        {
            "type": job_state,
            "action": "append",
            "default": [],
            "metavar": "JOB=GIB",
            "help": "device state of one job (by name) if not --sim-state-gib; repeat for more",
        },
    ),
    AgentOption(
        "--sim-discard-fraction",
        SIM,
        {
            "type": FRACTION,
            "default": 0.5,
            "help": "share of a job's state an eviction in discard mode drops (its KV cache, say)",
        },
    ),
    AgentOption(
        "--sim-rebuild-gbps",
        SIM,
        {
            "type": RATE,
            "default": 0.0,
            "help": "GB/s at which a job rebuilds what a discard dropped (0: at once)",
        },
    ),
    AgentOption(
        "--sim-gpus",
        SIM,
        {
            "type": GPU_COUNT,
            "default": 1,
            "help": "simulated GPUs, shared by the groups of the node (each uses its policy's)",
        },
    ),
    AgentOption(
        "--sim-host-gib",
        SIM,
        {
            "type": AMOUNT,
            "help": "simulated host memory for parked state of all groups (unset: unlimited)",
        },
    ),
    AgentOption(
        "--sim-record", SIM, {"type": Path, "help": "append the residency record here (JSONL)"}
    ),
    AgentOption(
        "--sim-state",
        SIM,
        {"type": Path, "help": "keep what the simulated GPU holds here, across restarts"},
    ),
]


def add_agent_options(parser: argparse.ArgumentParser) -> None:
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in AGENT_OPTIONS:
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(option.group)
        groups[option.group].add_argument(option.flag, **option.kwargs)


def agent_arguments(args: argparse.Namespace) -> list[str]:
    """The agent flags given to `timeshare up`, to pass on to its agent."""
    passed = []
    for option in AGENT_OPTIONS:
        value = getattr(args, option.dest)
        if value is None or value == option.kwargs.get("default"):
            continue
        if isinstance(value, list):
            passed += [f"{option.flag}={each}" for each in value]
            continue
        passed.append(option.flag if value is True else f"{option.flag}={value}")
    return passed


def backend_config(args: argparse.Namespace) -> BackendConfig:
    from timeshare.activities.backends.base import BackendConfig

    capacity = args.sim_capacity_gib
    return BackendConfig(
        node=args.node,
        sim_capacity_bytes=int(capacity * 2**30) if capacity is not None else None,
        sim_bandwidth_bytes_per_second=args.sim_bandwidth_gbps * 1e9,
        sim_restore_bandwidth_bytes_per_second=(
            args.sim_restore_bandwidth_gbps * 1e9 if args.sim_restore_bandwidth_gbps else None
        ),
        sim_state_bytes=int(args.sim_state_gib * 2**30),
        sim_job_state_bytes={
            job: int(float(gib) * 2**30)
            for job, _, gib in (text.partition("=") for text in args.sim_job_state)
        },
        sim_gpus=int(args.sim_gpus),
        sim_host_memory_bytes=int(args.sim_host_gib * 2**30) if args.sim_host_gib else None,
        sim_record_path=str(args.sim_record) if args.sim_record else None,
        sim_state_path=str(args.sim_state) if args.sim_state else None,
        record_path=str(args.record) if args.record else None,
        cuda_checkpoint_path=args.cuda_checkpoint,
        lock_timeout_seconds=args.lock_timeout,
        call_timeout_seconds=args.call_timeout,
        sim_discard_fraction=args.sim_discard_fraction,
        sim_rebuild_bytes_per_second=args.sim_rebuild_gbps * 1e9,
        hook_timeout_seconds=args.hook_timeout,
        co_residency_margin_bytes=int(args.co_residency_margin_gib * 2**30),
    )
