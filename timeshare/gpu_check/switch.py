"""Device state moved by the CUDA backends for two-rank RL-shaped jobs: GB/s per rank.

The GPU switch scenarios: real device state moved by the CUDA backends, for
jobs shaped like real RL jobs. timeshare.gpu_check.main runs them on a new GPU host,
each under its own time limit, next to the driver probe.

Each job has two CUDA ranks (timeshare.gpu_check.cuda_rank), each holding a seeded pattern
in device memory (written and checked at device speed) and each with a
DataLoader-style child that never touches CUDA. Two such jobs take turns in
one group through the embedded stack, in these scenarios:

- cuda: the in-process driver backend moves each yielding job's memory to the host;
- freeze+cuda: the same, and every process of the job (the children too) is
  frozen once its device state is checkpointed;
- cuda-checkpoint: the `cuda-checkpoint` utility, one run per rank at once;
- co-residency: both jobs fit on the GPU, so a switch is a lock and an unlock,
  and NVML shows the waiting job's memory never leaves the device;
- hooks (needs torch with CUDA): `app+cuda`, a PyTorch job whose offload hook
  moves its data to pinned host memory first (timeshare.gpu_check.torch_holder).

After every grant each rank's data is read back and checked (CRC32), and NVML
says whether the waiting job's device memory dropped (or, co-resident,
stayed). Reports checkpoint and restore GB/s per rank and how far the ranks
of a job moved at once, from the agent's record (timeshare.gpu_check.figures); for
hooks, the hook's own GB/s next to a pinned copy of the same bytes.

Prints one `scenario=...` line as each scenario finishes; --results appends
a JSON line when each starts and when it finishes (timeshare.gpu_check.main reads it).

    python -m bench gpu_switch                      # on a GPU host
    python -m bench gpu_switch --only freeze+cuda,cuda-checkpoint
    python -m bench gpu_switch --emulator --gib 0.02   # no GPU: the GPU EMULATOR
                                                       # (timeshare/gpu_check/emulator); checks the
                                                       # harness only, no GPU figure
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

import timeshare
from timeshare.activities.backends.gpus import device_memory_by_pid
from timeshare.credentials import JOB_TOKEN_ENV
from timeshare.gpu_check.figures import figure, overlaps, p50, rank_moves, ratio
from timeshare.models import CoResidency, GroupPolicy
from timeshare.self_command import python_module_command
from timeshare.status import table
from timeshare.testing import LocalStack

Expect = Literal["dropped", "stayed"]
EMULATED = "TIMESHARE_GPU_SWITCH_EMULATED"
# The emulator's scratch folder, removed by the run that execve made: the
# process that created it is gone by then.
EMULATOR_SCRATCH = "TIMESHARE_GPU_SWITCH_EMULATOR_SCRATCH"
# What the emulator's checkpoint and restore copy per second: finite, so that
# its rates and ratios are figures at all (never GPU figures).
EMULATOR_COPY_RATE = 2 * 10**9
RANKS = 2
CUDA_RANK = "timeshare.gpu_check.cuda_rank"
TORCH_HOLDER = "timeshare.gpu_check.torch_holder"


class Scenario(BaseModel):
    name: str
    backend: str
    co_residency: CoResidency
    # What NVML should show of the waiting job's device memory after a switch.
    expect: Expect
    # A PyTorch job serving its offload hook instead of CUDA ranks (needs torch CUDA).
    torch_hooks: bool = False


SCENARIOS = [
    Scenario(name="cuda", backend="cuda", co_residency="off", expect="dropped"),
    Scenario(name="freeze+cuda", backend="freeze+cuda", co_residency="off", expect="dropped"),
    Scenario(name="cuda-checkpoint", backend="cuda-checkpoint", co_residency="off",
             expect="dropped"),
    Scenario(name="co-residency", backend="cuda", co_residency="auto", expect="stayed"),
    Scenario(name="hooks", backend="app+cuda", co_residency="off", expect="dropped",
             torch_hooks=True),
]  # fmt: skip
NAMES = [scenario.name for scenario in SCENARIOS]


class Rank:
    """A process holding known data on the device (timeshare.gpu_check.cuda_rank or
    timeshare.gpu_check.torch_holder)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        self.hello = self.read()
        self.pid, self.expected = int(self.hello["pid"]), int(self.hello["checksum"])
        self.loader = int(self.hello.get("loader", 0))

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"rank process {self.process.pid} exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        for pid in (self.loader, self.process.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.process.wait()


