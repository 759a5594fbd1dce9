"""Tenants on one node: a process joins a job's switches (registers into it,
serves its hooks) only with that job's token, checked by a real agent socket
against the group's record on a real dev server (GroupWorkflow.token_matches).
Refusals change nothing; the socket belongs to the group it is given."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.conftest import REPO
from tests.credentials import known_jobs
from tests.groups import join
from tests.polling import async_check, wait_until_async
from tests.processes import detached, kill
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.hook_registry import HookRegistry
from timeshare.activities.backends.processes import NotPermitted, ProcessTable, owner
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.switch import SwitchActivities
from timeshare.credentials import JOB_TOKEN_ENV, token_hash
from timeshare.errors import PermissionDenied
from timeshare.hooks import WorkloadHooks, serve_hooks
from timeshare.hooks.protocol import EvictMode
from timeshare.models import TokenCheck
from timeshare.names import group_workflow_id
from timeshare.registration import open_agent_connection, register_process
from timeshare.scheduling import events as ev
from timeshare.testing import timeshare_command
from timeshare.workers.agent import registration_socket as agent_socket
from timeshare.workers.agent.credentials import JobCredentials, group_lookup
from timeshare.workers.agent.registration_socket import forgotten, serve_agent_socket
from timeshare.workflows.group import GroupWorkflow

VICTIM, OTHER = "victim-token", "other-token"


@dataclass
class Node:
    path: str
    processes: ProcessTable
    hooks: HookRegistry
    credentials: JobCredentials


@contextlib.asynccontextmanager
async def node_agent(tmp_path: Path, client: Client) -> AsyncIterator[Node]:
    """The agent's socket as `timeshare agent` serves it: hooks accepted, and
    every credential checked with the group's workflow."""
    processes, hooks = ProcessTable(), HookRegistry()
    hooks.accepting = True
    credentials = JobCredentials(group_lookup(client))
    path = str(tmp_path / "agent.sock")
    async with await serve_agent_socket(path, processes, hooks, credentials=credentials):
        yield Node(path, processes, hooks, credentials)
        hooks.close_all()


async def two_jobs(client: Client, unique: str) -> str:
    group = f"g-{unique}"
    await join(client, group, "victim", [f"n-{unique}"], token_hash=token_hash(VICTIM))
    await join(client, group, "other", [f"n-{unique}"], token_hash=token_hash(OTHER))
    return group


SELF_REGISTER = """
import json, pathlib, sys
from timeshare.errors import TimeshareError
from timeshare.registration import register_process
socket_path, group, job, out = sys.argv[1:]
try:
    said = {"pid": register_process(group, job, socket_path)}
except TimeshareError as error:
    said = {"error": str(error)}
partial = pathlib.Path(out + ".partial")
partial.write_text(json.dumps(said))
partial.replace(out)  # whole, or not there yet
"""


async def self_registration(node: Node, group: str, job: str, token: str, out: Path) -> str:
    """A second process, of another tenant, registers itself into ``job``
    presenting ``token`` (TIMESHARE_JOB_TOKEN); what it was told."""
    env = {JOB_TOKEN_ENV: token} if token else None
    pid = detached(sys.executable, "-c", SELF_REGISTER, node.path, group, job, str(out), env=env)
    try:

        async def answer() -> str:
            return out.read_text() if out.exists() else ""

        said = await wait_until_async(answer, "the process to register")
        return str(json.loads(said).get("error", ""))
    finally:
        kill(pid)


async def test_a_process_without_the_jobs_token_cannot_register_into_it(
    client: Client, scheduler: Worker, tmp_path: Path, unique: str
) -> None:
    group = await two_jobs(client, unique)
    async with node_agent(tmp_path, client) as node:
        told = {
            token: await self_registration(node, group, "victim", token, tmp_path / f"{i}.json")
            for i, token in enumerate(["", "forged", OTHER])
        }
        assert "no job token" in told[""] and JOB_TOKEN_ENV in told[""]
        assert "wrong or missing job token for job 'victim'" in told["forged"]
        assert "belongs to job 'other'" in told[OTHER]
        assert node.processes.jobs(group) == []  # nothing about the job changed

        # Root registering another process (a launcher) needs the token too.
        worker = detached(sys.executable, "-c", "import time; time.sleep(60)")
        try:
            on_behalf = functools.partial(register_process, group, "victim", node.path, worker)
            with pytest.raises(PermissionDenied, match="wrong or missing"):
                await asyncio.to_thread(on_behalf, token="forged")
            # Said to the agent with no token at all, not stopped by the client.
            raw = {"op": "register", "group": group, "job": "victim", "pid": worker}
            with pytest.raises(PermissionDenied, match="no job token given"):
                await asyncio.to_thread(open_agent_connection, node.path, raw)
            assert node.processes.jobs(group) == []
            assert await asyncio.to_thread(on_behalf, token=VICTIM) == worker
            assert node.processes.processes(group, "victim") == [worker]
        finally:
            kill(worker)


