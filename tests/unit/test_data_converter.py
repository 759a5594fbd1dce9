"""timeshare's data converter (workers/scheduler/data_converter.py): the SDK's pydantic
payloads byte for byte, without a new pydantic converter per clone."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    ExternalStorage,
    SerializationContext,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    WorkflowSerializationContext,
)

from timeshare.models import AcquireResult, BackendAction, Grant, GroupPolicy, SwitchOutput
from timeshare.scheduling import events as ev
from timeshare.scheduling.state import GroupState, StoredPolicy
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER
from timeshare.workers.scheduler.serve import external_storage_concurrency
from timeshare.workflows.group import GroupInput

GRANT = Grant(
    job="a", request_id="r-1", epoch=3, ticket=7, granted_at=1.5,
    waited_seconds=0.25, switch_seconds=0.125, phase="rollout",
)  # fmt: skip
MESSAGES: list[Any] = [
    ev.Acquire(job="a", token_hash="h", request_id="r-1", phase="rollout"),
    AcquireResult(grant=GRANT),
    SwitchOutput(
        node="n", backend="sim", actions=[BackendAction(job="a", action="restore", bytes=1 << 30)]
    ),
    GroupInput(
        group="g",
        state=GroupState(group="g", policy=StoredPolicy.stored(GroupPolicy(gpus=[0, 1]))),
    ),
    None,
    "plain text",
    {"nested": [1, 2.5, None]},
]


@pytest.mark.parametrize("value", MESSAGES, ids=lambda v: type(v).__name__)
async def test_payloads_are_the_sdks_byte_for_byte(value: Any) -> None:
    """Histories written by either converter replay with the other."""
    ours = await DATA_CONVERTER.encode([value])
    sdks = await pydantic_data_converter.encode([value])
    assert [p.SerializeToString(deterministic=True) for p in ours] == [
        p.SerializeToString(deterministic=True) for p in sdks
    ]
    hint = type(value) if value is not None and not isinstance(value, dict) else None
    decoded = await DATA_CONVERTER.decode(ours, [hint] if hint else None)
    assert decoded == [value]


def pydantic_converters_made_by(clone: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    made = 0
    make = PydanticPayloadConverter.__init__

    def counted(self: PydanticPayloadConverter, *args: Any, **kwargs: Any) -> None:
        nonlocal made
        made += 1
        make(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(PydanticPayloadConverter, "__init__", counted)
        for _ in range(5):
            clone()
    return made


@pytest.mark.parametrize(
    "converter, made",
    [(pydantic_data_converter, 5), (DATA_CONVERTER, 0)],
    ids=["sdk", "timeshare"],
)
def test_a_clone_makes_no_pydantic_converter(
    converter: DataConverter, made: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK clones the data converter twice per workflow activation and
    once per activity scheduled (a dataclass copy that makes its payload
    converter afresh): the SDK's makes a whole pydantic converter each time,
    timeshare's none (the first line shows the count would see one)."""
    assert pydantic_converters_made_by(lambda: dataclasses.replace(converter), monkeypatch) == made


CONTEXTS = [
    WorkflowSerializationContext(namespace="default", workflow_id="w"),
    ActivitySerializationContext(
        namespace="default", activity_id="1", activity_type="switch",
        activity_task_queue="timeshare-node-a", workflow_id="w", workflow_type="GroupWorkflow",
        is_local=False,
    ),
]  # fmt: skip


@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: type(c).__name__)
def test_a_context_leaves_the_converter_as_the_sdk_would(context: SerializationContext) -> None:
    """Its shortcut gives what the SDK's own with_context gives: should the
    SDK ever make one of these parts take a context, this fails."""
    assert DATA_CONVERTER.with_context(context) is DATA_CONVERTER
    assert DataConverter.with_context(DATA_CONVERTER, context) is DATA_CONVERTER


class UnusedStore(StorageDriver):
    """A store the scheduler is never given: it only has to exist."""

    def name(self) -> str:
        return "unused"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        raise AssertionError("not called")

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        raise AssertionError("not called")


def test_the_scheduler_visits_external_storage_one_at_a_time_only_where_there_is_none() -> None:
    """Without external storage its visits are plain calls (a concurrency of
    1); a converter that stores payloads outside history keeps the SDK's
    concurrency."""
    assert external_storage_concurrency(DATA_CONVERTER) == 1
    stored = dataclasses.replace(DATA_CONVERTER, external_storage=ExternalStorage([UnusedStore()]))
    assert external_storage_concurrency(stored) > 1