def all_intact(ranks: list[Rank]) -> list[bool]:
    """Each rank's data read back and checked, the ranks at once."""
    for rank in ranks:
        rank.ask("checksum")
    return [int(rank.read()["checksum"]) == rank.expected for rank in ranks]


def start_job(group: str, job: str, gib: float, seed: int, scenario: Scenario,
              socket: Path, token: str) -> list[Rank]:  # fmt: skip
    # The job's token: the agent admits the rank into its job only with it.
    env = {"TIMESHARE_AGENT_SOCKET": str(socket), JOB_TOKEN_ENV: token}
    identity = [f"--group={group}", f"--job={job}"]
    if scenario.torch_hooks:
        command = [*python_module_command(TORCH_HOLDER), *identity, f"--gib={gib}",
                   f"--seed={seed}", "--hooks"]  # fmt: skip
        return [Rank(command, env)]
    per_rank = int(gib * 2**30) // RANKS
    return [
        Rank([*python_module_command(CUDA_RANK), *identity, f"--bytes={per_rank}",
              f"--seed={seed * RANKS + rank}"], env)
        for rank in range(RANKS)
    ]  # fmt: skip


class Outcome(BaseModel):
    scenario: Scenario
    rows: list[list[str]] = Field(default_factory=list)
    switch_seconds: list[float] = Field(default_factory=list)
    verified: int = 0
    checks: int = 0
    # NVML's word on the waiting job's memory after each switch.
    memory_as_expected: bool = False
    # Per rank and switch, from the agent's record: GB/s of each checkpoint and restore.
    checkpoint_gbps: list[float] = Field(default_factory=list)
    restore_gbps: list[float] = Field(default_factory=list)
    ranks_reported: int = 0
    # Per phase, how far a job's ranks moved at once (timeshare.gpu_check.figures.overlap).
    overlap: list[float] = Field(default_factory=list)
    # Hooks: the offload hook's own GB/s, and a pinned copy of the same bytes.
    hook_gbps: dict[str, list[float]] = Field(default_factory=dict)
    ceiling_gbps: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.checks > 0
            and self.verified == self.checks
            and (self.memory_as_expected)
        )


def run_scenario(stack: LocalStack, scenario: Scenario, gib: float, handovers: int) -> Outcome:
    if stack.backend != scenario.backend:
        stack.backend = scenario.backend
        stack.restart("agent")
    group = f"gpu-switch-{scenario.name.replace('+', '-')}"
    jobs: list[list[Rank]] = []
    # Without prefetch each acquire() waits for its own switch, so switch_p50_s is
    # the switch (with prefetch the idle GPU takes the next job in before it asks,
    # and its acquire() finds it there: 0 s).
    policy = GroupPolicy(co_residency=scenario.co_residency, prefetch="off")
    with timeshare.connect(stack.address) as client:
        # Joined before the ranks start: they register with their job's token.
        handles = [
            client.join(group, f"job-{i}", nodes=[stack.node], policy=policy) for i in range(2)
        ]
        try:
            jobs = [start_job(group, f"job-{i}", gib, i, scenario, stack.socket_path,
                              handles[i].token) for i in range(2)]  # fmt: skip
            outcome = take_turns(scenario, handles, jobs, handovers, gib)
            if scenario.torch_hooks:
                hooks_figures(outcome, [rank for ranks in jobs for rank in ranks])
        finally:
            for ranks in jobs:
                for rank in ranks:
                    rank.stop()
    moves = rank_moves(stack.process_record(), group)
    outcome.checkpoint_gbps = [m.gbps for m in moves if m.event == "checkpoint"]
    outcome.restore_gbps = [m.gbps for m in moves if m.event == "restore"]
    outcome.ranks_reported = len({m.pid for m in moves})
    outcome.overlap = overlaps(moves)
    return outcome


