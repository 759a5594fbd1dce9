"""The subcommands a light client install (`pip install timeshare`) runs:
status, the operator controls, report, register, forget, synthetic-job, and the
placement advisor's profile and plan. They talk to a gateway (or an agent's
socket) and never import temporalio."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from timeshare.cli.arguments import (
    COUNT,
    GATEWAY_HELP,
    PERIOD,
    PID,
    PRIORITY,
    SECONDS,
    WEIGHT,
    RenamedFlag,
    fail,
)
from timeshare.cli.subjects import add_subjects
from timeshare.placement.arguments import add_plan_arguments, add_profile_arguments
from timeshare.status_command import STATUS_OUTPUTS, WATCH_SECONDS

Subparsers = Any  # argparse's _SubParsersAction, private in typeshed
# The operator commands: name, what they act on, help.
OPERATOR_CONTROLS = [
    ("pause", ["group"], "grant no new turns in a group (the holder keeps its turn)"),
    ("resume", ["group"], "let a paused group grant turns again"),
    ("evict", ["group", "job"], "take a job out of its group"),
    ("drain", ["node"], "grant no new turns that need NODE; running turns finish"),
    ("undrain", ["node"], "put a drained node back in service"),
]
AGENT_SOCKET_HELP = (
    "the node agent's socket (env TIMESHARE_AGENT_SOCKET; default: /run/timeshare/agent.sock "
    "where it exists, else the one `timeshare up` serves for this user)"
)


def add_client_commands(commands: Subparsers) -> None:
    _status_command(commands)

    for name, subject, help_text in OPERATOR_CONTROLS:
        control = commands.add_parser(name, help=help_text, description=help_text)
        add_subjects(control, *subject)
        if name == "evict":
            control.add_argument("--reason", default="", help="told to the job on its next call")
        control.add_argument("--address", help=GATEWAY_HELP)
        control.set_defaults(handler=run_control)

    report = commands.add_parser("report", help="draw a group's recent history as a timeline")
    add_subjects(report, "group")
    report.add_argument("--out", type=Path, required=True, help="FILE.html or FILE.png")
    report.add_argument("--from-json", type=Path, help="draw a saved GroupHistory JSON instead")
    report.add_argument("--address", help=GATEWAY_HELP)
    report.set_defaults(handler=run_report)

    register = commands.add_parser(
        "register", help="register a process of a job with this node's agent (root or owner)"
    )
    add_subjects(register, "group", "job")
    register.add_argument("--pid", type=PID, required=True, help="the process to register")
    register.add_argument("--socket", help=AGENT_SOCKET_HELP)
    register.add_argument(
        "--token",
        help="the job's token, from its Join (env TIMESHARE_JOB_TOKEN, which other users "
        "of the node cannot read in `ps` as they can a flag)",
    )
    register.set_defaults(handler=run_register)

    llmd = commands.add_parser(
        "llmd-token",
        help="print an llm-d compat job's token (its registration credential), derived from "
        "the gateway's TIMESHARE_LLMD_SECRET",
    )
    add_subjects(llmd, "group", "job")
    llmd.set_defaults(handler=run_llmd_token)

    forget = commands.add_parser(
        "forget",
        help="release a job's processes on this node by hand and forget them (root or owner)",
    )
    add_subjects(forget, "group", "job")
    forget.add_argument("--socket", help=AGENT_SOCKET_HELP)
    forget.add_argument(
        "--token",
        help="the job's token (env TIMESHARE_JOB_TOKEN): needed, but for root, while the job "
        "is still in its group",
    )
    forget.set_defaults(handler=run_forget)

    _synthetic_job_command(commands)

    profile = commands.add_parser("profile", help="each job's profile, from its group's history")
    add_subjects(profile, "group")
    add_profile_arguments(profile)
    profile.set_defaults(handler=run_profile)
    plan = commands.add_parser("plan", help="which jobs should share which GPUs (advice only)")
    add_plan_arguments(plan)
    plan.set_defaults(handler=run_plan)


def _status_command(commands: Subparsers) -> None:
    status = commands.add_parser(
        "status",
        help="show groups, holders, queues and nodes",
        description="Groups, holders, queues and nodes. -o wide adds each group's policy and "
        "jobs; -o json prints the gateway's answer whole, for scripts (one JSON document per "
        "refresh with --watch).",
    )
    add_subjects(status, "group", required=False, help_text="only this group (default: all)")
    status.add_argument(
        "-o", "--output", choices=STATUS_OUTPUTS, default="table",
        help="table, wide (with each group's policy and jobs) or json",
    )  # fmt: skip
    status.add_argument(
        "-w", "--watch", type=PERIOD, nargs="?", const=WATCH_SECONDS, metavar="SECONDS",
        help=f"show it again every SECONDS ({WATCH_SECONDS:g} if not given) until Ctrl-C",
    )  # fmt: skip
    status.add_argument("--address", help=GATEWAY_HELP)
    status.set_defaults(handler=run_status)


def iteration_phases(text: str) -> list[tuple[str, float, str]]:
    """gpu:S[:PHASE],cpu:S,...: the phases of one iteration, as a placement
    profile's (PHASE names a GPU phase's acquire)."""
    phases = []
    for part in text.split(","):
        kind, _, rest = part.partition(":")
        seconds, _, phase = rest.partition(":")
        if kind not in ("gpu", "cpu") or (phase and kind == "cpu"):
            raise argparse.ArgumentTypeError(
                f"{part!r}: name a phase gpu:SECONDS[:PHASE] or cpu:SECONDS"
            )
        phases.append((kind, SECONDS(seconds), phase))
    if not any(kind == "gpu" for kind, _, _ in phases):
        raise argparse.ArgumentTypeError(f"{text!r} has no gpu phase")
    return phases


def _synthetic_job_command(commands: Subparsers) -> None:
    job = commands.add_parser("synthetic-job", help="run one synthetic RL job (demo, tests)")
    add_subjects(job, "group", "job")
    job.add_argument("--address", help=GATEWAY_HELP)
    job.add_argument("--nodes", help="comma-separated node names (default: the only live node)")
    job.add_argument("--iterations", type=COUNT, default=5, help="RL iterations to run")
    job.add_argument("--sample-seconds", type=SECONDS, default=0.8, help="GPU: each sample phase")
    job.add_argument("--reward-seconds", type=SECONDS, default=1.8, help="CPU: each reward phase")
    job.add_argument("--train-seconds", type=SECONDS, default=0.6, help="GPU: each train phase")
    job.add_argument("--start-delay-seconds", type=SECONDS, default=0.0,
                     help="wait this long after joining before the first iteration")  # fmt: skip
    job.add_argument(
        "--start-at", type=float, metavar="UNIX_SECONDS",
        help="once joined, start the first iteration at this time (plus the start delay), "
        "so that jobs started together begin together however long each took to start",
    )  # fmt: skip
    job.add_argument(
        "--iteration", type=iteration_phases, metavar="gpu:S[:PHASE],cpu:S,...",
        help="one iteration's phases in order, instead of sample, reward and train",
    )  # fmt: skip
    job.add_argument("--report", type=Path, help="write the job's record here (JSON)")
    job.add_argument("--lease-seconds", type=PERIOD, help="group policy, if this job makes it")
    job.add_argument("--agent-timeout-seconds", type=PERIOD, help="group policy, likewise")
    job.add_argument("--co-residency", choices=["auto", "off"], help="group policy, likewise")
    job.add_argument("--prefetch", choices=["auto", "off"], help="group policy, likewise")
    job.add_argument("--switch-cost-aware", choices=["on", "off"], help="group policy, likewise")
    job.add_argument("--weight", type=WEIGHT, default=1.0, help="the job's weight (fair share)")
    job.add_argument("--priority", type=PRIORITY, default=0, help="the job's priority")
    job.add_argument(
        "--backfill", action="store_true",
        help="join as backfill: use the GPUs only while no regular job holds or waits for "
        "them; run --iterations GPU steps back to back, giving the turn back at the first "
        "step boundary after a regular job asks",
    )  # fmt: skip
    job.add_argument("--step-seconds", type=PERIOD, default=0.05,
                     help="with --backfill: each GPU step's length")  # fmt: skip
    job.add_argument(
        "--ignore-should-yield", type=COUNT, metavar="STEPS",
        help="with --backfill: never look at should_yield; give each turn back after STEPS steps",
    )  # fmt: skip
    job.add_argument("--backfill-grace-seconds", type=SECONDS, help="group policy, likewise")
    job.add_argument("--ordering", choices=["fair", "fifo"], help="group policy, likewise")
    job.add_argument(
        "--hooks", choices=["offload", "discard"],
        help="serve workload hooks to the agent, asking to be evicted this way",
    )  # fmt: skip
    job.add_argument(
        "--socket", "--agent-socket", dest="agent_socket", action=RenamedFlag,
        help=f"with --hooks: {AGENT_SOCKET_HELP} (--agent-socket is the old name)",
    )  # fmt: skip
    job.add_argument(
        "--blocking-yields", action="store_true",
        help="wait for each yield's answer before the CPU phase after it (Job.yield_) "
        "instead of starting that phase at once (Job.yield_nowait), and for each next "
        "turn's (Job.next_turn) instead of going on where nobody waits (Job.next_turn_nowait)",
    )  # fmt: skip
    job.set_defaults(handler=run_synthetic_job)


def run_profile(args: argparse.Namespace) -> int:
    from timeshare.placement.profile_cli import cmd_profile

    return cmd_profile(args)


def run_plan(args: argparse.Namespace) -> int:
    from timeshare.placement.plan_cli import cmd_plan

    return cmd_plan(args)


def run_status(args: argparse.Namespace) -> int:
    from timeshare.status_command import show_status

    return show_status(args.address, args.group, args.output, args.watch)


def run_control(args: argparse.Namespace) -> int:
    from timeshare.status import run_control

    return run_control(args)


def run_report(args: argparse.Namespace) -> int:
    from timeshare.report.cli import cmd_report

    return cmd_report(args)


def run_register(args: argparse.Namespace) -> int:
    from timeshare.errors import TimeshareError
    from timeshare.registration import register_process

    try:
        pid = register_process(args.group, args.job, args.socket, pid=args.pid, token=args.token)
    except TimeshareError as error:
        return fail(f"register: {error}")
    print(f"process {pid} registered to {args.group}/{args.job}")
    return 0


def run_llmd_token(args: argparse.Namespace) -> int:
    """For the operator, who holds the gateway's secret: the job's own token,
    to hand to that job alone (as TIMESHARE_JOB_TOKEN), never the secret."""
    import os

    from timeshare.credentials import llmd_job_token
    from timeshare.names import check_name

    try:
        group, job = check_name("group", args.group), check_name("job", args.job)
    except ValueError as error:
        return fail(f"llmd-token: {error}", code=2)
    secret = os.environ.get("TIMESHARE_LLMD_SECRET", "")
    if not secret:
        return fail(
            "llmd-token: set TIMESHARE_LLMD_SECRET to the gateway's secret (the gateway's "
            "--llmd-compat derives every job's token from it)",
            code=2,
        )
    print(llmd_job_token(secret.encode(), group, job))
    return 0


def run_forget(args: argparse.Namespace) -> int:
    """What the agents do by themselves when a job leaves (its processes
    thawed, restored where they fit, never left stopped), by hand: for a job
    whose scheduler is gone or whose agent was down when it left."""
    from timeshare.errors import TimeshareError
    from timeshare.names import check_name
    from timeshare.registration import forget_job

    try:
        group, job = check_name("group", args.group), check_name("job", args.job)
    except ValueError as error:
        return fail(f"forget: {error}", code=2)
    try:
        print(forget_job(group, job, args.socket, token=args.token))
    except TimeshareError as error:
        return fail(f"forget: {error}")
    return 0


def run_synthetic_job(args: argparse.Namespace) -> int:
    from timeshare.errors import TimeshareError
    from timeshare.models import GroupPolicy
    from timeshare.placement.spec import Phase
    from timeshare.synthetic import SyntheticJobSpec
    from timeshare.synthetic import run_synthetic_job as run_job

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
        start_at=args.start_at,
        iteration=[
            Phase.model_validate({kind: s, "phase": phase}) for kind, s, phase in args.iteration
        ]
        if args.iteration
        else None,
        policy=GroupPolicy(
            lease_seconds=args.lease_seconds or 30.0,
            agent_timeout_seconds=args.agent_timeout_seconds or 30.0,
            co_residency=args.co_residency or "auto",
            prefetch=args.prefetch or "auto",
            switch_cost_aware=args.switch_cost_aware != "off",
            ordering=args.ordering or "fair",
            **(
                {"backfill_grace_seconds": args.backfill_grace_seconds}
                if args.backfill_grace_seconds is not None
                else {}
            ),
        ),
        hooks=args.hooks,
        agent_socket=args.agent_socket,
        weight=args.weight,
        priority=args.priority,
        backfill=args.backfill,
        step_seconds=args.step_seconds,
        **(
            {"ignore_should_yield": True, "turn_steps": args.ignore_should_yield}
            if args.ignore_should_yield
            else {}
        ),
        blocking_yields=args.blocking_yields,
    )
    # SIGTERM unwinds like Ctrl-C, so the job leaves its group on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        run_job(spec, args.report)
    except TimeshareError as error:
        return fail(f"job {args.job}: {error}")
    except KeyboardInterrupt:
        return 130
    return 0
