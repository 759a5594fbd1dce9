"""A fake inference engine for hook tests: an HTTP server in a thread that
answers like vLLM's sleep API (/sleep?level=, /wake_up?tags=,
/collective_rpc, /is_sleeping) and SGLang's memory occupation API
(/release_memory_occupation, /resume_memory_occupation, with JSON tags),
recording every request and when it came. It can be told to fail or hang on
a path. Also FakeLLM, an in-process stand-in for vllm.LLM's sleep calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel


class EngineRequest(BaseModel):
    method: str
    path: str
    body: Any = None
    at: float


class FakeEngine:
    def __init__(self) -> None:
        self.requests: list[EngineRequest] = []
        self.sleeping = False
        # path (without query) -> (status, message) to answer instead.
        self.failures: dict[str, tuple[int, str]] = {}
        self.hang_on: set[str] = set()
        self.released = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

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
                route = self.path.split("?")[0]
                if route in engine.hang_on:
                    engine.released.wait(60)
                status, reply = engine.failures.get(route, (200, ""))
                if status == 200:
                    reply = json.dumps(engine._state_change(route))
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply.encode())

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler

    def _state_change(self, route: str) -> dict[str, Any]:
        if route in ("/sleep", "/release_memory_occupation"):
            self.sleeping = True
        elif route in ("/wake_up", "/resume_memory_occupation"):
            self.sleeping = False
        return {"is_sleeping": self.sleeping} if route == "/is_sleeping" else {}


@contextmanager
def running_engine() -> Iterator[FakeEngine]:
    engine = FakeEngine()
    thread = threading.Thread(target=engine._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.released.set()
        engine._server.shutdown()
        engine._server.server_close()


class FakeLLM:
    """Records the sleep-mode calls vllm.LLM takes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep level={level}")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"wake_up tags={tags}")

    def collective_rpc(self, method: str) -> list[Any]:
        self.calls.append(f"collective_rpc {method}")
        return []
