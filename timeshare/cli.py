"""The `timeshare` command. Server-side subcommands import their workers only
when run, so the client library never pulls in temporalio."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from timeshare.activities.backend import BackendConfig
    from timeshare.workers.gateway_access import GatewaySecurity
    from timeshare.workers.telemetry import Telemetry
    from timeshare.workers.temporal_settings import TemporalSettings

DEFAULT_TEMPORAL = "localhost:7233"
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_AGENT_SOCKET = "/run/timeshare/agent.sock"


def default_node_name() -> str:
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", socket.gethostname().lower()).strip("-._")
    return os.environ.get("TIMESHARE_NODE") or (cleaned[:63].rstrip("-._") or "node-0")


def _temporal_options(parser: argparse.ArgumentParser) -> None:
    # Defaults are None so that the environment and the config file can apply;
    # workers/temporal_settings.py merges the three.
    temporal = parser.add_argument_group("Temporal connection (flags > env > --config file)")
    temporal.add_argument(
        "--temporal",
        help=f"frontend HOST:PORT (env TIMESHARE_TEMPORAL; default {DEFAULT_TEMPORAL})",
    )
    temporal.add_argument(
        "--namespace", help="namespace (env TIMESHARE_NAMESPACE; default default)"
    )
    temporal.add_argument(
        "--config", type=Path, help="TOML file with a [temporal] table (env TIMESHARE_CONFIG)"
    )
    temporal.add_argument(
        "--temporal-tls", action="store_const", const=True, help="TLS with the system's roots"
    )
    temporal.add_argument("--temporal-tls-ca", type=Path, help="CA certificate (PEM) of the server")
    temporal.add_argument("--temporal-tls-cert", type=Path, help="client certificate (mTLS)")
    temporal.add_argument("--temporal-tls-key", type=Path, help="client key (mTLS)")
    temporal.add_argument("--temporal-tls-server-name", help="server name to verify")
    temporal.add_argument(
        "--temporal-api-key-file",
        type=Path,
        help="file holding an API key, e.g. Temporal Cloud's (env TIMESHARE_TEMPORAL_API_KEY)",
    )


def _telemetry_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("telemetry (OpenTelemetry; OTEL_* variables apply)")
    exporters = ["otlp", "console", "none"]
    group.add_argument("--traces", choices=exporters, help="env OTEL_TRACES_EXPORTER; default none")
    group.add_argument(
        "--metrics", choices=exporters, help="env OTEL_METRICS_EXPORTER; default none"
    )
    group.add_argument("--metrics-port", type=PORT, help="serve Prometheus /metrics on this port")


def telemetry(args: argparse.Namespace) -> Telemetry:
    """Raises StartupError with one line."""
    from timeshare.workers.telemetry import TelemetrySettings, setup_telemetry

    settings = TelemetrySettings.resolve(
        f"timeshare-{args.command}", args.traces, args.metrics, args.metrics_port
    )
    return setup_telemetry(settings)


def gateway_security(args: argparse.Namespace) -> GatewaySecurity:
    """The gateway's transport and caller settings from its flags (pydantic checks them)."""
    from timeshare.workers.gateway_access import GatewaySecurity

    return GatewaySecurity(
        listen=args.listen,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        tokens_file=args.tokens_file,
        insecure=args.insecure,
    )


def temporal_settings(args: argparse.Namespace) -> TemporalSettings:
    """Raises SettingsError with one line naming each bad field."""
    from timeshare.workers.temporal_settings import SettingsError, load_temporal_settings

    api_key = None
    if args.temporal_api_key_file is not None:
        try:
            api_key = args.temporal_api_key_file.read_text().strip()
        except OSError as error:
            raise SettingsError(f"--temporal-api-key-file: {error.strerror}") from None
    flags = {
        "address": args.temporal,
        "namespace": args.namespace,
        "tls": args.temporal_tls,
        "tls_ca": args.temporal_tls_ca,
        "tls_cert": args.temporal_tls_cert,
        "tls_key": args.temporal_tls_key,
        "tls_server_name": args.temporal_tls_server_name,
        "api_key": api_key,
    }
    return load_temporal_settings(flags, config_file=args.config)


