"""Run a training command under a coordinator that takes its turns for it.

    python -m timeshare.integrations.coordinator --group grpo-pair --job job-a -- \\
        python train.py ...

The coordinator joins the group, starts the command with ``TIMESHARE_TURNS_FD``
naming one end of a socket pair, and serves the command's turn requests
(one JSON object per line each way) until the command exits; then it gives the
last turn back and leaves. The command's process registers with the node's
agent and may be stopped whole between its turns (the ``freeze`` backends):
the coordinator is never registered, so it keeps heartbeating, asks for the
next turn and runs the work done with the turn given away (``outside``: the
reward functions, imported by name), while the GPU process waits.

    worker -> coordinator   {"op": "hello"}                  -> {"ok": true, "group": G, "job": J}
                            {"op": "acquire", "phase": P}    -> {"ok": true}
                            {"op": "release"}                -> {"ok": true}
                            {"op": "handover", "phase": P}   -> {"ok": true}
                            {"op": "outside", "call": "module:function",
                             "kwargs": {...}, "then": P}     -> {"ok": true, "result": ...}
    any failure             -> {"ok": false, "code": "ABORTED", "error": "..."}
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from timeshare.credentials import JOB_TOKEN_ENV
from timeshare.errors import TimeshareError, class_for_code
from timeshare.integrations.turns import ENV_GROUP, ENV_JOB, ENV_TURNS_FD, JobTurns, Result, Turns
from timeshare.registration import register_process

if TYPE_CHECKING:
    from timeshare.hooks import HookServer, WorkloadHooks

Op = Literal["hello", "acquire", "release", "handover", "outside"]


class TurnRequest(BaseModel):
    op: Op
    phase: str = ""
    call: str = ""
    kwargs: dict[str, Any] = {}
    then: str = ""


class TurnReply(BaseModel):
    ok: bool
    code: str = ""
    error: str = ""
    result: Any = None
    group: str = ""
    job: str = ""


class CoordinatorError(RuntimeError):
    """The coordinator could not do what the worker asked (not a timeshare refusal)."""


def call_name(call: Callable[..., Any]) -> str:
    """``module:qualname`` of a function the coordinator can import; a clear
    error for one it cannot (a lambda, a closure, a function of __main__)."""
    module = getattr(call, "__module__", None)
    qualname = getattr(call, "__qualname__", "")
    if not module or module == "__main__" or not qualname or "<" in qualname:
        raise ValueError(
            f"{call!r} runs in the coordinator process, which imports it by name: make it a "
            "module-level function of an importable module (not a lambda, a closure or a "
            "function of the script being run)"
        )
    return f"{module}:{qualname}"


def resolve_call(name: str) -> Callable[..., Any]:
    module_name, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise CoordinatorError(f"{name} is not callable")
    call: Callable[..., Any] = target
    return call


class CoordinatedTurns(Turns):
    """The worker's side: every turn request goes to the coordinator, and a
    handover or an ``outside`` is one request, so that a worker stopped just
    after giving its turn back has nothing left to ask for."""

    def __init__(self, conn: socket.socket) -> None:
        super().__init__()
        self._conn = conn
        self._lines = conn.makefile("rb")
        self._lock = threading.Lock()
        self._holding = False
        self._hooks: HookServer | None = None
        hello = self._ask(TurnRequest(op="hello"))
        self.group, self.job = hello.group, hello.job

    @classmethod
    def from_env(cls) -> CoordinatedTurns:
        fd = int(os.environ[ENV_TURNS_FD])
        return cls(socket.socket(fileno=fd))

    @property
    def holding(self) -> bool:
        return self._holding

    @property
    def remote(self) -> bool:
        return True

    def _acquire(self, phase: str) -> None:
        self._ask(TurnRequest(op="acquire", phase=phase))
        self._holding = True

    def _release(self) -> None:
        self._ask(TurnRequest(op="release"))
        self._holding = False

    def handover(self, phase: str) -> None:
        if not self._holding:
            self.acquire(phase)
            return
        self._holding = False
        self._ask(TurnRequest(op="handover", phase=phase))
        self._holding = True
        self.phase = phase

    def outside(self, call: Callable[..., Result], kwargs: dict[str, Any], then: str) -> Result:
        request = TurnRequest(op="outside", call=call_name(call), kwargs=kwargs, then=then)
        self._holding = False
        result: Result = self._ask(request).result
        self._holding = True
        self.phase = then
        return result

    def _enroll_now(self, hooks: WorkloadHooks | None) -> None:
        if hooks is None:
            register_process(self.group, self.job)
            return
        from timeshare.hooks import serve_hooks

        self._hooks = serve_hooks(hooks, self.group, self.job)

    def close(self) -> None:
        # The coordinator gives the last turn back once this process has
        # exited: until then it may still use the GPU (a final save).
        if self._hooks is not None:
            self._hooks.close()
            self._hooks = None
        self._lines.close()
        self._conn.close()

    def _ask(self, request: TurnRequest) -> TurnReply:
        with self._lock:
            self._conn.sendall(request.model_dump_json().encode() + b"\n")
            line = self._lines.readline()
        if not line:
            raise CoordinatorError("the coordinator hung up")
        reply = TurnReply.model_validate_json(line)
        if not reply.ok:
            refusal = class_for_code(reply.code)
            if refusal is not None:
                raise refusal(reply.error)
            raise CoordinatorError(reply.error)
        return reply


class Coordinator:
    """The coordinator's side: answers one worker's requests with the job's turns."""

    def __init__(self, turns: JobTurns) -> None:
        self.turns = turns

    def serve(self, conn: socket.socket) -> None:
        """Answer requests until the worker hangs up."""
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                conn.sendall(self.answer(line).model_dump_json().encode() + b"\n")

    def answer(self, line: bytes) -> TurnReply:
        try:
            request = TurnRequest.model_validate_json(line)
            return self._do(request)
        except TimeshareError as error:
            return TurnReply(ok=False, code=error.code, error=error.message)
        except Exception as error:  # the worker raises it with this message
            return TurnReply(ok=False, error=f"{type(error).__name__}: {error}")

    def _do(self, request: TurnRequest) -> TurnReply:
        turns = self.turns
        if request.op == "hello":
            return TurnReply(ok=True, group=turns.job.group, job=turns.job.name)
        if request.op == "acquire":
            turns.acquire(request.phase)
        elif request.op == "release":
            turns.release()
        elif request.op == "handover":
            turns.handover(request.phase)
        else:
            result = turns.outside(resolve_call(request.call), request.kwargs, request.then)
            return TurnReply(ok=True, result=result)
        return TurnReply(ok=True)


