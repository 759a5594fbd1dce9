"""Every RPC driven with arbitrary field values: only documented status codes
come back, the gateway keeps serving, and a refused call changes nothing."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import timeshare.aio
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc

DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
}
CALL_SECONDS = 20.0

texts = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Zs", "So"]), max_size=20),
    st.sampled_from(["", "a", "A", "-a", "a-", "ghost", "x" * 64, "x" * 5000, "é", "a\x00b"]),
)
doubles = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    # The awkward values by name, so every run draws them often.
    st.sampled_from([0.0, -1.0, 1e-9, 1e308, -0.0, 86401.0, math.nan, math.inf, -math.inf]),
)
uint64s = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1]))


class Probe:
    """A group with two idle jobs, and what may be said to it."""

    def __init__(self, group: str, tokens: dict[str, str]) -> None:
        self.group = group
        self.tokens = tokens

    def groups(self) -> st.SearchStrategy[str]:
        return st.one_of(st.just(self.group), texts)

    def jobs(self) -> st.SearchStrategy[str]:
        return st.one_of(st.sampled_from([*self.tokens, "ghost"]), texts)

    def tokens_for(self) -> st.SearchStrategy[str]:
        return st.one_of(st.sampled_from(list(self.tokens.values())), texts)

    def is_own_token(self, group: str, job: str, token: str) -> bool:
        return group == self.group and self.tokens.get(job) == token

    def requests(self) -> st.SearchStrategy[tuple[str, Any]]:
        g, j, t = self.groups(), self.jobs(), self.tokens_for()
        policy = st.builds(
            pb.GroupPolicy,
            lease_seconds=doubles,
            max_turn_seconds=doubles,
            preempt_grace_seconds=doubles,
            agent_timeout_seconds=doubles,
            continue_as_new_every=st.integers(0, 2**32 - 1),
        )
        nodes = st.lists(texts, max_size=300)
        return st.one_of(
            st.tuples(st.just("Join"), st.builds(
                pb.JoinRequest, group=st.one_of(st.just(self.group), texts.filter(_invalid)),
                job=texts, nodes=nodes, policy=st.one_of(st.none(), policy))),
            st.tuples(st.just("Acquire"), st.builds(
                pb.AcquireRequest, group=g, job=j, job_token=t, request_id=texts,
                timeout_seconds=doubles)),
            st.tuples(st.just("Yield"), st.builds(
                pb.YieldRequest, group=g, job=j, job_token=t, epoch=uint64s)),
            st.tuples(st.just("Heartbeat"), st.builds(
                pb.HeartbeatRequest, group=g, job=j, job_token=t)),
            st.tuples(st.just("Leave"), st.builds(pb.LeaveRequest, group=g, job=j, job_token=t)),
            # Well-formed calls with a member's token (often another member's) or a forged one.
            *(st.tuples(st.just(method), st.builds(
                message, group=st.just(self.group), job=st.sampled_from(list(self.tokens)),
                job_token=st.sampled_from([*self.tokens.values(), "forged"])))
              for method, message in (("Heartbeat", pb.HeartbeatRequest),
                                      ("Leave", pb.LeaveRequest))),
            st.tuples(st.just("GetGroup"), st.builds(pb.GetGroupRequest, group=texts)),
            st.tuples(st.just("Evict"), st.builds(
                pb.EvictRequest, group=g, job=texts.filter(lambda n: n not in self.tokens),
                reason=texts)),
            st.tuples(st.just("Pause"), st.builds(pb.PauseRequest, group=g, paused=st.just(False))),
            st.tuples(st.just("Drain"), st.builds(
                pb.DrainRequest, node=texts.filter(_invalid), drained=st.booleans())),
            st.tuples(st.just("RegisterProcess"), st.builds(
                pb.RegisterProcessRequest, group=g, job=j)),
        )  # fmt: skip


def _invalid(name: str) -> bool:
    from timeshare.names import NAME_PATTERN

    return NAME_PATTERN.fullmatch(name) is None


def fuzz(address: str, probe: Probe, examples: int) -> list[str]:
    """Runs in a thread, so the test's event loop keeps serving the gateway."""
    seen: list[str] = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.TimeSlicerStub(channel)

        def status() -> pb.GroupStatus:
            return stub.GetGroup(pb.GetGroupRequest(group=probe.group), timeout=CALL_SECONDS)

        @settings(
            max_examples=examples,
            deadline=None,
            # The same examples on every run: CI must not pass by luck.
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(probe.requests())
        def one_call(call: tuple[str, Any]) -> None:
            method, request = call
            job_call = method in ("Acquire", "Yield", "Heartbeat", "Leave")
            if job_call and probe.is_own_token(request.group, request.job, request.job_token):
                return  # a legitimate call, not a fuzzed one
            before = status()
            try:
                response = getattr(stub, method)(request, timeout=CALL_SECONDS)
            except grpc.RpcError as error:
                code = error.code()
                details = error.details()
                assert code in DOCUMENTED, f"{method} {request!r} -> {code}: {details}"
                assert details, f"{method} -> {code} without a message"
                seen.append(code.name)
                # Lease clocks aside: the members' own clients renew them meanwhile.
                assert _stable(status()) == _stable(before), f"{method} {request!r} changed it"
                return
            seen.append("OK")
            if method == "Join" and request.group == probe.group:
                leave = pb.LeaveRequest(
                    group=probe.group, job=request.job, job_token=response.job_token
                )
                stub.Leave(leave, timeout=CALL_SECONDS)
            if method in ("Join", "Pause", "GetGroup", "Drain"):
                assert _stable(status()) == _stable(before), f"{method} {request!r}"

        one_call()
    return seen


def _stable(status: pb.GroupStatus) -> pb.GroupStatus:
    """A group's status without the lease clocks that a valid call renews."""
    copy = pb.GroupStatus()
    copy.CopyFrom(status)
    for job in copy.jobs:
        job.last_seen = 0.0
    return copy


@pytest.mark.timeout(600)
async def test_every_rpc_refuses_garbage_cleanly(gateway: str, unique: str) -> None:
    group = f"fuzz-{unique}"
    api = timeshare.aio.connect(gateway)
    try:
        jobs = {name: await api.join(group, name, nodes=[f"n-{unique}"]) for name in ("a", "b")}
        probe = Probe(group, {name: job.ref.token for name, job in jobs.items()})
        seen = await asyncio.to_thread(fuzz, gateway, probe, 300)
        # The fuzzer reached past the gateway's own checks into the workflow's.
        assert {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"} <= set(seen)
        assert (await api.get_group(group)).group == group  # still serving
        for job in jobs.values():
            await job.leave()
    finally:
        await api.close()


async def test_a_request_over_4_mib_is_resource_exhausted(gateway: str) -> None:
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub: Any = pb_grpc.TimeSlicerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Evict(pb.EvictRequest(group="g", job="j", reason="x" * (5 * 2**20)))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_doubles_cover_the_awkward_values() -> None:
    # The strategies above must reach NaN and infinities, or the fuzz proves less.
    found = set()

    @settings(max_examples=300, database=None, derandomize=True)
    @given(doubles)
    def collect(value: float) -> None:
        if math.isnan(value):
            found.add("nan")
        elif math.isinf(value):
            found.add("inf")

    collect()
    assert found == {"nan", "inf"}
