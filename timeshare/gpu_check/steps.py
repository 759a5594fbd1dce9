"""The steps of timeshare.gpu_check.main, each a process under its own time limit, and
how each is judged: the driver probe, the conformance suite, and the
gpu_switch scenarios (one gpu_switch process for all; one whose scenario
outlives its limit is killed, and the rest run in a new one)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from timeshare.gpu_check.blog import BlogOutcome, outcome_figures
from timeshare.gpu_check.figures import DRIVER_RATIO_LIMIT, HOOKS_CEILING_LIMIT, figure, p50, ratio
from timeshare.gpu_check.switch import RANKS, Outcome
from timeshare.self_command import python_module_command
from timeshare.testing.stack import processes_below

Status = Literal["ok", "failed", "timed_out", "not_measured", "not_run"]
PROBE_SECONDS = 150.0
BLOG_SECONDS = 150.0
CONFORMANCE_SECONDS = 240.0
# From a gpu_switch process's start (its stack) or a scenario's end to the next start.
STACK_SECONDS = 150.0
# A step is not started with less time left than this.
LEAST_SECONDS = 20.0
# Scenarios that move every rank through the driver (judged by driver_ratio).
TRANSPARENT = ("cuda", "freeze+cuda", "cuda-checkpoint")


class StepResult(BaseModel):
    name: str
    status: Status
    seconds: float = 0.0
    # The figures of the step's line, in order.
    fields: dict[str, str] = Field(default_factory=dict)
    reason: str | None = None
    log: str | None = None
    # Raw figures for the steps after (the probe's driver rates).
    data: dict[str, Any] = Field(default_factory=dict)

    def failed(self, emulated: bool) -> bool:
        # Not measured on a GPU host is a gap in the check; on the emulator, expected.
        return self.status in ("failed", "timed_out", "not_run") or (
            self.status == "not_measured" and not emulated
        )

    def line(self) -> str:
        parts = [f"scenario={self.name}", *(f"{key}={value}" for key, value in self.fields.items())]
        parts += [f"status={self.status}", f"seconds={self.seconds:.1f}"]
        if self.reason:
            parts.append(f"reason={json.dumps(self.reason)}")
        return " ".join(parts)


@dataclass
class Context:
    out: Path
    env: dict[str, str]
    emulated: bool
    gib: float
    handovers: int
    iterations: int
    deadline: float
    scenario_seconds: float

    @property
    def prefix(self) -> str:
        """Rate and ratio names on the emulator say so."""
        return "emulated_" if self.emulated else ""

    @property
    def rank_bytes(self) -> int:
        return int(self.gib * 2**30) // RANKS

    def limit(self, wanted: float) -> float | None:
        """The step's time limit, or None when the check's budget is spent."""
        left = self.deadline - time.monotonic()
        return None if left < LEAST_SECONDS else min(wanted, left)

    def report(self, result: StepResult) -> StepResult:
        print(result.line(), flush=True)
        return result

    def not_run(self, name: str) -> StepResult:
        spent = "the check's time budget was spent (--budget-seconds)"
        return StepResult(name=name, status="not_run", reason=spent)


def started(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                cwd=log.parent, start_new_session=True)  # fmt: skip


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the step's process and everything it started."""
    family = processes_below(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in [process.pid, *family]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def finished(process: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The exit status, or None once the step was killed at its limit."""
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        stop(process)
        return None


@dataclass
class Ran:
    """How a step's process ended: its exit status (None: killed at its limit)."""

    status: int | None
    seconds: float
    limit: float


def run_step(context: Context, wanted: float, command: list[str], log: Path) -> Ran | None:
    """The step's process under its limit; None when the check's budget is spent."""
    limit = context.limit(wanted)
    if limit is None:
        return None
    begun = time.monotonic()
    status = finished(started(command, log, context.env), limit)
    return Ran(status, time.monotonic() - begun, limit)


# -- the probe -------------------------------------------------------------------


def run_probe(context: Context) -> StepResult:
    log = context.out / "probe.log"
    command = [*python_module_command("timeshare.gpu_check.probe"), f"--out={context.out}",
               f"--bytes={context.rank_bytes}", f"--ranks={RANKS}"]  # fmt: skip
    command += ["--emulated", "--repeats=2"] if context.emulated else ["--repeats=3"]
    ran = run_step(context, PROBE_SECONDS, command, log)
    if ran is None:
        return context.not_run("probe")
    status = ran.status
    result = StepResult(name="probe", status="ok", seconds=ran.seconds, log=str(log))
    path = context.out / "probe.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    result.fields["readings"] = str(len(report.get("readings", [])))
    rates: dict[str, dict[str, float]] = report.get("rates", {})
    result.data = rates
    for label in ("parallel", "solo"):
        for move in ("checkpoint", "restore"):
            value = rates.get(label, {}).get(move)
            name = f"raw_{move}_gbps_per_rank" + ("" if label == "parallel" else "_solo")
            result.fields[context.prefix + name] = figure(value)
    result.fields["report"] = str(context.out / "probe.md")
    if status is None:
        result.status, result.reason = "timed_out", f"the probe ran past {ran.limit:.0f} s"
    elif status != 0 or report.get("failures"):
        result.status = "failed"
        result.reason = "; ".join(report.get("failures", [])) or f"the probe exited {status}"
    return result


# -- the conformance suite ----------------------------------------------------------


def run_conformance(context: Context) -> StepResult:
    log = context.out / "conformance.log"
    command = [*python_module_command("timeshare.gpu_check.conformance"),
               f"--out={context.out / 'conformance'}"]  # fmt: skip
    ran = run_step(context, CONFORMANCE_SECONDS, command, log)
    if ran is None:
        return context.not_run("conformance")
    status = ran.status
    result = StepResult(name="conformance", status="ok", seconds=ran.seconds, log=str(log))
    counts = conformance_counts(log)
    result.fields.update({key: str(value) for key, value in counts.items()})
    result.fields["report"] = str(log)
    if status is None:
        result.status, result.reason = "timed_out", f"the checks ran past {ran.limit:.0f} s"
    elif status != 0 or counts["failed"] or not counts["passed"]:
        failures = [line for line in log.read_text().splitlines() if "status=failed" in line]
        result.status = "failed"
        result.reason = "; ".join(failures[:3]) or (
            f"the checks exited {status}: {counts['failed']} failed, {counts['passed']} passed"
        )
    return result


def conformance_counts(log: Path) -> dict[str, int]:
    """The figures of the checks' last line, `conformance passed=N failed=M skipped=K`."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    lines = log.read_text().splitlines() if log.exists() else []
    for line in reversed(lines):
        if line.startswith("conformance "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key in counts and value.isdigit():
                    counts[key] = int(value)
            break
    return counts


# -- the blog's scenario -----------------------------------------------------------


def run_blog(context: Context) -> list[StepResult]:
    """Two RL-shaped jobs alone, then sharing the GPU with each backend: a
    result per backend (timeshare.gpu_check.blog)."""
    log, results = context.out / "blog.log", context.out / "blog.jsonl"
    results.unlink(missing_ok=True)
    command = [*python_module_command("timeshare.gpu_check.blog"), f"--gib={context.gib}",
               f"--iterations={context.iterations}",
               f"--results={results}", *(["--emulated"] if context.emulated else [])]  # fmt: skip
    ran = run_step(context, BLOG_SECONDS, command, log)
    if ran is None:
        return [context.not_run("blog")]
    status, seconds = ran.status, ran.seconds
    lines = results.read_text().splitlines() if results.exists() else []
    outcomes = [BlogOutcome.model_validate_json(line) for line in lines]
    steps = [
        StepResult(
            name="blog",
            status=outcome.status,
            seconds=seconds,
            fields=outcome_figures(outcome),
            reason=outcome.not_measured or "; ".join(outcome.reasons) or None,
            log=str(log),
        )
        for outcome in outcomes
    ]
    failure: tuple[Status, str] | None = None
    if status is None:
        failure = ("timed_out", f"the blog's scenario ran past {ran.limit:.0f} s")
    elif not steps:
        failure = ("failed", f"the blog's scenario exited {status}, no result")
    if failure is not None:
        steps.append(StepResult(name="blog", status=failure[0], seconds=seconds, log=str(log),
                                reason=failure[1]))  # fmt: skip
    return [context.report(step) for step in steps]


# -- the gpu_switch scenarios ---------------------------------------------------------


def run_scenarios(context: Context, names: list[str], probe: StepResult | None) -> list[StepResult]:
    results: list[StepResult] = []
    if context.emulated and "hooks" in names:
        names = [name for name in names if name != "hooks"]
        results.append(StepResult(name="hooks", status="not_measured",
                                  reason="the emulator runs no PyTorch CUDA"))  # fmt: skip
    remaining = list(names)
    while remaining:
        if context.limit(context.scenario_seconds) is None:
            results += [context.report(context.not_run(name)) for name in remaining]
            break
        done = one_switch_process(context, remaining, probe)
        results += done
        finished_names = {result.name for result in done}
        if not finished_names:
            break
        remaining = [name for name in remaining if name not in finished_names]
    for result in results:
        if result.name == "hooks" and result.status == "not_measured" and context.emulated:
            context.report(result)
    return sorted(results, key=lambda r: names.index(r.name) if r.name in names else len(names))


def one_switch_process(context: Context, names: list[str], probe: StepResult | None,
                       ) -> list[StepResult]:  # fmt: skip
    """Run the scenarios in one gpu_switch process until they are done, one
    outlives its limit (it is killed: the rest wait for the next process), or
    the process ends."""
    log, results_path = context.out / "gpu_switch.log", context.out / "gpu_switch.jsonl"
    offset = results_path.stat().st_size if results_path.exists() else 0
    command = [*python_module_command("timeshare.gpu_check.switch"), f"--only={','.join(names)}",
               f"--gib={context.gib}", f"--handovers={context.handovers}",
               f"--results={results_path}"]  # fmt: skip
    process = started(command, log, context.env)
    results: list[StepResult] = []
    current, since = None, time.monotonic()
    while True:
        entries, offset = new_entries(results_path, offset)
        for entry in entries:
            if entry["event"] == "start":
                current, since = entry["scenario"], time.monotonic()
                continue
            result = judged(context, entry, probe, since)
            result.log = str(log)
            results.append(context.report(result))
            current, since = None, time.monotonic()
        if process.poll() is not None and not entries:
            break
        now = time.monotonic()
        waited = now - since
        limit = context.scenario_seconds if current else STACK_SECONDS
        if waited > limit or now > context.deadline:
            stop(process)
            what = (f"{current} ran past {limit:.0f} s" if current
                    else f"gpu_switch started no scenario within {limit:.0f} s")  # fmt: skip
            if now > context.deadline:
                what += " (the check's budget was spent)"
            name = current or next(n for n in names if n not in {r.name for r in results})
            results.append(
                context.report(
                    StepResult(
                        name=name, status="timed_out", seconds=waited, reason=what, log=str(log)
                    )
                )
            )
            return results
        time.sleep(0.2)
    for name in names:
        if name not in {r.name for r in results}:
            reason = f"gpu_switch exited {process.returncode} before it ran {name}"
            results.append(context.report(StepResult(name=name, status="failed", reason=reason,
                                                     log=str(log))))  # fmt: skip
    return results


def new_entries(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    if not path.exists():
        return [], offset
    with path.open("rb") as results:
        results.seek(offset)
        text = results.read().decode()
    complete = text[: text.rfind("\n") + 1]
    entries = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return entries, offset + len(complete.encode())


def judged(context: Context, entry: dict[str, Any], probe: StepResult | None,
           since: float) -> StepResult:  # fmt: skip
    """A scenario's figures next to their limits, and what failed."""
    if entry["event"] == "not_measured":
        reason = entry["reason"] + ("" if context.emulated else
                                    ": install torch with CUDA, or --skip hooks")  # fmt: skip
        return StepResult(name=entry["scenario"], status="not_measured", reason=reason)
    outcome = Outcome.model_validate(entry["outcome"])
    name, prefix = outcome.scenario.name, context.prefix
    result = StepResult(name=name, status="ok", seconds=outcome.seconds)
    reasons = [outcome.error] if outcome.error else []
    fields = result.fields
    fields["verified"] = f"{outcome.verified}/{outcome.checks}"
    fields[f"memory_{outcome.scenario.expect}"] = str(outcome.memory_as_expected).lower()
    fields["ranks_reported"] = str(outcome.ranks_reported)
    fields["switch_p50_s"] = figure(p50(outcome.switch_seconds), 3)
    if outcome.checks and outcome.verified != outcome.checks:
        reasons.append(f"data read back wrong after {outcome.checks - outcome.verified} grants")
    if outcome.checks and not outcome.memory_as_expected:
        reasons.append(f"NVML did not show the waiting job's memory {outcome.scenario.expect}")
    limits: list[tuple[str, float | None, float]] = []
    if name in TRANSPARENT:
        if outcome.ranks_reported < 2 * RANKS:
            reasons.append(f"the agent's record names {outcome.ranks_reported} ranks, "
                           f"not {2 * RANKS}")  # fmt: skip
        raw = (probe.data if probe else {}).get("parallel", {})
        for move, rates in (("checkpoint", outcome.checkpoint_gbps),
                            ("restore", outcome.restore_gbps)):  # fmt: skip
            measured = p50(rates)
            fields[f"{prefix}{move}_gbps_per_rank_p50"] = figure(measured)
            fields[f"{prefix}raw_{move}_gbps_per_rank"] = figure(raw.get(move))
            driver_ratio = ratio(measured, raw.get(move))
            fields[f"{prefix}{move}_driver_ratio"] = figure(driver_ratio)
            limits.append((f"{move}_driver_ratio", driver_ratio, DRIVER_RATIO_LIMIT))
        fields["driver_ratio_limit"] = f"{DRIVER_RATIO_LIMIT:.2f}"
        fields["overlap_p50"] = figure(p50(outcome.overlap))
    if outcome.scenario.torch_hooks:
        for direction in ("evict", "admit"):
            rate = p50(outcome.hook_gbps.get(direction, []))
            ceiling = outcome.ceiling_gbps.get(direction)
            fields[f"{prefix}hook_{direction}_gbps_p50"] = figure(rate)
            fields[f"{prefix}copy_ceiling_{direction}_gbps"] = figure(ceiling)
            share = ratio(rate, ceiling)
            fields[f"{prefix}hook_{direction}_of_ceiling"] = figure(share)
            limits.append((f"hook_{direction}_of_ceiling", share, HOOKS_CEILING_LIMIT))
        fields["ceiling_limit"] = f"{HOOKS_CEILING_LIMIT:.2f}"
    if limits:
        fields["limits"] = "not_judged" if context.emulated else "judged"
    if not context.emulated:
        for what, value, least in limits:
            if value is None:
                reasons.append(f"{what} could not be measured")
            elif value < least:
                reasons.append(f"{what} {value:.2f} is below {least:.2f}")
    if reasons:
        result.status, result.reason = "failed", "; ".join(reasons)
    return result