def _process_options(parser: argparse.ArgumentParser) -> None:
    backends = parser.add_argument_group("process backends (freeze, cuda-checkpoint)")
    backends.add_argument(
        "--cuda-checkpoint", help="path of the cuda-checkpoint utility (default: on PATH)"
    )
    backends.add_argument(
        "--lock-timeout", type=PERIOD, default=10.0, help="seconds for a job to stop or lock"
    )
    backends.add_argument(
        "--call-timeout", type=PERIOD, default=300.0, help="seconds one backend call may take"
    )
    backends.add_argument(
        "--hook-timeout", type=PERIOD, default=120.0,
        help="seconds a job's evict or admit hook may take (backend app)",
    )  # fmt: skip
    backends.add_argument(
        "--co-residency-margin-gib", type=RATE, default=2.0,
        help="device memory co-residency leaves free on each GPU (NVML figures drift)",
    )  # fmt: skip


def _sim_options(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("sim backend (a SIMULATED GPU)")
    sim.add_argument(
        "--sim-capacity-gib", type=AMOUNT,
        help="device memory; unset, the GPU holds one job at a time (no co-residency)",
    )  # fmt: skip
    sim.add_argument("--sim-bandwidth-gbps", type=AMOUNT, default=20.0, help="GB/s host<->device")
    sim.add_argument(
        "--sim-state-gib", type=SIZE, default=2.0,
        help="device state per job (0: switches that move no bytes, orchestration only)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-discard-fraction", type=FRACTION, default=0.5,
        help="share of a job's state an eviction in discard mode drops (its KV cache, say)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-rebuild-gbps", type=RATE, default=0.0,
        help="GB/s at which a job rebuilds what a discard dropped (0: at once)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-gpus", type=GPU_COUNT, default=1,
        help="simulated GPUs, shared by the node's groups (each uses those its policy names)",
    )  # fmt: skip
    sim.add_argument(
        "--sim-host-gib", type=AMOUNT,
        help="simulated host memory for parked state, shared by all groups (unset: unlimited)",
    )  # fmt: skip
    sim.add_argument("--sim-record", type=Path, help="append the residency record here (JSONL)")
    sim.add_argument(
        "--sim-state", type=Path, help="keep what the simulated GPU holds here, across restarts"
    )


def _number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high], else one clear error."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low <= value <= high):  # also refuses NaN
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}")
        return value

    parse.__name__ = kind.__name__
    return parse


