"""`timeshare status -o json|wide` and `--watch`, against the suite's gateway:
what a script reads and what a person watches."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio.client import Client

import timeshare
from tests.conftest import SimNodes
from timeshare import cli, status_command
from timeshare.names import group_workflow_id
from timeshare.workflows.group import GroupInput, GroupWorkflow


def status(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", *argv])
    return int(exited.value.code or 0)


@dataclass
class Joined:
    group: str
    node: str
    job: timeshare.Job


@pytest.fixture
async def joined(gateway: str, sim_nodes: SimNodes, unique: str) -> AsyncIterator[Joined]:
    """A job in a group of its own, on a node of its own."""
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    with timeshare.connect(gateway) as client:
        job = client.join(group, "a", nodes=[node])
        yield Joined(group, node, job)
        job.leave()


async def test_status_as_json_holds_the_groups_and_nodes_whole(
    gateway: str, joined: Joined, capsys: pytest.CaptureFixture[str]
) -> None:
    with joined.job.turn(timeout=60):
        assert status(["--group", joined.group, "-o", "json", "--address", gateway]) == 0
    answer = json.loads(capsys.readouterr().out)
    (shown,) = answer["groups"]
    assert shown["group"] == joined.group and shown["holder"] == "a"
    # The suite's in-process agents announce no node; the key is there all the same.
    assert isinstance(answer["nodes"], list) and shown["resident"] == {joined.node: "a"}


async def test_wide_adds_each_groups_policy_and_jobs(
    gateway: str, joined: Joined, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status(["-o", "wide", "--address", gateway]) == 0
    out = capsys.readouterr().out
    assert f"group {joined.group}" in out and "policy: ordering fair" in out
    assert "LAST HEARD" in out


async def test_watch_shows_it_again_until_interrupted(
    gateway: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_command, "pause", nap)
    assert status(["-o", "json", "--watch", "0.5", "--address", gateway]) == 130
    documents = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert len(documents) == 2 and naps == [0.5, 0.5]


async def test_a_group_that_does_not_answer_is_listed_degraded_beside_the_others(
    gateway: str, joined: Joined, client: Client, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A group's workflow that no scheduler serves: its queries go unanswered.
    silent = f"silent-{unique}"
    handle = await client.start_workflow(
        GroupWorkflow.run,
        GroupInput(group=silent),
        id=group_workflow_id(silent),
        task_queue=f"nobody-{unique}",
    )
    try:
        assert status(["-o", "json", "--address", gateway]) == 0
    finally:
        await handle.terminate("test over")
    listed = {g["group"]: g for g in json.loads(capsys.readouterr().out)["groups"]}
    assert listed[joined.group]["state"] != "degraded"
    assert listed[silent]["state"] == "degraded"
    assert "does not answer" in listed[silent]["degraded_cause"]
