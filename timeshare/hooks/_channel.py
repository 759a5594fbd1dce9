"""The client side of the hook protocol (timeshare.hooks.protocol): a daemon
thread that holds this process's connection to its node agent, answers the
agent's calls, and reconnects when the agent restarts."""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, BinaryIO

from pydantic import ValidationError

from timeshare.agent_socket import agent_socket
from timeshare.errors import TimeshareError
from timeshare.hooks.protocol import MAX_ERROR_CHARS, EvictMode, HookCall, HookHello, HookReply
from timeshare.registration import open_agent_connection, presented_token

if TYPE_CHECKING:
    from timeshare.hooks import WorkloadHooks

log = logging.getLogger("timeshare.hooks")
RECONNECT_FIRST_SECONDS = 0.2
RECONNECT_MAX_SECONDS = 5.0


class HookServer:
    """This process's hooks, served to the node agent until ``close()``."""

    def __init__(
        self, hooks: WorkloadHooks, hello: HookHello, path: str, token: str | None = None
    ) -> None:
        self.hooks = hooks
        self.hello = hello
        self.path = path
        self._token = token
        # Where the job stands by the last hook that succeeded: a call that
        # would repeat it is answered without calling the hook again.
        self.evicted = False
        self.pid = 0
        self._stop = threading.Event()
        self._socket: socket.socket | None = None
        self._lines: BinaryIO | None = None
        self._guard = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"timeshare-hooks-{hello.job}", daemon=True
        )

    def start(self) -> HookServer:
        """Connect at once, so that a refusal reaches the caller; serve in the background."""
        self._lines = self._connect()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self._guard:
            if self._socket is not None:
                # Wakes the hook thread from its blocking read.
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def __enter__(self) -> HookServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> BinaryIO:
        # Looked up at every connection: a job that joined again in this
        # process has a new token, and the old one no longer admits it.
        token = presented_token(self.hello.group, self.hello.job, self._token)
        hello = self.hello.model_copy(update={"evicted": self.evicted, "token": token})
        conn, lines, reply = open_agent_connection(self.path, hello.model_dump())
        with self._guard:
            self._socket = conn
        self.pid = int(reply["pid"])
        return lines

    def _run(self) -> None:
        delay = RECONNECT_FIRST_SECONDS
        while not self._stop.is_set():
            lines, self._lines = self._lines, None
            if lines is None:
                try:
                    lines = self._connect()
                    log.info("hooks of %s/%s: reconnected", self.hello.group, self.hello.job)
                    delay = RECONNECT_FIRST_SECONDS
                except TimeshareError as error:
                    log.warning("hooks of %s/%s: %s", self.hello.group, self.hello.job, error)
                    self._stop.wait(delay)
                    delay = min(RECONNECT_MAX_SECONDS, delay * 2)
                    continue
            self._serve(lines)

    def _serve(self, lines: BinaryIO) -> None:
        with self._guard:
            conn = self._socket
        assert conn is not None
        try:
            for line in lines:
                try:
                    call = HookCall.model_validate_json(line)
                except ValidationError as error:
                    log.warning("hooks: ignoring a malformed call from the agent: %s", error)
                    continue
                conn.sendall(self._answer(call).model_dump_json().encode() + b"\n")
        except OSError:
            pass  # the agent went away: reconnect
        finally:
            with self._guard:
                self._socket = None
            lines.close()
            conn.close()

    def _answer(self, call: HookCall) -> HookReply:
        evict = call.call == "evict"
        if evict == self.evicted:
            return HookReply(id=call.id, ok=True)
        try:
            if evict:
                self.hooks.evict(call.mode or self.hello.mode)
            else:
                self.hooks.admit()
        except Exception as error:  # reported to the agent, which fails the switch
            log.exception("hooks: %s failed", call.call)
            message = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
            return HookReply(id=call.id, ok=False, error=message)
        self.evicted = evict
        return HookReply(id=call.id, ok=True)


def serve_hooks(
    hooks: WorkloadHooks,
    group: str,
    job: str,
    socket_path: str | None = None,
    *,
    mode: EvictMode = "offload",
    register: bool = True,
    token: str | None = None,
) -> HookServer:
    """Serve ``hooks`` for ``job`` of ``group`` to this node's agent from a
    background thread; returns the running server (``close()`` withdraws them).

    ``mode`` is how this process wants to be evicted. ``register`` also
    registers the process with the agent, as `register_process` does, so the
    checkpointing layers (cuda, freeze) act on it; leave it off for a helper
    process that only drives an engine running elsewhere (an HTTP server).
    ``token`` is the job's token; by default the one a Join in this process
    got, else TIMESHARE_JOB_TOKEN. The agent refuses hooks without it.
    """
    hello = HookHello(group=group, job=job, mode=mode, register_process=register)
    return HookServer(hooks, hello, agent_socket(socket_path), token).start()