def hooks_figures(outcome: Outcome, holders: list[Rank]) -> None:
    """The hook's GB/s per eviction and admission, and the holders' ceiling."""
    rates: dict[str, list[float]] = {"evict": [], "admit": []}
    for holder in holders:
        holder.ask("moves")
        for direction, count, seconds in holder.read()["moves"]:
            if seconds > 0:
                rates[direction].append(count / seconds / 1e9)
    outcome.hook_gbps = rates
    ceilings = [holder.hello["ceiling"] for holder in holders if "ceiling" in holder.hello]
    if ceilings:
        outcome.ceiling_gbps = {
            direction: min(ceiling[direction] for ceiling in ceilings)
            for direction in ("evict", "admit")
        }


def take_turns(scenario: Scenario, handles: list[timeshare.Job], jobs: list[list[Rank]],
               handovers: int, gib: float) -> Outcome:  # fmt: skip
    outcome = Outcome(scenario=scenario)
    held = []
    for turn in range(handovers + 1):
        index = turn % 2
        granted = handles[index].acquire()
        ok = all_intact(jobs[index])
        outcome.verified += all(ok)
        outcome.checks += 1
        used = device_memory_by_pid()
        other = [used.get(rank.pid) or 0 for rank in jobs[1 - index]]
        if turn > 0:
            outcome.switch_seconds.append(granted.switch_seconds)
            per_rank = int(gib * 2**30) // len(other)
            if scenario.expect == "stayed":
                held.append(all(count >= per_rank for count in other))
            else:
                held.append(all(count == 0 for count in other))
        memory = ", ".join(f"{count / 2**30:.2f}" for count in other)
        outcome.rows.append([str(turn), f"job-{index}", f"{granted.switch_seconds:.3f}",
                             "ok" if all(ok) else "MISMATCH", f"{memory} GiB"])  # fmt: skip
        handles[index].yield_()
    for handle in handles:
        handle.leave()
    outcome.memory_as_expected = bool(held) and all(held)
    return outcome


def scenario_line(outcome: Outcome, emulated: bool) -> str:
    s = outcome.scenario
    prefix = "emulated_" if emulated else ""
    switch = p50(outcome.switch_seconds)
    fields = [
        f"scenario={s.name}", f"backend={s.backend}", f"ok={str(outcome.ok).lower()}",
        f"handovers={len(outcome.switch_seconds)}", f"verified={outcome.verified}/{outcome.checks}",
        f"memory_{s.expect}={str(outcome.memory_as_expected).lower()}",
        f"ranks_reported={outcome.ranks_reported}", f"switch_p50_s={figure(switch, 3)}",
        f"{prefix}checkpoint_gbps_per_rank_p50={figure(p50(outcome.checkpoint_gbps))}",
        f"{prefix}restore_gbps_per_rank_p50={figure(p50(outcome.restore_gbps))}",
        f"overlap_p50={figure(p50(outcome.overlap))}",
    ]  # fmt: skip
    if s.torch_hooks:
        for direction in ("evict", "admit"):
            rate = p50(outcome.hook_gbps.get(direction, []))
            ceiling = outcome.ceiling_gbps.get(direction)
            fields += [f"hook_{direction}_gbps_p50={figure(rate)}",
                       f"copy_ceiling_{direction}_gbps={figure(ceiling)}",
                       f"hook_{direction}_of_ceiling={figure(ratio(rate, ceiling))}"]  # fmt: skip
    if outcome.error:
        fields.append(f"error={json.dumps(outcome.error)}")
    return " ".join(fields)


def report(outcome: Outcome, gib: float, emulated: bool) -> None:
    s = outcome.scenario
    where = "GPU EMULATOR: not a GPU figure" if emulated else "GPU"
    print(f"\n{s.name}: backend {s.backend}, co-residency {s.co_residency}, "
          f"{gib:g} GiB per job, {RANKS} ranks ({where})")  # fmt: skip
    if outcome.rows:
        print(table(["turn", "job", "switch s", "data", "waiting job's ranks on the device"],
                    outcome.rows))  # fmt: skip
    print(scenario_line(outcome, emulated), flush=True)


