"""`timeshare plan FILE.yaml [--out plan.json]` and `timeshare plan
--from-groups`. Bad input and input no plan satisfies are one line on
stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from timeshare.errors import TimeshareError
from timeshare.placement.advice import LiveSettings, advise, gather, render_advice
from timeshare.placement.evaluate import Evaluator
from timeshare.placement.load import PlanInputError, first_problem, load_plan_input
from timeshare.placement.plan import make_plan, render
from timeshare.placement.search import PlanError

BAD_INPUT = 2


def _fail(message: str, code: int = BAD_INPUT) -> int:
    print(f"timeshare plan: {message}", file=sys.stderr)
    return code


def cmd_plan(args: argparse.Namespace) -> int:
    if args.from_groups:
        return _from_groups(args)
    if args.file is None:
        return _fail("give FILE.yaml (or FILE.json), or --from-groups")
    try:
        plan_input = load_plan_input(args.file)
        plan = make_plan(Evaluator(plan_input), args.group_prefix, args.time_limit)
    except (PlanInputError, PlanError) as error:
        return _fail(str(error))
    text = render(plan, plan_input.max_slowdown, plan_input.gpu_sets.host_memory_gib)
    *body, last = text.splitlines()
    print("\n".join(body))
    if args.out is not None:
        try:
            args.out.write_text(plan.model_dump_json(indent=1) + "\n")
        except OSError as error:
            return _fail(f"cannot write {args.out}: {error.strerror or error}", 1)
        print(f"plan written to {args.out}: each job's TIMESHARE_GROUP, TIMESHARE_JOB and "
              "TIMESHARE_NODES under launch")  # fmt: skip
    print(last)
    return 0


def _from_groups(args: argparse.Namespace) -> int:
    try:
        settings = LiveSettings(
            max_slowdown=args.max_slowdown,
            gpu_memory_gib=args.gpu_memory_gib,
            host_memory_gib=args.host_memory_gib,
            bandwidth_gbps=args.bandwidth_gbps,
            co_residency_margin_gib=args.co_residency_margin_gib,
            states=dict(args.state_gib),
            groups=args.groups.split(",") if args.groups else None,
            budget_seconds=args.time_limit,
        )
    except ValidationError as error:
        return _fail(f"--from-groups: {first_problem(error, {})}")
    try:
        statuses, histories = gather(args.address, settings)
    except TimeshareError as error:
        return _fail(str(error), 1)
    if not statuses:
        return _fail("no live group has jobs", 1)
    try:
        print(render_advice(advise(statuses, histories, settings)))
    except (PlanError, ValueError) as error:
        return _fail(str(error))
    return 0