async def test_timeshare_register_needs_the_token_as_well_as_root_or_the_owner(
    client: Client, scheduler: Worker, tmp_path: Path, unique: str
) -> None:
    group = await two_jobs(client, unique)
    worker = detached(sys.executable, "-c", "import time; time.sleep(60)")
    environment = {k: v for k, v in os.environ.items() if k != JOB_TOKEN_ENV}
    try:
        async with node_agent(tmp_path, client) as node:
            command = timeshare_command(
                "register", f"--group={group}", "--job=victim", f"--pid={worker}",
                f"--socket={node.path}",
            )  # fmt: skip

            def register(**extra: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    command, capture_output=True, text=True, cwd=REPO,
                    env={**environment, **extra}, timeout=120,
                )  # fmt: skip

            refused = await asyncio.to_thread(register)
            assert refused.returncode != 0
            assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert "no job token" in refused.stderr
            refused = await asyncio.to_thread(register, **{JOB_TOKEN_ENV: OTHER})
            assert refused.returncode != 0 and "belongs to job 'other'" in refused.stderr
            assert node.processes.jobs(group) == []
            done = await asyncio.to_thread(register, **{JOB_TOKEN_ENV: VICTIM})
            assert done.returncode == 0, done.stderr
            assert node.processes.processes(group, "victim") == [worker]
    finally:
        kill(worker)


class Raising(WorkloadHooks):
    """The other tenant's hooks, as in the report: an evict that raises."""

    def evict(self, mode: EvictMode) -> None:
        raise RuntimeError("not yours")

    def admit(self) -> None:
        pass


async def test_a_process_without_the_jobs_token_cannot_serve_its_hooks(
    client: Client, scheduler: Worker, tmp_path: Path, unique: str
) -> None:
    group = await two_jobs(client, unique)
    async with node_agent(tmp_path, client) as node:
        for token, words in [("forged", "wrong or missing"), (OTHER, "belongs to job 'other'")]:
            with pytest.raises(PermissionDenied, match=words):
                await asyncio.to_thread(
                    serve_hooks, Raising(), group, "victim", node.path, register=False, token=token
                )
        assert node.hooks.connections(group, "victim") == []
        served = await asyncio.to_thread(
            serve_hooks, Raising(), group, "victim", node.path, register=False, token=VICTIM
        )
        try:
            assert len(node.hooks.connections(group, "victim")) == 1
        finally:
            await asyncio.to_thread(served.close)


async def test_a_job_evicted_is_no_job_to_register_into(
    client: Client, scheduler: Worker, tmp_path: Path, unique: str
) -> None:
    group = await two_jobs(client, unique)
    handle = client.get_workflow_handle(group_workflow_id(group))
    await handle.execute_update(GroupWorkflow.evict, ev.Evict(job="victim", reason="test"))
    async with node_agent(tmp_path, client) as node:
        said = await self_registration(node, group, "victim", VICTIM, tmp_path / "said.json")
        assert "was evicted: test" in said
        said = await self_registration(node, f"none-{unique}", "victim", VICTIM, tmp_path / "x")
        assert f"group 'none-{unique}' does not exist" in said


async def test_ranks_that_register_together_cost_one_check() -> None:
    """A restart of many ranks must not flood the scheduler with queries:
    checks that passed are kept a while, per (group, job, token hash);
    refusals are not, so a job that has just joined registers at once."""
    asked: list[tuple[str, str, str]] = []
    release = asyncio.Event()
    accepted = {token_hash(VICTIM)}

    async def lookup(group: str, job: str, digest: str) -> TokenCheck:
        asked.append((group, job, digest))
        await release.wait()
        return TokenCheck(matches=digest in accepted, reason="wrong or missing job token")

    clock = [0.0]
    credentials = JobCredentials(lookup, verified_seconds=60, clock=lambda: clock[0])
    ranks = [asyncio.ensure_future(credentials.verify("g", "victim", VICTIM)) for _ in range(8)]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*ranks)
    assert len(asked) == 1
    await credentials.verify("g", "victim", VICTIM)
    assert len(asked) == 1  # kept
    clock[0] = 61.0
    await credentials.verify("g", "victim", VICTIM)
    assert len(asked) == 2  # and checked again once it has expired

    with pytest.raises(Exception, match="wrong or missing"):
        await credentials.verify("g", "victim", OTHER)
    accepted.add(token_hash(OTHER))  # it joined meanwhile
    await credentials.verify("g", "victim", OTHER)
    assert len(asked) == 4