PORT = _number(int, 1, 65535)
COUNT = _number(int, 1, 10**9)
PID = _number(int, 2, 2**22)
SECONDS = _number(float, 0.0, 7 * 86400.0)
PERIOD = _number(float, 0.001, 7 * 86400.0)
AMOUNT = _number(float, 1e-6, 1e6)
RATE = _number(float, 0.0, 1e6)
SIZE = _number(float, 0.0, 1e6)
FRACTION = _number(float, 0.0, 1.0)
GPU_COUNT = _number(int, 1, 256)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="timeshare", description="Cooperative GPU time-slicing for RL jobs, on Temporal."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    temporal = commands.add_parser("temporal", help="run the embedded Temporal dev server")
    temporal.add_argument("--port", type=PORT, default=7233)
    temporal.add_argument("--ui-port", type=PORT, default=8233)
    temporal.add_argument("--data-dir", type=Path, default=Path(".timeshare"))

    scheduler = commands.add_parser("scheduler", help="run the scheduler worker")
    _temporal_options(scheduler)
    _telemetry_options(scheduler)

    gateway = commands.add_parser("gateway", help="run the gRPC gateway")
    _temporal_options(gateway)
    _telemetry_options(gateway)
    gateway.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT (default %(default)s)")
    callers = gateway.add_argument_group(
        "who may call (required when --listen is not a loopback address)"
    )
    callers.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    callers.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    callers.add_argument("--tls-client-ca", type=Path, help="require client certificates (mTLS)")
    callers.add_argument(
        "--tokens-file", type=Path, help="TOML file of bearer tokens, each scoped to groups"
    )
    callers.add_argument(
        "--insecure", action="store_true", help="plain text, no caller checks: for tests only"
    )
    gateway.add_argument(
        "--max-groups", type=COUNT, default=1000, help="groups per deployment (default %(default)s)"
    )
    compat = gateway.add_argument_group(
        "llm-d compatibility (its clients send no job token: off by default)"
    )
    compat.add_argument(
        "--llmd-compat",
        action="store_true",
        help="also serve timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService",
    )
    compat.add_argument("--llmd-compat-groups", help="comma-separated groups (default: all)")
    compat.add_argument(
        "--llmd-compat-allow",
        action="append",
        metavar="CIDR",
        help="networks allowed to call it (repeatable; default loopback only)",
    )
    compat.add_argument(
        "--llmd-compat-lease-seconds",
        type=float,
        default=3600.0,
        help="lease of groups it creates: longer than any GPU phase (default %(default)s)",
    )

    agent = commands.add_parser("agent", help="run the node agent of this host")
    _temporal_options(agent)
    _telemetry_options(agent)
    agent.add_argument("--node", default=default_node_name(), help="node name (env TIMESHARE_NODE)")
    agent.add_argument("--backend", default="sim", help="snapshot backend (default %(default)s)")
    agent.add_argument(
        "--socket",
        default=os.environ.get("TIMESHARE_AGENT_SOCKET", DEFAULT_AGENT_SOCKET),
        help="Unix socket where job processes register (env TIMESHARE_AGENT_SOCKET)",
    )
    agent.add_argument("--record", type=Path, help="append what a process backend did (JSONL)")
    agent.add_argument("--probe", action="store_true", help="print this host's GPUs and exit")
    _process_options(agent)
    _sim_options(agent)

    up = commands.add_parser("up", help="run the whole stack on this machine")
    up.add_argument("--data-dir", type=Path, default=Path(".timeshare"))
    up.add_argument("--port", type=PORT, default=7233, help="Temporal gRPC port")
    up.add_argument("--ui-port", type=PORT, default=8233, help="Temporal Web UI port")
    up.add_argument("--listen", default=DEFAULT_LISTEN, help="gateway HOST:PORT")
    up.add_argument("--node", default=default_node_name(), help="this host's node name")
    up.add_argument("--backend", default="sim")
    up.add_argument("--socket", help="agent registration socket (default DATA_DIR/agent.sock)")
    up.add_argument("--record", type=Path, help="append what a process backend did (JSONL)")
    _sim_options(up)

    status = commands.add_parser("status", help="show groups, holders, queues and nodes")
    status.add_argument("group", nargs="?")
    status.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")

    for name, help_text in (
        ("pause", "grant no new turns in a group (the holder keeps its turn)"),
        ("resume", "let a paused group grant turns again"),
    ):
        control = commands.add_parser(name, help=help_text)
        control.add_argument("group")
        control.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")
    evict = commands.add_parser("evict", help="take a job out of its group")
    evict.add_argument("group")
    evict.add_argument("job")
    evict.add_argument("--reason", default="", help="told to the job on its next call")
    evict.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")
    for name, help_text in (
        ("drain", "grant no new turns that need NODE; running turns finish"),
        ("undrain", "put a drained node back in service"),
    ):
        control = commands.add_parser(name, help=help_text)
        control.add_argument("node")
        control.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")

    report = commands.add_parser("report", help="draw a group's recent history as a timeline")
    report.add_argument("group")
    report.add_argument("--out", type=Path, required=True, help="FILE.html or FILE.png")
    report.add_argument("--from-json", type=Path, help="draw a saved GroupHistory JSON instead")
    report.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")

    demo = commands.add_parser("demo", help="run two synthetic RL jobs through the stack")
    demo.add_argument("--iterations", type=COUNT, default=6)
    demo.add_argument("--data-dir", type=Path, default=Path(".timeshare"))

    register = commands.add_parser(
        "register", help="register a process of a job with this node's agent (root or owner)"
    )
    register.add_argument("--group", required=True)
    register.add_argument("--job", required=True)
    register.add_argument("--pid", type=PID, required=True)
    register.add_argument("--socket", help="agent socket (env TIMESHARE_AGENT_SOCKET)")

    job = commands.add_parser("synthetic-job", help="run one synthetic RL job (demo, tests)")
    job.add_argument("--group", required=True)
    job.add_argument("--job", required=True)
    job.add_argument("--address")
    job.add_argument("--nodes", help="comma-separated node names")
    job.add_argument("--iterations", type=COUNT, default=5)
    job.add_argument("--sample-seconds", type=SECONDS, default=0.8)
    job.add_argument("--reward-seconds", type=SECONDS, default=1.8)
    job.add_argument("--train-seconds", type=SECONDS, default=0.6)
    job.add_argument("--start-delay-seconds", type=SECONDS, default=0.0)
    job.add_argument("--report", type=Path, help="write the job's record here (JSON)")
    job.add_argument("--lease-seconds", type=PERIOD, help="group policy, if this job makes it")
    job.add_argument("--agent-timeout-seconds", type=PERIOD, help="group policy, likewise")
    job.add_argument("--co-residency", choices=["auto", "off"], help="group policy, likewise")
    job.add_argument(
        "--hooks", choices=["offload", "discard"],
        help="serve workload hooks to the agent, asking to be evicted this way",
    )  # fmt: skip
    job.add_argument("--agent-socket", help="the agent's socket, for --hooks")
    return parser


