"""The subcommands that run the stack's processes: temporal, scheduler,
gateway, agent, up and demo. They need `timeshare[server]`; their workers are
imported only when they run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from timeshare.agent_socket import AGENT_SOCKET_ENV, local_agent_socket
from timeshare.cli.arguments import (
    COUNT,
    DEFAULT_LISTEN,
    PORT,
    default_agent_socket,
    default_node_name,
    fail,
)
from timeshare.cli.backend_names import backend_help, backend_name, chosen_backend
from timeshare.cli.exit_codes import ExitCode
from timeshare.cli.server_settings import (
    add_agent_options,
    add_telemetry_options,
    add_temporal_options,
    agent_arguments,
    backend_config,
    gateway_security,
    telemetry,
    temporal_settings,
)
from timeshare.workers.common.event_loop import (
    EVENT_LOOPS,
    UVLOOP,
    default_event_loop,
    uvloop_installed,
)

Subparsers = Any  # argparse's _SubParsersAction, private in typeshed


def add_server_commands(commands: Subparsers) -> None:
    temporal = commands.add_parser("temporal", help="run the embedded Temporal dev server")
    temporal.add_argument("--port", type=PORT, default=7233, help="Temporal's gRPC port")
    temporal.add_argument("--ui-port", type=PORT, default=8233, help="the Temporal Web UI's port")
    temporal.add_argument(
        "--data-dir", type=Path, default=Path(".timeshare"), help="where its SQLite file lives"
    )
    temporal.add_argument(
        "--metrics-port", type=PORT, help="serve Temporal's own Prometheus metrics on this port"
    )
    temporal.add_argument(
        "--dynamic-config", type=dynamic_setting, action="append", default=[],
        metavar="KEY=VALUE",
        help="a Temporal dynamic-config setting, over timeshare's own (repeatable)",
    )  # fmt: skip
    temporal.set_defaults(handler=run_temporal, server=True)

    scheduler = commands.add_parser("scheduler", help="run the scheduler worker")
    add_temporal_options(scheduler)
    add_telemetry_options(scheduler)
    scheduler.add_argument(
        "--workflow-sandbox",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("TIMESHARE_WORKFLOW_SANDBOX", "0") == "1",
        help="run the group workflows in the Temporal SDK's sandbox: about a third more "
        "scheduler CPU per hand-over (env TIMESHARE_WORKFLOW_SANDBOX=1; default off)",
    )
    scheduler.add_argument(
        "--deadlock-detection",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("TIMESHARE_DEADLOCK_DETECTION", "0") == "1",
        help="run each workflow activation on a thread, failing one that runs past 2 s "
        "(the SDK's deadlock detection): about a tenth more scheduler CPU per hand-over "
        "(env TIMESHARE_DEADLOCK_DETECTION=1; default off; on in the sandbox)",
    )
    scheduler.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        # Resolved when the scheduler starts, not while every CLI command builds its parser.
        default=os.environ.get("TIMESHARE_EVENT_LOOP", ""),
        help="the process's asyncio event loop: uvloop spends less scheduler CPU per hand-over "
        "(docs/operations.md; env TIMESHARE_EVENT_LOOP; default uvloop where installed, as the "
        "server extra does on Linux and macOS)",
    )
    scheduler.set_defaults(handler=run_scheduler, server=True)

    gateway = commands.add_parser("gateway", help="run the gRPC gateway")
    add_temporal_options(gateway)
    add_telemetry_options(gateway)
    _gateway_options(gateway)
    gateway.set_defaults(handler=run_gateway, server=True)

    agent = commands.add_parser("agent", help="run the node agent of this host")
    add_temporal_options(agent)
    add_telemetry_options(agent)
    agent.add_argument("--node", default=default_node_name(), help="node name (env TIMESHARE_NODE)")
    agent.add_argument("--backend", type=backend_name, metavar="BACKEND", help=backend_help())
    agent.add_argument(
        "--socket",
        default=default_agent_socket(),
        help="Unix socket where job processes register (env TIMESHARE_AGENT_SOCKET)",
    )
    agent.add_argument("--probe", action="store_true", help="print this host's GPUs and exit")
    add_agent_options(agent)
    agent.set_defaults(handler=run_agent, server=True)

    up = commands.add_parser(
        "up",
        help="run the whole stack on this machine",
        description="Temporal, the scheduler, the gateway and a node agent, each a process "
        "of its own; one Ctrl-C stops them all. Once ready it prints what a job needs "
        "(TIMESHARE_ADDRESS, TIMESHARE_AGENT_SOCKET), which are also where a job on this "
        "machine looks by default.",
    )
    up.add_argument(
        "--data-dir", type=Path, default=Path(".timeshare"),
        help="Temporal's SQLite file and the stack's logs",
    )  # fmt: skip
    up.add_argument("--port", type=PORT, default=7233, help="Temporal gRPC port")
    up.add_argument("--ui-port", type=PORT, default=8233, help="Temporal Web UI port")
    up.add_argument("--listen", default=DEFAULT_LISTEN, help="gateway HOST:PORT")
    up.add_argument("--node", default=default_node_name(), help="this host's node name")
    up.add_argument("--backend", type=backend_name, metavar="BACKEND", help=backend_help())
    up.add_argument(
        "--socket",
        help="the agent's registration socket (default: TIMESHARE_AGENT_SOCKET, else "
        f"{local_agent_socket()}, where a job on this machine looks)",
    )
    add_agent_options(up)
    up.set_defaults(handler=run_up, server=True)

    demo = commands.add_parser(
        "demo",
        help="run two synthetic RL jobs through the stack",
        description="Two synthetic RL jobs take turns on one SIMULATED GPU: starts the stack "
        "(or uses one that answers on localhost:50051), runs the jobs, prints who held the "
        "GPU when and the busy fraction with and without sharing, writes an HTML timeline, "
        "and stops what it started.",
    )
    demo.add_argument("--iterations", type=COUNT, default=6, help="RL iterations per job")
    demo.add_argument(
        "--data-dir", type=Path, default=Path(".timeshare"),
        help="the stack's data, and the report demo-report.html",
    )  # fmt: skip
    demo.set_defaults(handler=run_demo, server=True)


def _gateway_options(gateway: argparse.ArgumentParser) -> None:
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
        "--insecure", action="store_true",
        help="plain text beyond loopback, no caller checks: for tests, or llm-d clients on a "
        "network you trust (docs/migrating-from-llm-d.md)",
    )  # fmt: skip
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
    compat.add_argument(
        "--llmd-gpus",
        action="extend",
        nargs="+",
        metavar="PATTERN=NODE:GPU[,GPU...]",
        help="place the llm-d groups whose id matches PATTERN (fnmatch) on those GPUs of NODE "
        "(repeatable; first match wins; default: every GPU of the group's node)",
    )


def dynamic_setting(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE (history.transferProcessorMaxPollRPS=1000, say)"
        )
    return key.strip(), value.strip()


def run_temporal(args: argparse.Namespace) -> int:
    from timeshare.workers.common.service import run_service
    from timeshare.workers.temporal.dev_server import serve_temporal

    run_service(
        "temporal",
        lambda stop: serve_temporal(
            stop,
            args.port,
            args.ui_port,
            args.data_dir,
            args.metrics_port,
            dict(args.dynamic_config),
        ),
    )


def run_scheduler(args: argparse.Namespace) -> int:
    from timeshare.workers.common.service import StartupError, run_service
    from timeshare.workers.common.temporal_settings import SettingsError
    from timeshare.workers.scheduler.serve import serve_scheduler

    try:
        temporal = temporal_settings(args)
        traced = telemetry(args)
    except (SettingsError, StartupError) as error:
        return fail(f"scheduler: {error}")
    event_loop = args.event_loop or default_event_loop()
    if event_loop not in EVENT_LOOPS:
        return fail(f"scheduler: unknown event loop {event_loop!r} (TIMESHARE_EVENT_LOOP); "
                    f"choose one of {', '.join(EVENT_LOOPS)}")  # fmt: skip
    if event_loop == UVLOOP and not uvloop_installed():
        return fail("scheduler: --event-loop uvloop needs the uvloop package: "
                    "pip install 'timeshare[server]', or pass --event-loop asyncio")  # fmt: skip
    sandboxed, detect = bool(args.workflow_sandbox), bool(args.deadlock_detection)
    run_service(
        "scheduler",
        lambda stop: serve_scheduler(stop, temporal, traced, sandboxed, detect),
        event_loop,
    )


def run_gateway(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from timeshare.workers.common.service import StartupError, run_service
    from timeshare.workers.common.temporal_settings import SettingsError
    from timeshare.workers.gateway.access import first_problem
    from timeshare.workers.gateway.llmd_compat import compat_settings
    from timeshare.workers.gateway.serve import GatewayOptions, serve_gateway

    try:
        compat = None
        if args.llmd_gpus and not args.llmd_compat:
            return fail("gateway: --llmd-gpus places llm-d groups: it needs --llmd-compat")
        if args.llmd_compat:
            compat = compat_settings(
                args.llmd_compat_groups,
                args.llmd_compat_allow,
                args.llmd_compat_lease_seconds,
                args.llmd_gpus,
            )
        options = GatewayOptions(
            temporal=temporal_settings(args),
            security=gateway_security(args),
            llmd_compat=compat,
            max_groups=args.max_groups,
        )
        traced = telemetry(args)
    except ValidationError as error:
        return fail(f"gateway: {first_problem(error).removeprefix('Value error, ')}")
    except (SettingsError, StartupError, ValueError) as error:
        return fail(f"gateway: {error}")
    run_service("gateway", lambda stop: serve_gateway(stop, options, traced))


def _probe() -> int:
    from timeshare.activities.backends.gpus import NoGpus, gpu_inventory

    try:
        gpus = gpu_inventory()
    except NoGpus as error:
        return fail(f"agent --probe: {error}; the cuda backends cannot run here")
    for gpu in gpus:
        print(gpu.describe())
    return 0 if gpus else fail("agent --probe: NVML found no GPUs")


def run_agent(args: argparse.Namespace) -> int:
    if args.probe:
        return _probe()
    args.backend = chosen_backend(args.backend, "agent")
    from timeshare.names import check_name
    from timeshare.workers.agent.serve import serve_agent
    from timeshare.workers.common.service import StartupError, run_service
    from timeshare.workers.common.temporal_settings import SettingsError

    try:
        check_name("node", args.node)
    except ValueError as error:
        return fail(f"--node: {error}")
    try:
        temporal = temporal_settings(args)
        traced = telemetry(args)
    except (SettingsError, StartupError) as error:
        return fail(f"agent: {error}")
    config = backend_config(args)
    run_service(
        "agent",
        lambda stop: serve_agent(
            stop,
            temporal,
            args.backend,
            config,
            args.socket,
            traced,
            args.socket_group,
            evict_exited=not args.no_evict_exited,
        ),
    )


def run_up(args: argparse.Namespace) -> int:
    """Every argument is checked here, before the first process starts."""
    from timeshare.activities.backends.sim_memory import sim_state_path
    from timeshare.names import check_name
    from timeshare.workers.common.service import StartupError, run_service
    from timeshare.workers.stack.up import StackOptions, listen_port, serve_stack
    from timeshare.workers.stack.up_checks import check_agent_socket_free

    try:
        check_name("node", args.node)
        listen_port(args.listen)
        socket_path = args.socket or local_agent_socket()
        chosen = args.socket is not None or bool(os.environ.get(AGENT_SOCKET_ENV))
        check_agent_socket_free(socket_path, given=chosen)
    except (ValueError, StartupError) as error:
        return fail(f"up: {error}", code=ExitCode.USAGE)
    backend = chosen_backend(args.backend, "up")
    # The stack's own files live in its data directory unless told otherwise;
    # what its simulated GPU holds lives in memory, as a GPU's does.
    chosen_sim_state = None
    if args.sim_state is None and "sim" in backend.split("+"):
        args.sim_state = chosen_sim_state = sim_state_path(args.data_dir, args.node)
    options = StackOptions(
        data_dir=args.data_dir,
        port=args.port,
        ui_port=args.ui_port,
        listen=args.listen,
        node=args.node,
        backend=backend,
        socket=socket_path,
        agent_args=[*agent_arguments(args), f"--socket={socket_path}"],
        sim_state=chosen_sim_state,
    )
    run_service("up", lambda stop: serve_stack(stop, options))


def run_demo(args: argparse.Namespace) -> int:
    from timeshare.workers.stack.demo import run_demo as demo

    return demo(args.iterations, args.data_dir)
