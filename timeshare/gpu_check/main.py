"""`timeshare gpu-check`: proves a new GPU host in one command, within 8
minutes on one GPU. Each step runs as a process of its own under its own time
limit, and its `scenario=...` line is printed as it ends:

- probe: the driver probe (timeshare.gpu_check.probe): the driver's answers
  read again, saved as probe.json and probe.md under --out, and the raw
  driver rates on the ranks' bytes;
- conformance: each backend's lock, checkpoint, restore and unlock against
  this driver (timeshare.gpu_check.conformance);
- blog: two RL-shaped PyTorch jobs alone, then sharing the GPU with the
  `hooks` and the `cuda` backend (timeshare.gpu_check.blog): GPU busy from
  NVML and the iteration time, against the goals;
- cuda, freeze+cuda, cuda-checkpoint, co-residency, hooks: the switch
  scenarios (timeshare.gpu_check.switch), one stack for all, each with its
  own limit: every rank's checkpoint and restore rate through timeshare
  against the raw driver's on the same bytes (driver_ratio, at least 0.90),
  the offload hook's against a pinned copy (at least 0.50).

The last line is `gpu_check=ok|failed scenarios=N failed=M seconds=S`; the
exit status is 0 only for ok. Everything, logs included, is kept under --out.

What the host brings: the NVIDIA driver, PyTorch with CUDA (the blog and
hooks steps) and NVIDIA's `cuda-checkpoint` utility on PATH (its scenario
and conformance); a missing one is named in one line and only the steps
that need it are skipped. The Python parts come with `timeshare[gpu-check]`
(every `timeshare bundle` holds them).

With --emulator every step runs on the GPU emulator (no GPU; gcc builds it):
the harness is checked, figures are named `emulated_...`, no limit is
judged, and hooks is not measured (the emulator runs no PyTorch CUDA).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timeshare.gpu_check.arguments import EXTRA, STEPS, SWITCH_SCENARIOS, add_arguments, checked
from timeshare.gpu_check.steps import (
    Context,
    StepResult,
    run_blog,
    run_conformance,
    run_probe,
    run_scenarios,
)
from timeshare.gpu_check.switch import EMULATED, emulator_environment

# Python modules the check runs on, and the extra that brings them.
NEEDED_MODULES = {"temporalio": EXTRA, "pynvml": EXTRA, "cuda.bindings": EXTRA}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="timeshare gpu-check",
        description=f"Check a GPU host: driver probe, conformance, the blog's scenario, switch "
        f"scenarios. Needs {EXTRA}.",
    )
    add_arguments(parser)
    return checked(parser.parse_args(argv), parser)


def missing_python_parts() -> str | None:
    for module, extra in NEEDED_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not installed: pip install '{extra}'"
    return None


def host_gaps(emulated: bool) -> dict[str, str]:
    """The steps this host cannot run, and why: the host's own parts."""
    if emulated:
        from timeshare.gpu_check import emulator

        if emulator.gcc() is None:
            return {step: "gcc is not installed: the GPU emulator is built from C"
                    for step in STEPS}  # fmt: skip
        return {}
    gaps: dict[str, str] = {}
    if shutil.which("cuda-checkpoint") is None:
        gaps["cuda-checkpoint"] = (
            "NVIDIA's cuda-checkpoint utility is not on PATH (github.com/NVIDIA/cuda-checkpoint)"
        )
    if not torch_with_cuda():
        for step in ("blog", "hooks"):
            gaps[step] = "PyTorch with CUDA is not installed on this host"
    return gaps


def torch_with_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> int:
    missing = missing_python_parts()
    if missing:
        print(f"timeshare gpu-check: {missing}", file=sys.stderr)
        return 2
    started = time.monotonic()
    out: Path = args.out or Path(f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-emulator-")) if args.emulator else None
    env = dict(os.environ)
    gaps = host_gaps(args.emulator)
    where = "the GPU EMULATOR (no figure is a GPU figure)" if args.emulator else "this GPU host"
    print(f"gpu_check on {where}: {args.gib:g} GiB per job, {args.handovers} handovers per "
          f"switch scenario, reports in {out}", flush=True)  # fmt: skip
    for reason in sorted(set(gaps.values())):
        steps = ", ".join(step for step in STEPS if gaps.get(step) == reason)
        print(f"gpu_check: {reason}; skipping {steps}", flush=True)
    skipped = args.skipped | set(gaps)
    if scratch is not None and len(skipped) < len(STEPS):
        env.update(emulator_environment(scratch, args.gib))
        env[EMULATED] = "1"
    context = Context(out=out, env=env, emulated=args.emulator, gib=args.gib,
                      handovers=args.handovers, iterations=args.iterations,
                      deadline=started + args.budget_seconds,
                      scenario_seconds=args.scenario_seconds)  # fmt: skip
    results: list[StepResult] = []
    try:
        if "probe" not in skipped:
            results.append(context.report(run_probe(context)))
        if "conformance" not in skipped:
            results.append(context.report(run_conformance(context)))
        if "blog" not in skipped:
            results += run_blog(context)
        scenarios = [name for name in SWITCH_SCENARIOS if name not in skipped]
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
        "skipped": {step: gaps.get(step, "--skip") for step in sorted(skipped)},
    }  # fmt: skip
    (out / "gpu-check.json").write_text(json.dumps(summary, indent=2) + "\n")
    for result in failed:
        print(f"{result.name}: {result.reason or 'failed'}; see {result.log or out}", flush=True)
    state = "failed" if failed or not results else "ok"
    print(f"gpu_check={state} scenarios={len(results)} failed={len(failed)} "
          f"seconds={seconds:.0f}", flush=True)  # fmt: skip
    return 0 if state == "ok" else 1


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(parse_arguments(argv)))


if __name__ == "__main__":
    main()
