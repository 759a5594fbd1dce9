"""The ready-made engine hooks, called directly: vLLM in process (against a
stand-in recording its sleep calls) and both engines' server APIs (against
the fake engine of tests/fakes/engine.py, written from their source). The
agent's side is in tests/integration/test_hooks.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.engine import FakeEngine, FakeLLM, OldFakeLLM, running_engine
from timeshare.hooks._http import EngineError
from timeshare.hooks.sglang import SglangServerHooks
from timeshare.hooks.vllm import VllmHooks, VllmServerHooks

SGLANG = "0.5.6"


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with running_engine() as started:
        yield started


@pytest.fixture
def sglang() -> Iterator[FakeEngine]:
    with running_engine(SGLANG) as started:
        yield started


def test_vllm_offload_is_level_1_and_discard_is_level_2_with_a_weight_reload() -> None:
    llm = FakeLLM()
    hooks = VllmHooks(llm)
    hooks.evict("offload")
    hooks.admit()
    hooks.evict("discard")
    hooks.admit()
    assert llm.calls == [
        "sleep level=1 mode=wait", "wake_up tags=None",
        "sleep level=2 mode=wait", "wake_up tags=['weights']", "collective_rpc reload_weights",
        "wake_up tags=['kv_cache']",
    ]  # fmt: skip


def test_vllm_discard_takes_the_jobs_own_weight_sync() -> None:
    llm = FakeLLM()
    hooks = VllmHooks(llm, reload=lambda: llm.calls.append("synced from the trainer"))
    hooks.evict("discard")
    hooks.admit()
    assert llm.calls[2] == "synced from the trainer"


def test_an_engine_that_cannot_wait_is_refused_unless_the_job_accepts_aborts() -> None:
    with pytest.raises(EngineError, match=r"sleep\(\) takes no mode .* sleep_mode='abort'"):
        VllmHooks(OldFakeLLM())
    llm = OldFakeLLM()
    VllmHooks(llm, sleep_mode="abort").evict("offload")
    assert llm.calls == ["sleep level=1"]


def test_a_vllm_server_lets_its_in_flight_requests_finish_before_sleeping(
    engine: FakeEngine,
) -> None:
    engine.running = 3
    hooks = VllmServerHooks(engine.url)
    hooks.evict("offload")
    assert (engine.finished, engine.aborted) == (3, 0)
    assert engine.paths() == ["/sleep?level=1&mode=wait"]
    hooks.evict("discard")  # the version is read once
    assert [r.path for r in engine.requests].count("/version") == 1


def test_a_vllm_server_too_old_to_wait_is_refused_before_anything_is_aborted() -> None:
    with running_engine("0.16.0") as old:
        old.running = 2
        with pytest.raises(EngineError, match=r"engine version 0\.16\.0 is older than 0\.17\.0"):
            VllmServerHooks(old.url).evict("offload")
        assert old.paths() == [] and old.aborted == 0
        VllmServerHooks(old.url, sleep_mode="abort").evict("offload")  # the job's choice
        assert old.aborted == 2


def test_sglang_retracts_running_requests_releases_everything_and_resumes_them(
    sglang: FakeEngine,
) -> None:
    sglang.running = 2
    hooks = SglangServerHooks(sglang.url)
    hooks.evict("offload")
    assert sglang.retracted == 2 and sglang.aborted == 0  # queued, not lost
    assert sglang.released == {"weights", "kv_cache", "cuda_graph"}  # SGLang's own default
    hooks.admit()
    assert [(r.path, r.body) for r in sglang.posts()] == [
        ("/pause_generation", {"mode": "retract"}),
        ("/release_memory_occupation", {"tags": ["weights", "kv_cache", "cuda_graph"]}),
        ("/resume_memory_occupation", {"tags": ["weights", "kv_cache", "cuda_graph"]}),
        ("/continue_generation", {}),
    ]
    assert sglang.released == set() and sglang.running == 2 and not sglang.paused


def test_sglang_discard_reloads_the_weights_before_the_kv_cache(sglang: FakeEngine) -> None:
    hooks = SglangServerHooks(sglang.url, model_path="/models/policy")
    hooks.evict("discard")
    hooks.admit()
    assert [(r.path, r.body) for r in sglang.posts()[2:]] == [
        ("/resume_memory_occupation", {"tags": ["weights"]}),
        ("/update_weights_from_disk", {"model_path": "/models/policy"}),
        ("/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]}),
        ("/continue_generation", {}),
    ]


def test_a_retried_admission_resumes_only_what_is_still_released(sglang: FakeEngine) -> None:
    hooks = SglangServerHooks(sglang.url, model_path="/models/policy")
    hooks.evict("discard")
    sglang.failures["/update_weights_from_disk"] = (400, "no such file")
    with pytest.raises(EngineError, match="HTTP 400 no such file"):
        hooks.admit()
    del sglang.failures["/update_weights_from_disk"]
    hooks.admit()  # the agent retries a failed restore
    resumed = [r.body["tags"] for r in sglang.posts() if r.path == "/resume_memory_occupation"]
    assert resumed == [["weights"], ["kv_cache", "cuda_graph"]]  # weights once only
    assert sglang.paths().count("/update_weights_from_disk") == 2
    assert sglang.released == set() and not sglang.paused


def test_a_refused_release_lets_the_engine_go_on_generating(sglang: FakeEngine) -> None:
    sglang.running = 1
    sglang.failures["/release_memory_occupation"] = (400, "memory saver is not enabled")
    with pytest.raises(EngineError, match="HTTP 400 memory saver is not enabled"):
        SglangServerHooks(sglang.url).evict("offload")
    assert sglang.paths()[-1] == "/continue_generation"
    assert sglang.running == 1 and not sglang.paused


def test_an_sglang_server_whose_pause_aborts_is_refused_unless_the_job_accepts_it() -> None:
    with running_engine("0.5.5") as old:
        old.running = 2
        with pytest.raises(EngineError, match=r"engine version 0\.5\.5 is older than 0\.5\.6"):
            SglangServerHooks(old.url).evict("offload")
        assert old.paths() == [] and old.aborted == 0
        SglangServerHooks(old.url, pause="abort").evict("offload")
        assert old.aborted == 2 and old.released == {"weights", "kv_cache", "cuda_graph"}