def emulator_environment(root: Path, gib: float) -> dict[str, str]:
    """The variables that put a process (and its children) on the GPU
    emulator (built from C with gcc), its state under ``root``; its GPU holds
    two jobs of ``gib`` and the co-residency margin, and more (8 GiB at least)."""
    from timeshare.gpu_check import emulator

    lib_dir = emulator.build(emulator.default_build_dir())
    memory = max(8 << 30, int((2 * gib + 4) * 2**30))
    return emulator.environment(
        lib_dir, root / "state", root / "calls.jsonl", gpu_memory=memory,
        # Only the checkpoint API is logged: a fill or a check is thousands of calls.
        extra={"TIMESHARE_EMULATOR_COPY_RATE": str(EMULATOR_COPY_RATE),
               "TIMESHARE_EMULATOR_LOG_CALLS": "cuCheckpoint"},
    )  # fmt: skip


def on_the_emulator(gib: float) -> None:
    """Run this benchmark again, on the GPU emulator."""
    root = Path(tempfile.mkdtemp(prefix="gpu-switch-emulator-"))
    env = emulator_environment(root, gib)
    env[EMULATED] = "1"
    env[EMULATOR_SCRATCH] = str(root)
    os.execve(sys.executable, [*python_module_command("timeshare.gpu_check.switch"), *sys.argv[1:]],
              {**os.environ, **env})  # fmt: skip


def main() -> None:
    try:
        run(parse_arguments())
    finally:
        scratch = os.environ.get(EMULATOR_SCRATCH)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Device state moved by the CUDA backends.")
    parser.add_argument("--gib", type=float, default=4.0, help="device memory per job")
    parser.add_argument("--handovers", type=int, default=10)
    parser.add_argument("--emulator", action="store_true", help="no GPU: the GPU emulator")
    parser.add_argument("--only", help=f"comma-separated scenarios, of {', '.join(NAMES)}")
    parser.add_argument("--results", type=Path, help="append each scenario's result (JSON lines)")
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(NAMES) if args.only else set()
    if unknown:
        parser.error(f"no scenario {', '.join(sorted(unknown))}; there are {', '.join(NAMES)}")
    return args


def torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> None:
    emulated = os.environ.get(EMULATED) == "1"
    if args.emulator and not emulated:
        on_the_emulator(args.gib)
    wanted = args.only.split(",") if args.only else NAMES
    chosen = [s for s in SCENARIOS if s.name in wanted]
    skipped = [s.name for s in chosen if s.torch_hooks]
    if skipped and (emulated or not torch_cuda()):
        # The hooks scenario needs PyTorch with CUDA (the emulator runs none).
        chosen = [s for s in chosen if not s.torch_hooks]
        reason = "torch has no CUDA here"
        print(f"{', '.join(skipped)}: not measured ({reason})", flush=True)
        for name in skipped:
            write_result(args.results, {"event": "not_measured", "scenario": name,
                                        "reason": reason})  # fmt: skip
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        # The agent records each rank's bytes and seconds (--record).
        stack = LocalStack(Path(scratch), backend=chosen[0].backend if chosen else "cuda")
        try:
            if chosen:
                stack.start_all()
            for scenario in chosen:
                outcome = one_scenario(stack, scenario, args)
                report(outcome, args.gib, emulated)
                failed += not outcome.ok
        finally:
            stack.stop_all()
    sys.exit(1 if failed else 0)


def one_scenario(stack: LocalStack, scenario: Scenario, args: argparse.Namespace) -> Outcome:
    write_result(args.results, {"event": "start", "scenario": scenario.name})
    start = time.monotonic()
    try:
        outcome = run_scenario(stack, scenario, args.gib, args.handovers)
    except Exception as error:  # one scenario's failure is reported; the next runs
        traceback.print_exc()
        outcome = Outcome(scenario=scenario, error=f"{type(error).__name__}: {error}")
    outcome.seconds = time.monotonic() - start
    write_result(args.results, {"event": "finish", "outcome": outcome.model_dump(mode="json")})
    return outcome


def write_result(path: Path | None, entry: dict[str, Any]) -> None:
    if path is not None:
        with path.open("a") as results:
            results.write(json.dumps({**entry, "at": time.time()}) + "\n")


if __name__ == "__main__":
    main()
