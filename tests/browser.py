"""Headless Chromium driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ended by NUL on file descriptors 3
and 4), so a test can wait for a single-page app to render, read its text
and take a screenshot with the standard library alone."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.needs import CHROMIUM

# The flags that work on this project's machines: without the background
# networking ones Chromium's connections are refused by the closed network.
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
POLL_SECONDS = 0.2


class BrowserError(AssertionError):
    pass


class HeadlessPage:
    """One Chromium with one page; ``close`` ends the browser."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 1000) -> None:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # Chromium reads commands from fd 3 and writes answers to fd 4. bash
        # (dash takes no fd above 9 in a redirection) puts the pipe ends there:
        # a preexec_fn would run Python in a child forked from a process with
        # gRPC's threads, which gRPC's fork handler aborts now and then ("Check
        # failed: next_worker->state == KICKED").
        self._process = subprocess.Popen(
            [
                "bash", "-c", f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write}',
                str(CHROMIUM), *HEADLESS_FLAGS, f"--user-data-dir={profile}",
                f"--window-size={width},{height}", "--remote-debugging-pipe", "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_browser_read, from_browser_write),
        )  # fmt: skip
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        targets = self._call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        attached = self._call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self._session = attached["sessionId"]

    def open(self, url: str) -> None:
        self._call("Page.navigate", self._session, url=url)

    def evaluate(self, expression: str) -> Any:
        answer = self._call(
            "Runtime.evaluate", self._session, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r} threw: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """The expression's value once it is truthy (the page renders as it likes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(POLL_SECONDS)
        text = self.evaluate("document.body ? document.body.innerText : ''")
        raise BrowserError(f"{what} did not render within {timeout:g} s; the page said: {text!r}")

    def screenshot(self, path: Path) -> Path:
        shot = self._call("Page.captureScreenshot", self._session, format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (BrowserError, OSError):
            self._process.kill()
        finally:
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            os.close(self._to_browser)
            os.close(self._from_browser)

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") != self._next_id:
                continue  # an event, or an answer nobody waits for
            if "error" in answer:
                raise BrowserError(f"{method}: {answer['error']}")
            result: dict[str, Any] = answer["result"]
            return result

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self._process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        answer: dict[str, Any] = json.loads(message)
        return answer