def main(argv: list[str] | None = None) -> NoReturn:
    if os.environ.get("TIMESHARE_DIE_WITH_PARENT"):
        from timeshare.workers.children import die_with_parent_if_asked

        die_with_parent_if_asked()
    args = build_parser().parse_args(argv)
    missing = missing_server_parts(args.command)
    if missing:
        print(
            f"timeshare: `timeshare {args.command}` needs the server parts ({missing} is not"
            " installed): pip install 'timeshare[server]'",
            file=sys.stderr,
        )
        sys.exit(2)
    handler = COMMANDS[args.command]
    sys.exit(handler(args))


# The light client (`pip install timeshare`) lacks these; a server command run there
# names the extra instead of failing with a traceback from deep inside a worker.
SERVER_COMMANDS = frozenset({"temporal", "scheduler", "gateway", "agent", "up", "demo"})
SERVER_MODULES = ("temporalio", "grpc_health", "opentelemetry.sdk")


def missing_server_parts(command: str) -> str | None:
    if command not in SERVER_COMMANDS:
        return None
    for module in SERVER_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a missing parent package
            found = False
        if not found:
            return module
    return None


def _fail(message: str) -> int:
    print(f"timeshare: {message}", file=sys.stderr)
    return 1


def _cmd_temporal(args: argparse.Namespace) -> int:
    from timeshare.workers.service import run_service
    from timeshare.workers.temporal_server import serve_temporal

    run_service(
        "temporal", lambda stop: serve_temporal(stop, args.port, args.ui_port, args.data_dir)
    )


def _cmd_scheduler(args: argparse.Namespace) -> int:
    from timeshare.workers.scheduler import serve_scheduler
    from timeshare.workers.service import StartupError, run_service
    from timeshare.workers.temporal_settings import SettingsError

    try:
        temporal = temporal_settings(args)
        traced = telemetry(args)
    except (SettingsError, StartupError) as error:
        return _fail(f"scheduler: {error}")
    run_service("scheduler", lambda stop: serve_scheduler(stop, temporal, traced))