def run_coordinated(
    command: Sequence[str],
    group: str | None = None,
    job: str | None = None,
    address: str | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, JobTurns]:
    """Run ``command`` under a coordinator of ``job`` in ``group``; returns its
    exit status and the turns (their records say when each was held)."""
    turns = JobTurns.join(group, job, address)
    ours, theirs = socket.socketpair()
    child_env = dict(os.environ if env is None else env)
    # The job's token: the command's GPU processes present it when they
    # register or serve hooks (timeshare.credentials).
    child_env.update(
        {
            ENV_TURNS_FD: str(theirs.fileno()),
            ENV_GROUP: turns.job.group,
            ENV_JOB: turns.job.name,
            JOB_TOKEN_ENV: turns.job.token,
        }
    )
    try:
        process = subprocess.Popen(list(command), env=child_env, pass_fds=[theirs.fileno()])
    except OSError:
        turns.close()
        raise
    theirs.close()
    try:
        Coordinator(turns).serve(ours)
        # Still inside the last turn: the worker may use the GPU until it exits.
        returncode = process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        turns.close()
    return returncode, turns


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m timeshare.integrations.coordinator",
        description="Run a training command whose turns this process takes for it.",
    )
    parser.add_argument("--group", help="the group (env TIMESHARE_GROUP)")
    parser.add_argument("--job", help="the job (env TIMESHARE_JOB)")
    parser.add_argument("--address", help="timeshare gateway (env TIMESHARE_ADDRESS)")
    parser.add_argument("--turns-out", type=Path, help="write the turns held here (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    try:
        returncode, turns = run_coordinated(command, args.group, args.job, args.address)
    except TimeshareError as error:
        print(f"coordinator: {error}", file=sys.stderr)
        sys.exit(2)
    if args.turns_out is not None:
        records = [record.__dict__ for record in turns.records]
        args.turns_out.write_text(json.dumps({"job": turns.job.name, "turns": records}))
    sys.exit(returncode)


if __name__ == "__main__":
    main()
