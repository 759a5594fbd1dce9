"""A fake inference engine for hook tests: an HTTP server in a thread that
answers like vLLM's sleep API and SGLang's memory occupation API, recording
every request and when it came. It can be told to fail or hang on a path.
Also FakeLLM, an in-process stand-in for vllm.LLM's sleep calls.

Behaviour written from the engines' own source (no code taken from them):
- vLLM (vllm-project/vllm): POST /sleep?level=&mode= (vllm/entrypoints/serve/
  sleep/api_router.py) calls ``sleep(level, mode)``, whose ``PauseMode``
  (vllm/v1/engine/__init__.py) is "abort" by default (in-flight requests end
  at once) or "wait" (they finish first); GET /version answers
  {"version": VLLM_VERSION}. Before 0.17.0 (vllm-project/vllm#34528 added the mode) the
  server ignored ``mode``: ``version`` below picks which engine this is.
- SGLang (sgl-project/sglang, python/sglang/srt/): POST /pause_generation
  takes ``{"mode": "abort" | "retract" | "in_place"}`` (managers/io_struct.py,
  ``PauseGenerationReqInput``, default "abort"); versions up to 0.5.5 took no
  body and aborted every request. "retract" moves running requests back to
  the queue; /continue_generation lets them go on. /release_memory_occupation
  asserts that no request is running (managers/scheduler_update_weights_mixin.py)
  and without tags releases ``GPU_MEMORY_ALL_TYPES`` (constants.py: kv_cache,
  weights, cuda_graph); /resume_memory_occupation removes each tag from the
  released set, so resuming one that is not released fails. GET
  /get_server_info includes "version"."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel

SGLANG_ALL_TYPES = ("kv_cache", "weights", "cuda_graph")


class EngineRequest(BaseModel):
    method: str
    path: str
    body: Any = None
    at: float


class EngineRefusal(Exception):
    """What the engine answers with an error status."""


class FakeEngine:
    def __init__(self, version: str = "0.17.0") -> None:
        self.version = version
        self.requests: list[EngineRequest] = []
        self.sleeping = False
        # Requests the engine is generating; what became of the others.
        self.running = 0
        self.retracted = 0
        self.finished = 0
        self.aborted = 0
        self.paused = False
        # SGLang: the memory types released now.
        self.released: set[str] = set()
        # path (without query) -> (status, message) to answer instead.
        self.failures: dict[str, tuple[int, str]] = {}
        self.hang_on: set[str] = set()
        self.unhung = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def paths(self) -> list[str]:
        """The state-changing calls (POST), in order; reads are left out."""
        return [r.path for r in self.posts()]

    def posts(self) -> list[EngineRequest]:
        return [r for r in self.requests if r.method == "POST"]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self._answer("POST")

            def do_GET(self) -> None:
                self._answer("GET")

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                engine.requests.append(
                    EngineRequest(method=method, path=self.path, body=body, at=time.time())
                )
                route = urlsplit(self.path).path
                query = parse_qs(urlsplit(self.path).query)
                if route in engine.hang_on:
                    engine.unhung.wait(60)
                status, reply = engine.failures.get(route, (200, ""))
                if status == 200:
                    try:
                        reply = json.dumps(engine._state_change(route, query, body))
                    except EngineRefusal as refusal:
                        status, reply = 500, str(refusal)
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply.encode())

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler

    def _release(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.version.split("."))

    def _state_change(self, route: str, query: dict[str, list[str]], body: Any) -> Any:
        if route == "/version":
            return {"version": self.version}
        if route == "/get_server_info":
            return {"version": self.version, "model_path": "/models/fake"}
        if route == "/is_sleeping":
            return {"is_sleeping": self.sleeping}
        if route == "/sleep":
            mode = query.get("mode", ["abort"])[0] if self._release() >= (0, 17) else "abort"
            self._settle_running("finish" if mode == "wait" else "abort")
            self.sleeping = True
        elif route == "/wake_up":
            self.sleeping = False
        elif route == "/pause_generation":
            given = body.get("mode", "abort") if isinstance(body, dict) else "abort"
            mode = given if self._release() >= (0, 5, 6) else "abort"
            self._settle_running("retract" if mode == "retract" else "abort")
            self.paused = True
        elif route == "/continue_generation":
            self.paused = False
            self.running, self.retracted = self.running + self.retracted, 0
        elif route == "/release_memory_occupation":
            if self.running:
                raise EngineRefusal(
                    "release_memory_occupation should be called only when no ongoing request."
                )
            tags = (body or {}).get("tags") or list(SGLANG_ALL_TYPES)
            self.released |= set(tags)
            self.sleeping = True
        elif route == "/resume_memory_occupation":
            tags = (body or {}).get("tags") or list(SGLANG_ALL_TYPES)
            missing = [tag for tag in tags if tag not in self.released]
            if missing:
                raise EngineRefusal(f"KeyError: {missing[0]!r}")
            self.released -= set(tags)
            self.sleeping = bool(self.released)
        return {}

    def _settle_running(self, how: str) -> None:
        if how == "finish":
            self.finished += self.running
        elif how == "retract":
            self.retracted += self.running
        else:
            self.aborted += self.running
        self.running = 0


@contextmanager
def running_engine(version: str = "0.17.0") -> Iterator[FakeEngine]:
    engine = FakeEngine(version)
    # A short poll interval, so that shutting the server down is quick.
    thread = threading.Thread(target=engine._server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.unhung.set()
        engine._server.shutdown()
        engine._server.server_close()


class FakeLLM:
    """Records the sleep-mode calls vllm.LLM takes: ``sleep(level, mode)`` as
    in vLLM >= 0.17.0 (vllm/entrypoints/llm.py), "abort" by default."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep level={level} mode={mode}")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"wake_up tags={tags}")

    def collective_rpc(self, method: str) -> list[Any]:
        self.calls.append(f"collective_rpc {method}")
        return []


class OldFakeLLM(FakeLLM):
    """vllm.LLM before 0.17.0: ``sleep(level)`` with no mode."""

    def sleep(self, level: int = 1) -> None:  # type: ignore[override]
        self.calls.append(f"sleep level={level}")
