"""An llm-d job, run as a process of its own by tests/integration/test_llmd_claims.py.

With ``--client llm-d`` it is llm-d's own Python client (`timeslice`, and
Slime's `RoleLocks` from `timeslice_slime`), installed from
llm-d-incubation/llm-d-rl-time-slicing (pkg/client/python and
pkg/integrations/slime); with ``--client wire`` it sends the same calls with
timeshare's copy of the wire format. Each turn it takes prints one JSON line
(group, job, when it began and ended as the job saw it, how long it
waited); a call that fails prints {"error": ...} and the process exits 3.
Once connected it prints {"ready": true} and waits for a line on its standard
input, so that the test starts its jobs together and they contend.

    python -m tests.llmd_jobs --client llm-d --address A contend --group G --job J
    python -m tests.llmd_jobs --client wire --address A slime --job J --trainer T --sampler S
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any, Protocol

# Slime's synchronous driver, one rollout, as llm-d's fork brackets it: the
# role whose group each phase holds ("both": trainer first, then sampler).
SLIME_STEP = [("generate", "sampler"), ("train", "trainer"), ("weight_sync", "both")]
HOLD_SECONDS = 0.05
ERROR_EXIT = 3


class Locks(Protocol):
    """RoleLocks' interface: one lock per role, trainer before sampler."""

    def acquire(self, role: str) -> None: ...
    def release(self, role: str) -> None: ...
    def close(self) -> None: ...


class Turns(Protocol):
    def acquire(self, group: str) -> int:
        """Milliseconds waited, as the server says."""

    def release(self, group: str) -> None: ...
    def close(self) -> None: ...


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class LlmdTurns:
    """llm-d's TimeSliceOrchestratorClient, one per group as its contract asks."""

    def __init__(self, address: str, job: str) -> None:
        from timeslice import TimeSliceOrchestratorClient

        self._address, self._job = address, job
        self._make = TimeSliceOrchestratorClient
        self._clients: dict[str, Any] = {}

    def _client(self, group: str) -> Any:
        if group not in self._clients:
            self._clients[group] = self._make(self._address, job_id=self._job, group_id=group)
        return self._clients[group]

    def acquire(self, group: str) -> int:
        waited: int = self._client(group).acquire(timeout_sec=60).waited_ms
        return waited

    def release(self, group: str) -> None:
        self._client(group).release()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


class WireTurns:
    """The same calls through timeshare's generated stubs of llm-d's API."""

    def __init__(self, address: str, job: str) -> None:
        import grpc

        from timeshare.v1 import llmd_compat_pb2 as llmd
        from timeshare.v1 import llmd_compat_pb2_grpc as llmd_grpc

        self._llmd, self._job = llmd, job
        self._channel = grpc.insecure_channel(address)
        self._stub = llmd_grpc.TimeSliceOrchestratorServiceStub(self._channel)

    def acquire(self, group: str) -> int:
        request = self._llmd.AcquireRequest(job_id=self._job, group_id=group)
        waited: int = self._stub.Acquire(request, timeout=60).waited_ms
        return waited

    def release(self, group: str) -> None:
        self._stub.Yield(self._llmd.YieldRequest(job_id=self._job, group_id=group), timeout=60)

    def close(self) -> None:
        self._channel.close()


class WireRoleLocks:
    """Roles to groups over WireTurns, in Slime's trainer-first order."""

    def __init__(self, turns: Turns, trainer: str, sampler: str) -> None:
        self._turns, self._groups = turns, {"trainer": trainer, "sampler": sampler}
        self._held: set[str] = set()

    def acquire(self, role: str) -> None:
        if role not in self._held:
            self._turns.acquire(self._groups[role])
            self._held.add(role)

    def release(self, role: str) -> None:
        if role in self._held:
            self._held.discard(role)
            self._turns.release(self._groups[role])

    def close(self) -> None:
        for role in ("sampler", "trainer"):
            self.release(role)
        self._turns.close()


def llmd_role_locks(address: str, job: str, trainer: str, sampler: str) -> Locks:
    """llm-d's RoleLocks, loaded from its file: the package's __init__ imports
    Slime itself (for its callback), which is not installable here."""
    found = importlib.util.find_spec("timeslice_slime")
    if found is None or not found.submodule_search_locations:
        raise ImportError("timeslice_slime is not installed")
    path = Path(next(iter(found.submodule_search_locations))) / "locks.py"
    spec = importlib.util.spec_from_file_location("timeslice_slime_locks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    locks: Locks = module.RoleLocks(job, address, trainer, sampler)
    return locks


def wait_for_the_start() -> None:
    say(ready=True)
    sys.stdin.readline()


def contend(args: argparse.Namespace) -> None:
    turns: Turns = (LlmdTurns if args.client == "llm-d" else WireTurns)(args.address, args.job)
    wait_for_the_start()
    try:
        for _ in range(args.turns):
            waited = turns.acquire(args.group)
            began = time.time()
            time.sleep(HOLD_SECONDS)
            say(group=args.group, job=args.job, began=began, ended=time.time(), waited_ms=waited)
            turns.release(args.group)
            time.sleep(HOLD_SECONDS / 2)  # CPU work between GPU phases
    finally:
        turns.close()


def slime(args: argparse.Namespace) -> None:
    if args.client == "llm-d":
        locks = llmd_role_locks(args.address, args.job, args.trainer, args.sampler)
    else:
        locks = WireRoleLocks(WireTurns(args.address, args.job), args.trainer, args.sampler)
    groups = {"trainer": args.trainer, "sampler": args.sampler}
    wait_for_the_start()
    try:
        for _ in range(args.steps):
            for _phase, role in SLIME_STEP:
                roles = ["trainer", "sampler"] if role == "both" else [role]
                for held in roles:
                    locks.acquire(held)
                began = time.time()
                time.sleep(HOLD_SECONDS)
                ended = time.time()
                for held in reversed(roles):
                    say(group=groups[held], job=args.job, began=began, ended=ended)
                    locks.release(held)
    finally:
        locks.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["llm-d", "wire"], required=True)
    parser.add_argument("--address", required=True)
    modes = parser.add_subparsers(dest="mode", required=True)
    one = modes.add_parser("contend")
    one.add_argument("--group", required=True)
    one.add_argument("--job", required=True)
    one.add_argument("--turns", type=int, default=2)
    two = modes.add_parser("slime")
    two.add_argument("--job", required=True)
    two.add_argument("--trainer", required=True)
    two.add_argument("--sampler", required=True)
    two.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    try:
        (contend if args.mode == "contend" else slime)(args)
    except Exception as error:  # reported to the test, which judges it
        say(error=f"{type(error).__name__}: {error}")
        return ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
