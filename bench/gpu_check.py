"""The GPU check of a new GPU host: driver probe, conformance, every GPU switch scenario.

The GPU check: one command an operator runs on a new GPU host, within 8
minutes on one GPU. Each step runs as a process of its own under its own
time limit, and its `scenario=...` line is printed as it finishes:

- probe: the driver probe (bench.gpu_probe), the readings of GPU-FACTS.md
  taken again, saved as probe.json and probe.md under --out, and the raw
  driver rates on the ranks' bytes;
- conformance: the backends' conformance suite and the PyTorch hook's GPU
  test against this driver (`pytest -m gpu`, TIMESHARE_GPU_TESTS=1);
- cuda, freeze+cuda, cuda-checkpoint, co-residency, hooks: the gpu_switch
  scenarios (bench.gpu_switch), one stack for all, each with its own limit.

Each figure is printed next to its limit (bench.parts.gpu_figures): each rank's
checkpoint and restore rate through timeshare against the raw driver's on the
same bytes (driver_ratio, at least 0.90), the offload hook's against a pinned
copy (at least 0.50), and how far a job's ranks moved at once (overlap). The
last line is `gpu_check=ok|failed scenarios=N failed=M seconds=S`; the exit
status is 0 only for ok. Everything, logs included, is kept under --out.

With --emulator every step runs on the GPU emulator (tests/emulator, no GPU):
the harness is checked, no figure is a GPU figure and no limit is judged, and
hooks is not measured (the emulator runs no PyTorch CUDA).

    python -m bench gpu_check                        # on a GPU host, 4 GiB per job
    python -m bench gpu_check --emulator --gib 0.05  # no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_switch import EMULATED, NAMES, emulator_environment
from bench.parts.gpu_check_steps import (
    Context,
    StepResult,
    run_conformance,
    run_probe,
    run_scenarios,
)

BUDGET_SECONDS = 480.0


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu_check",
        description="Check a GPU host: driver probe, conformance, switch scenarios.",
    )
    parser.add_argument("--gib", type=float, default=4.0, help="device memory per job (GiB)")
    parser.add_argument("--handovers", type=int, default=6, help="switches per scenario")
    parser.add_argument("--out", type=Path, help="where the reports go (default: a new folder)")
    parser.add_argument("--emulator", action="store_true", help="no GPU: the GPU emulator")
    steps = ["probe", "conformance", *NAMES]
    parser.add_argument("--skip", default="", help=f"comma-separated steps, of {', '.join(steps)}")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=BUDGET_SECONDS,
        help="the whole check's limit; a step that cannot start in it fails",
    )
    parser.add_argument("--scenario-seconds", type=float, default=90.0,
                        help="each gpu_switch scenario's limit")  # fmt: skip
    args = parser.parse_args(argv)
    skipped = {name for name in args.skip.split(",") if name}
    if skipped - set(steps):
        parser.error(f"no step {', '.join(sorted(skipped - set(steps)))}; there are "
                     f"{', '.join(steps)}")  # fmt: skip
    args.skipped = skipped
    if args.gib <= 0:
        parser.error("--gib must be above 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    started = time.monotonic()
    out: Path = args.out or Path(f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-emulator-")) if args.emulator else None
    env = dict(os.environ)
    if scratch is not None:
        env.update(emulator_environment(scratch, args.gib))
        env[EMULATED] = "1"
    where = "the GPU EMULATOR (no figure is a GPU figure)" if args.emulator else "this GPU host"
    print(f"gpu_check on {where}: {args.gib:g} GiB per job, {args.handovers} handovers per "
          f"scenario, reports in {out}", flush=True)  # fmt: skip
    context = Context(out=out, env=env, emulated=args.emulator, gib=args.gib,
                      handovers=args.handovers, deadline=started + args.budget_seconds,
                      scenario_seconds=args.scenario_seconds)  # fmt: skip
    results: list[StepResult] = []
    try:
        if "probe" not in args.skipped:
            results.append(context.report(run_probe(context)))
        if "conformance" not in args.skipped:
            results.append(context.report(run_conformance(context)))
        scenarios = [name for name in NAMES if name not in args.skipped]
        results += run_scenarios(context, scenarios, probe=next(
            (r for r in results if r.name == "probe"), None))  # fmt: skip
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - started
    failed = [r for r in results if r.failed(args.emulator)]
    summary: dict[str, Any] = {
        "emulated": args.emulator, "gib": args.gib, "handovers": args.handovers,
        "seconds": seconds, "steps": [r.model_dump(mode="json") for r in results],
    }  # fmt: skip
    (out / "gpu-check.json").write_text(json.dumps(summary, indent=2) + "\n")
    for result in failed:
        print(f"{result.name}: {result.reason or 'failed'}; see {result.log or out}", flush=True)
    state = "failed" if failed or not results else "ok"
    print(f"gpu_check={state} scenarios={len(results)} failed={len(failed)} "
          f"seconds={seconds:.0f}", flush=True)  # fmt: skip
    sys.exit(0 if state == "ok" else 1)


if __name__ == "__main__":
    main()
