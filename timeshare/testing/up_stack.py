"""`timeshare up`, the embedded stack as a user starts it, on fresh ports and
a fresh data directory: for tests and benchmarks that check what a user of
the demo's path gets, right after it says it is ready."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from timeshare.self_command import timeshare_command
from timeshare.testing.ports import free_port
from timeshare.workers.common.children import spawn

UP_READY = "timeshare up: ready"
UP_READY_SECONDS = 120.0


class UpStack:
    """A `timeshare up` on fresh ports and a fresh data directory; its output in ``log``."""

    def __init__(self, workdir: Path, options: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        # Further options of `timeshare up` (its defaults otherwise).
        self.options = options
        self.log = workdir / "up.log"
        self.gateway_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def start(self) -> None:
        command = timeshare_command(
            "up", f"--port={free_port()}", f"--ui-port={free_port()}",
            f"--listen={self.address}", f"--data-dir={self.workdir / 'data'}",
            "--node=up", *self.options,
        )  # fmt: skip
        # Started again, it says it is ready afresh after what is in the log.
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            # Dies with this process, however it ends.
            self.process = spawn(command, stdout=log, timeshare_child=True)
        deadline = time.monotonic() + UP_READY_SECONDS
        while time.monotonic() < deadline:
            if UP_READY in self.log.read_bytes()[offset:].decode(errors="replace"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"`timeshare up` was not ready: {tail}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def fresh_up(options: tuple[str, ...] = (), keep_logs: Path | None = None) -> Iterator[UpStack]:
    """A `timeshare up` of its own (with ``options``), stopped on leaving;
    its log is copied into ``keep_logs`` if given."""
    with tempfile.TemporaryDirectory(prefix="timeshare-up-") as scratch:
        stack = UpStack(Path(scratch), options)
        try:
            stack.start()
            yield stack
        finally:
            stack.stop()
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                target = keep_logs / f"up-{stack.gateway_port}.log"
                target.write_bytes(stack.log.read_bytes())