def _cmd_gateway(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from timeshare.workers.gateway import GatewayOptions, serve_gateway
    from timeshare.workers.gateway_access import first_problem
    from timeshare.workers.llmd_compat import compat_settings
    from timeshare.workers.service import StartupError, run_service
    from timeshare.workers.temporal_settings import SettingsError

    try:
        compat = None
        if args.llmd_compat:
            compat = compat_settings(
                args.llmd_compat_groups, args.llmd_compat_allow, args.llmd_compat_lease_seconds
            )
        options = GatewayOptions(
            temporal=temporal_settings(args),
            security=gateway_security(args),
            llmd_compat=compat,
            max_groups=args.max_groups,
        )
        traced = telemetry(args)
    except ValidationError as error:
        return _fail(f"gateway: {first_problem(error).removeprefix('Value error, ')}")
    except (SettingsError, StartupError, ValueError) as error:
        return _fail(f"gateway: {error}")
    run_service("gateway", lambda stop: serve_gateway(stop, options, traced))


def backend_config(args: argparse.Namespace) -> BackendConfig:
    from timeshare.activities.backend import BackendConfig

    capacity = args.sim_capacity_gib
    return BackendConfig(
        node=args.node,
        sim_capacity_bytes=int(capacity * 2**30) if capacity is not None else None,
        sim_bandwidth_bytes_per_second=args.sim_bandwidth_gbps * 1e9,
        sim_state_bytes=int(args.sim_state_gib * 2**30),
        sim_gpus=int(args.sim_gpus),
        sim_host_memory_bytes=int(args.sim_host_gib * 2**30) if args.sim_host_gib else None,
        sim_record_path=str(args.sim_record) if args.sim_record else None,
        sim_state_path=str(args.sim_state) if args.sim_state else None,
        record_path=str(args.record) if args.record else None,
        cuda_checkpoint_path=getattr(args, "cuda_checkpoint", None),
        lock_timeout_seconds=getattr(args, "lock_timeout", 10.0),
        call_timeout_seconds=getattr(args, "call_timeout", 300.0),
        sim_discard_fraction=args.sim_discard_fraction,
        sim_rebuild_bytes_per_second=args.sim_rebuild_gbps * 1e9,
        hook_timeout_seconds=getattr(args, "hook_timeout", 120.0),
        co_residency_margin_bytes=int(getattr(args, "co_residency_margin_gib", 2.0) * 2**30),
    )


def _probe() -> int:
    from timeshare.activities.gpus import NoGpus, gpu_inventory

    try:
        gpus = gpu_inventory()
    except NoGpus as error:
        return _fail(f"agent --probe: {error}; the cuda backends cannot run here")
    for gpu in gpus:
        print(gpu.describe())
    return 0 if gpus else _fail("agent --probe: NVML found no GPUs")


def _cmd_agent(args: argparse.Namespace) -> int:
    if args.probe:
        return _probe()
    from timeshare.names import check_name
    from timeshare.workers.agent import serve_agent
    from timeshare.workers.service import StartupError, run_service
    from timeshare.workers.temporal_settings import SettingsError

    try:
        check_name("node", args.node)
    except ValueError as error:
        return _fail(f"--node: {error}")
    try:
        temporal = temporal_settings(args)
        traced = telemetry(args)
    except (SettingsError, StartupError) as error:
        return _fail(f"agent: {error}")
    config = backend_config(args)
    run_service(
        "agent",
        lambda stop: serve_agent(stop, temporal, args.backend, config, args.socket, traced),
    )


def _cmd_up(args: argparse.Namespace) -> int:
    from timeshare.workers.service import run_service
    from timeshare.workers.up import StackOptions, serve_stack

    options = StackOptions(
        data_dir=args.data_dir,
        port=args.port,
        ui_port=args.ui_port,
        listen=args.listen,
        node=args.node,
        backend=args.backend,
        agent_args=[
            *([f"--sim-capacity-gib={args.sim_capacity_gib}"] if args.sim_capacity_gib else []),
            f"--sim-bandwidth-gbps={args.sim_bandwidth_gbps}",
            f"--sim-state-gib={args.sim_state_gib}",
            f"--sim-discard-fraction={args.sim_discard_fraction}",
            f"--sim-rebuild-gbps={args.sim_rebuild_gbps}",
            f"--sim-gpus={args.sim_gpus}",
            *([f"--sim-host-gib={args.sim_host_gib}"] if args.sim_host_gib else []),
            *([f"--sim-record={args.sim_record}"] if args.sim_record else []),
            f"--sim-state={args.sim_state or args.data_dir / f'sim-state-{args.node}.json'}",
            f"--socket={args.socket or args.data_dir / 'agent.sock'}",
            *([f"--record={args.record}"] if args.record else []),
        ],
    )
    run_service("up", lambda stop: serve_stack(stop, options))


def _cmd_status(args: argparse.Namespace) -> int:
    from timeshare.status import print_status

    return print_status(args.address, args.group)


def _cmd_control(args: argparse.Namespace) -> int:
    from timeshare.status import run_control

    return run_control(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from timeshare.report_cli import cmd_report

    return cmd_report(args)


def _cmd_register(args: argparse.Namespace) -> int:
    from timeshare.errors import TimeshareError
    from timeshare.registration import register_process

    try:
        pid = register_process(args.group, args.job, args.socket, pid=args.pid)
    except TimeshareError as error:
        return _fail(f"register: {error}")
    print(f"process {pid} registered to {args.group}/{args.job}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from timeshare.workers.demo import run_demo

    return run_demo(args.iterations, args.data_dir)


def _cmd_synthetic_job(args: argparse.Namespace) -> int:
    from timeshare.errors import TimeshareError
    from timeshare.models import GroupPolicy
    from timeshare.synthetic import SyntheticJobSpec, run_synthetic_job

    spec = SyntheticJobSpec(
        group=args.group,
        job=args.job,
        address=args.address,
        nodes=args.nodes.split(",") if args.nodes else None,
        iterations=args.iterations,
        sample_seconds=args.sample_seconds,
        reward_seconds=args.reward_seconds,
        train_seconds=args.train_seconds,
        start_delay_seconds=args.start_delay_seconds,
        policy=GroupPolicy(
            lease_seconds=args.lease_seconds or 30.0,
            agent_timeout_seconds=args.agent_timeout_seconds or 30.0,
            co_residency=args.co_residency or "auto",
        ),
        hooks=args.hooks,
        agent_socket=args.agent_socket,
    )
    # SIGTERM unwinds like Ctrl-C, so the job leaves its group on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        run_synthetic_job(spec, args.report)
    except TimeshareError as error:
        return _fail(f"job {args.job}: {error}")
    except KeyboardInterrupt:
        return 130
    return 0


COMMANDS = {
    "temporal": _cmd_temporal,
    "scheduler": _cmd_scheduler,
    "gateway": _cmd_gateway,
    "agent": _cmd_agent,
    "up": _cmd_up,
    "status": _cmd_status,
    "pause": _cmd_control,
    "resume": _cmd_control,
    "evict": _cmd_control,
    "drain": _cmd_control,
    "undrain": _cmd_control,
    "report": _cmd_report,
    "demo": _cmd_demo,
    "synthetic-job": _cmd_synthetic_job,
    "register": _cmd_register,
}