async def test_the_socket_belongs_to_the_group_it_is_given(tmp_path: Path) -> None:
    # Root may give it any group; anyone else, one of their own.
    gid = 4711 if os.geteuid() == 0 else os.getgroups()[-1]
    path = tmp_path / "agent.sock"
    server = await serve_agent_socket(
        str(path), ProcessTable(), credentials=known_jobs(), socket_group=gid
    )
    try:
        mode = path.stat()
        assert mode.st_gid == gid and stat.S_IMODE(mode.st_mode) == 0o660
    finally:
        server.close()
        await server.wait_closed()


NOBODY = 65534


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv, to run a process as another user",
)
async def test_owning_a_jobs_processes_is_not_enough_to_release_them_while_it_is_in_its_group(
    client: Client, scheduler: Worker, tmp_path: Path, unique: str
) -> None:
    """Pods of different tenants often run as one user id: `timeshare forget`
    by the owner of a job's processes takes the job's token too, until the job
    has left its group (what the command is for)."""
    group = await two_jobs(client, unique)
    table = ProcessTable()
    agent = SwitchActivities("n", SimBackend(BackendConfig(node="n")), table)
    credentials = JobCredentials(group_lookup(client))
    worker = detached(
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        sys.executable, "-c", "import time; time.sleep(60)",
    )  # fmt: skip
    try:
        await wait_until_async(
            async_check(lambda: owner(worker) == NOBODY), "the worker to run as nobody"
        )
        table.register(group, "victim", worker)

        async def forget(token: str) -> object:
            message = {"group": group, "job": "victim", "token": token}
            return await forgotten(message, NOBODY, table, agent.release_job, credentials)

        for token, words in [("", "still in its group"), (OTHER, "belongs to job 'other'")]:
            with pytest.raises(NotPermitted, match=words):
                await forget(token)
        assert table.processes(group, "victim") == [worker]
        assert await forget(VICTIM)
        assert table.jobs(group) == []

        # Once the job has left, its owner releases what is left of it alone.
        table.register(group, "victim", worker)
        handle = client.get_workflow_handle(group_workflow_id(group))
        await handle.execute_update(GroupWorkflow.evict, ev.Evict(job="victim", reason="done"))
        assert await forget("")
        assert table.jobs(group) == []
    finally:
        kill(worker)


async def test_a_peer_that_says_nothing_is_hung_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_socket, "FIRST_LINE_SECONDS", 0.2)
    path = str(tmp_path / "agent.sock")
    async with await serve_agent_socket(path, ProcessTable(), credentials=known_jobs()):
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            said = json.loads(await asyncio.wait_for(reader.readline(), 10))
            assert said["ok"] is False and "said nothing" in said["error"]
            assert await asyncio.wait_for(reader.read(), 10) == b""  # and hung up
        finally:
            writer.close()


JOIN_AND_REGISTER = """
import json, pathlib, sys, time
import timeshare
from timeshare.errors import TimeshareError
address, group, out = sys.argv[1:]
with timeshare.connect(address) as client:
    try:
        client.join(group, "worker", nodes=[f"n-{group}"], register=True)
        said = {"ok": True}
    except TimeshareError as error:
        said = {"error": str(error)}
    partial = pathlib.Path(out + ".partial")
    partial.write_text(json.dumps(said))
    partial.replace(out)
    time.sleep(60)
"""


async def written(out: Path, what: str) -> dict[str, Any]:
    """What a process wrote to ``out`` (whole: it writes beside and renames)."""

    async def said() -> str:
        return out.read_text() if out.exists() else ""

    answer: dict[str, Any] = json.loads(await wait_until_async(said, what))
    return answer


async def test_join_with_register_registers_once_joined_and_leaves_if_refused(
    client: Client, gateway: str, tmp_path: Path, unique: str
) -> None:
    """One line for a process that both asks for turns and uses the GPU: the
    Join's own token registers it (and a refused registration leaves again)."""
    async with node_agent(tmp_path, client) as node:
        joined, refused = f"g-{unique}", f"h-{unique}"
        outcomes = {}
        for socket_path, group in [(node.path, joined), ("/nonexistent.sock", refused)]:
            out = tmp_path / f"{group}.json"
            pid = detached(
                sys.executable, "-c", JOIN_AND_REGISTER, gateway, group, str(out),
                env={"TIMESHARE_AGENT_SOCKET": socket_path},
            )  # fmt: skip
            try:
                outcomes[group] = await written(out, "the job to join")
                if group == joined:
                    assert node.processes.processes(group, "worker") == [pid]
            finally:
                kill(pid)
        assert outcomes[joined] == {"ok": True}
        assert "no node agent answers" in outcomes[refused]["error"]
        handle = client.get_workflow_handle(group_workflow_id(refused))
        status = await handle.query(GroupWorkflow.status)
        assert status.jobs == []  # the job it joined for nothing left again
