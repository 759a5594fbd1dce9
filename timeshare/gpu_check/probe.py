"""The driver's answers on this host: the H200's readings again, raw driver copy rates.

The driver probe of the GPU check: the readings of docs/facts.md taken
again on this host, plus the raw driver rates the transparent path is judged
against. Writes probe.json and probe.md under --out (after every section, so
that a probe stopped by its time limit leaves what it read).

- the driver API, called from this process: a CUDA process's restore thread,
  lock (timeoutMs 5000), checkpoint, restore, unlock, each timed, with the
  state and NVML's memory for the process after it and the data read back; a
  process that never touched CUDA, a pid that does not exist, and a caller
  that never called cuInit asked for a restore thread;
- the `cuda-checkpoint` utility (when on PATH): the same round trip;
- raw rates: the ranks' checkpoint and restore timed directly on the driver,
  one rank alone and all ranks at once, bytes as NVML shows them (what the
  agent's record counts), so that timeshare.gpu_check.main can set each backend's
  per-rank rate against the driver's on the same bytes (driver_ratio);
- a restore when the device is full: a checkpointed process restored while
  another holds the device, then again once it is free (NVIDIA/cuda-checkpoint#44:
  on driver 580 such a process could not be restored again).

Readings where docs/facts.md says what the H200 answered are marked as the same
or different. Nothing is judged here but the round trips' success.

    python -m timeshare.gpu_check.probe --out DIR [--bytes N] [--ranks 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from timeshare.activities.backends.gpus import (
    NoGpus,
    device_memory,
    device_memory_by_pid,
    gpu_inventory,
)
from timeshare.gpu_check.switch import CUDA_RANK, Rank
from timeshare.self_command import python_module_command

# What the H200 answered (docs/facts.md), where a probe here can differ.
FACTS = {
    "restore thread of a process without CUDA": "CUDA_ERROR_NOT_INITIALIZED",
    "state after restore": "CU_PROCESS_STATE_LOCKED",
    "utility, restore thread of a process without CUDA": "Could not find restore thread",
}
LOCK_TIMEOUT_MS = 5000
FILLER = r"""
import sys
from cuda.bindings import driver as d
d.cuInit(0)
_, device = d.cuDeviceGet(0)
_, context = d.cuDevicePrimaryCtxRetain(device)
d.cuCtxSetCurrent(context)
_, free, total = d.cuMemGetInfo()
result, pointer = d.cuMemAlloc(max(1, free - int(sys.argv[1])))
print(getattr(result, "name", result), free, flush=True)
sys.stdin.readline()
"""
NO_INIT = r"""
import sys
from cuda.bindings import driver as d
result, tid = d.cuCheckpointProcessGetRestoreThreadId(int(sys.argv[1]))
print(getattr(result, "name", result))
"""


class Reading(BaseModel):
    section: str
    call: str
    target: str
    answer: str
    seconds: float | None = None
    # What docs/facts.md read on the H200, where it read this.
    facts: str | None = None

    @property
    def as_facts(self) -> str:
        if self.facts is None:
            return ""
        return "as on the H200" if self.facts in self.answer else f"differs: H200 {self.facts}"


class ProbeReport(BaseModel):
    emulated: bool
    environment: dict[str, str] = Field(default_factory=dict)
    readings: list[Reading] = Field(default_factory=list)
    # GB/s per rank, medians: {"solo": {"checkpoint": x, "restore": y}, "parallel": ...}
    rates: dict[str, dict[str, float]] = Field(default_factory=dict)
    failures: list[str] = Field(default_factory=list)
    seconds: float = 0.0


class Probe:
    def __init__(self, out: Path, emulated: bool) -> None:
        from cuda.bindings import driver

        self.driver = driver
        self.out = out
        self.report = ProbeReport(emulated=emulated)
        self.started = time.monotonic()

    # -- bookkeeping -------------------------------------------------------------

    def read(self, section: str, call: str, target: str, answer: str,
             seconds: float | None = None, facts: str | None = None) -> None:  # fmt: skip
        reading = Reading(section=section, call=call, target=target, answer=answer,
                          seconds=seconds, facts=facts)  # fmt: skip
        self.report.readings.append(reading)
        self.save()

    def fail(self, what: str) -> None:
        self.report.failures.append(what)
        self.save()

    def save(self) -> None:
        self.report.seconds = time.monotonic() - self.started
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "probe.json").write_text(self.report.model_dump_json(indent=2))
        (self.out / "probe.md").write_text(markdown(self.report))

    # -- the driver --------------------------------------------------------------

    def state(self, pid: int) -> str:
        result, state = self.driver.cuCheckpointProcessGetState(pid)
        return name(state) if int(result) == 0 else name(result)

    def act(self, action: str, pid: int) -> tuple[str, float]:
        d = self.driver
        arguments = {
            "lock": d.CUcheckpointLockArgs,
            "checkpoint": d.CUcheckpointCheckpointArgs,
            "restore": d.CUcheckpointRestoreArgs,
            "unlock": d.CUcheckpointUnlockArgs,
        }
        args = arguments[action]()
        if action == "lock":
            args.timeoutMs = LOCK_TIMEOUT_MS
        function = getattr(d, f"cuCheckpointProcess{action.capitalize()}")
        start = time.perf_counter()
        (result,) = function(pid, args)
        return name(result), time.perf_counter() - start

    def restore_tid(self, pid: int) -> str:
        result, tid = self.driver.cuCheckpointProcessGetRestoreThreadId(pid)
        return f"{name(result)}, tid {tid}" if int(result) == 0 else f"{name(result)}, tid None"

    # -- sections ----------------------------------------------------------------

    def environment(self) -> None:
        env = self.report.environment
        env["python"] = platform.python_version()
        env["kernel"] = platform.release()
        env["user"] = "root" if os.geteuid() == 0 else str(os.geteuid())
        env["cuda-bindings"] = package_version("cuda-bindings")
        env["pynvml"] = package_version("pynvml")
        result, driver_version = self.driver.cuDriverGetVersion()
        env["cuDriverGetVersion"] = str(driver_version) if int(result) == 0 else name(result)
        try:
            for info in gpu_inventory():
                env[f"gpu{info.index}"] = info.describe()
        except NoGpus as error:
            env["nvml"] = str(error)
        for device, memory in device_memory().items():
            env[f"{device} memory"] = f"{memory.total_bytes / 2**20:.0f} MiB"
        utility = shutil.which("cuda-checkpoint")
        env["cuda-checkpoint"] = utility or "not on PATH"
        if utility:
            helped = run([utility, "--help"])
            found = re.search(r"Version (\S+)", helped.stdout)
            env["cuda-checkpoint version"] = found.group(1).rstrip(".") if found else "?"
        self.save()

    def driver_round_trip(self, rank: Rank) -> None:
        section, target = "driver API", f"a CUDA process holding {held(rank.pid)}"
        self.read(section, "cuCheckpointProcessGetRestoreThreadId",
                  "a Python process that never touched CUDA", self.restore_tid(rank.loader),
                  facts=FACTS["restore thread of a process without CUDA"])  # fmt: skip
        self.read(section, "cuCheckpointProcessGetState", "a Python process that never "
                  "touched CUDA", self.state(rank.loader))  # fmt: skip
        self.read(section, "cuCheckpointProcessGetRestoreThreadId", "a pid that does not exist",
                  self.restore_tid(missing_pid()))  # fmt: skip
        no_init = run([sys.executable, "-c", NO_INIT, str(rank.pid)]).stdout.strip()
        self.read(section, "cuCheckpointProcessGetRestoreThreadId",
                  "a CUDA process, from a caller that never called cuInit", no_init)  # fmt: skip
        self.read(section, "cuCheckpointProcessGetRestoreThreadId", target,
                  self.restore_tid(rank.pid))  # fmt: skip
        for action in ("lock", "checkpoint", "restore", "unlock"):
            result, seconds = self.act(action, rank.pid)
            after = f"{result}; state {self.state(rank.pid)}; NVML {held(rank.pid)}"
            self.read(
                section,
                f"cuCheckpointProcess{action.capitalize()}",
                target,
                after,
                seconds,
                facts=FACTS["state after restore"] if action == "restore" else None,
            )
            if result != "CUDA_SUCCESS":
                self.fail(f"driver {action} of process {rank.pid}: {result}")
                return
        self.intact(section, rank)

    def utility_round_trip(self, rank: Rank) -> None:
        utility = shutil.which("cuda-checkpoint")
        if utility is None:
            self.read("utility", "cuda-checkpoint", "-", "not on PATH: not read")
            return
        section, target = "utility", f"a CUDA process holding {held(rank.pid)}"

        def ask(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
            start = time.perf_counter()
            done = run([utility, *args])
            return done, time.perf_counter() - start

        done, seconds = ask("--get-restore-tid", "--pid", str(rank.loader))
        self.read(section, "--get-restore-tid", "a process without CUDA", answered(done), seconds,
                  facts=FACTS["utility, restore thread of a process without CUDA"])  # fmt: skip
        done, seconds = ask("--get-restore-tid", "--pid", str(rank.pid))
        self.read(section, "--get-restore-tid", target, answered(done), seconds)
        for action in ("lock", "checkpoint", "restore", "unlock"):
            done, seconds = ask("--action", action, "--pid", str(rank.pid))
            state, _ = ask("--get-state", "--pid", str(rank.pid))
            self.read(section, f"--action {action}", target,
                      f"{answered(done)}; --get-state {state.stdout.strip()}; "
                      f"NVML {held(rank.pid)}", seconds)  # fmt: skip
            if done.returncode != 0:
                self.fail(f"utility {action} of process {rank.pid}: {answered(done)}")
                return
        self.intact(section, rank)

    def raw_rates(self, ranks: list[Rank], repeats: int) -> None:
        """Each rank's checkpoint and restore timed on the driver directly:
        one rank alone, then all at once (as a job's ranks move)."""
        for label, chosen in (("solo", ranks[:1]), ("parallel", ranks)):
            rates: dict[str, list[float]] = {"checkpoint": [], "restore": []}
            walls: dict[str, list[float]] = {"checkpoint": [], "restore": []}
            for _ in range(repeats):
                cycle = self.cycle([rank.pid for rank in chosen])
                if cycle is None:
                    return
                for move, (per_rank, wall, total) in cycle.items():
                    rates[move] += per_rank
                    walls[move].append(total / wall / 1e9)
            self.report.rates[label] = {
                **{move: statistics.median(values) for move, values in rates.items()},
                **{f"{move}_all_ranks": statistics.median(v) for move, v in walls.items()},
            }
            summary = ", ".join(f"{k} {v:.2f} GB/s" for k, v in self.report.rates[label].items())
            self.read("raw rates", "lock, checkpoint, restore, unlock",
                      f"{len(chosen)} rank(s) of {held(chosen[0].pid)} at once, "
                      f"{repeats} times", summary)  # fmt: skip
        for rank in ranks:
            self.intact("raw rates", rank)

    def cycle(self, pids: list[int]) -> dict[str, tuple[list[float], float, int]] | None:
        """One lock/checkpoint/restore/unlock of ``pids``, each phase at once:
        per move, each rank's GB/s, the phase's wall seconds and its bytes."""
        before = device_memory_by_pid()
        found: dict[str, tuple[list[float], float, int]] = {}
        with ThreadPoolExecutor(len(pids)) as pool:
            for action in ("lock", "checkpoint", "restore", "unlock"):
                start = time.perf_counter()
                outcomes = list(pool.map(lambda pid, a=action: self.act(a, pid), pids))
                wall = time.perf_counter() - start
                failed = [f"{pid}: {r}" for pid, (r, _) in zip(pids, outcomes, strict=True)
                          if r != "CUDA_SUCCESS"]  # fmt: skip
                if failed:
                    self.fail(f"raw {action}: {'; '.join(failed)}")
                    return None
                if action in ("checkpoint", "restore"):
                    memory = before if action == "checkpoint" else device_memory_by_pid()
                    counts = [memory.get(pid) or 0 for pid in pids]
                    rates = [count / seconds / 1e9 for count, (_, seconds)
                             in zip(counts, outcomes, strict=True)]  # fmt: skip
                    found[action] = (rates, wall, sum(counts))
        return found

    def full_device(self, rank: Rank) -> None:
        """A restore while another process holds the device, then again."""
        section, target = "device full", f"a checkpointed process of {held(rank.pid)}"
        for action in ("lock", "checkpoint"):
            result, _ = self.act(action, rank.pid)
            if result != "CUDA_SUCCESS":
                self.fail(f"device full: {action}: {result}")
                return
        leave = rank_bytes(rank) // 2
        filler = subprocess.Popen([sys.executable, "-c", FILLER, str(leave)], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        try:
            assert filler.stdout is not None and filler.stdin is not None
            allocated = filler.stdout.readline().split()
            self.read(section, "cuMemAlloc (another process)", "all but half the process's "
                      "bytes", allocated[0] if allocated else "the filler exited")  # fmt: skip
            result, seconds = self.act("restore", rank.pid)
            self.read(section, "cuCheckpointProcessRestore", target,
                      f"{result}; state {self.state(rank.pid)}", seconds)  # fmt: skip
            filler.stdin.close()
            filler.wait(60)
        finally:
            filler.kill()
        result, seconds = self.act("restore", rank.pid)
        self.read(section, "cuCheckpointProcessRestore", f"{target}, once the device is free",
                  f"{result}; state {self.state(rank.pid)}", seconds)  # fmt: skip
        if self.state(rank.pid) == "CU_PROCESS_STATE_LOCKED":
            result, seconds = self.act("unlock", rank.pid)
            self.read(section, "cuCheckpointProcessUnlock", target, result, seconds)
            self.intact(section, rank, judged=False)

    def intact(self, section: str, rank: Rank, judged: bool = True) -> None:
        answer = within(30.0, lambda: "intact" if all_intact_one(rank) else "CORRUPT")
        self.read(section, "data read back", f"process {rank.pid}", answer)
        if judged and answer != "intact":
            self.fail(f"{section}: the data of process {rank.pid} read back {answer}")


def all_intact_one(rank: Rank) -> bool:
    rank.ask("checksum")
    return int(rank.read()["checksum"]) == rank.expected


def within(seconds: float, call: Callable[[], str]) -> str:
    """The call's answer, or a note that it did not answer in time (a process
    left checkpointed blocks its CUDA calls)."""
    answer: list[str] = []
    thread = threading.Thread(target=lambda: answer.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    return answer[0] if answer else f"no answer within {seconds:g} s"


def name(value: Any) -> str:
    return str(getattr(value, "name", value))


def held(pid: int) -> str:
    count = device_memory_by_pid().get(pid)
    return "none" if count is None else f"{count / 2**20:.0f} MiB"


def rank_bytes(rank: Rank) -> int:
    return int(rank.hello.get("bytes", 0))


def answered(done: subprocess.CompletedProcess[str]) -> str:
    said = (done.stdout.strip() or done.stderr.strip())[:200]
    return f"exit {done.returncode}, {said!r}"


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def package_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def missing_pid() -> int:
    """A pid no process has (below pid_max, so that the call is well formed)."""
    limit = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(limit - 1, 1, -1) if not Path(f"/proc/{pid}").exists())


def markdown(report: ProbeReport) -> str:
    where = "the GPU EMULATOR (not a GPU reading)" if report.emulated else "this GPU host"
    lines = [f"# Driver probe on {where}", "", "| reading | value |", "| --- | --- |"]
    lines += [f"| {key} | {value} |" for key, value in report.environment.items()]
    section = None
    for reading in report.readings:
        if reading.section != section:
            section = reading.section
            lines += ["", f"## {section}", "", "| call | target | answer | seconds | vs H200 |",
                      "| --- | --- | --- | --- | --- |"]  # fmt: skip
        seconds = "" if reading.seconds is None else f"{reading.seconds:.3f}"
        lines.append(f"| `{reading.call}` | {reading.target} | {reading.answer} | {seconds} "
                     f"| {reading.as_facts} |")  # fmt: skip
    if report.failures:
        lines += ["", "## Failures", "", *[f"- {failure}" for failure in report.failures]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="Read the driver's answers on this host.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bytes", type=int, default=2 * 2**30, help="device bytes per rank")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--emulated", action="store_true", help="label the readings emulated")
    args = parser.parse_args()
    probe = Probe(args.out, args.emulated)
    (result,) = probe.driver.cuInit(0)
    if int(result) != 0:
        raise SystemExit(f"gpu_probe: cuInit failed: {name(result)}; is the NVIDIA driver loaded?")
    probe.environment()
    ranks: list[Rank] = []
    try:
        ranks = [Rank([*python_module_command(CUDA_RANK), f"--bytes={args.bytes}",
                       f"--seed={100 + index}"]) for index in range(args.ranks)]  # fmt: skip
        for rank in ranks:
            rank.hello["bytes"] = args.bytes
        probe.driver_round_trip(ranks[0])
        probe.utility_round_trip(ranks[0])
        probe.raw_rates(ranks, args.repeats)
        probe.full_device(ranks[-1])
    finally:
        for rank in ranks:
            rank.stop()
        probe.save()
    rates = probe.report.rates
    figures = " ".join(
        f"raw_{move}_gbps_{label}={value:.2f}"
        for label, moves in rates.items()
        for move, value in moves.items()
    )
    state = "failed" if probe.report.failures else "ok"
    print(f"probe={state} readings={len(probe.report.readings)} {figures}".strip(), flush=True)
    sys.exit(1 if probe.report.failures else 0)


if __name__ == "__main__":
    main()
