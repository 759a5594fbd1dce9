"""The ready-made engine hooks, called directly: vLLM in process (against a
stand-in recording its sleep calls) and SGLang's server API (against the fake
engine). The agent's side is in tests/test_hooks.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.engine import FakeEngine, FakeLLM, running_engine
from timeshare.hooks._http import EngineError
from timeshare.hooks.sglang import SglangServerHooks
from timeshare.hooks.vllm import VllmHooks


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with running_engine() as started:
        yield started


def test_vllm_offload_is_level_1_and_discard_is_level_2_with_a_weight_reload() -> None:
    llm = FakeLLM()
    hooks = VllmHooks(llm)
    hooks.evict("offload")
    hooks.admit()
    hooks.evict("discard")
    hooks.admit()
    assert llm.calls == [
        "sleep level=1", "wake_up tags=None",
        "sleep level=2", "wake_up tags=['weights']", "collective_rpc reload_weights",
        "wake_up tags=['kv_cache']",
    ]  # fmt: skip


def test_vllm_discard_takes_the_jobs_own_weight_sync() -> None:
    llm = FakeLLM()
    hooks = VllmHooks(llm, reload=lambda: llm.calls.append("synced from the trainer"))
    hooks.evict("discard")
    hooks.admit()
    assert llm.calls[2] == "synced from the trainer"


def test_sglang_releases_and_resumes_by_tag(engine: FakeEngine) -> None:
    hooks = SglangServerHooks(engine.url)
    hooks.evict("offload")
    assert engine.sleeping
    hooks.admit()
    assert [(r.path, r.body) for r in engine.requests] == [
        ("/release_memory_occupation", {"tags": ["weights", "kv_cache"]}),
        ("/resume_memory_occupation", {"tags": ["weights", "kv_cache"]}),
    ]
    assert not engine.sleeping


def test_sglang_discard_reloads_the_weights_before_the_kv_cache(engine: FakeEngine) -> None:
    hooks = SglangServerHooks(engine.url, model_path="/models/policy")
    hooks.evict("discard")
    hooks.admit()
    assert [(r.path, r.body) for r in engine.requests[1:]] == [
        ("/resume_memory_occupation", {"tags": ["weights"]}),
        ("/update_weights_from_disk", {"model_path": "/models/policy"}),
        ("/resume_memory_occupation", {"tags": ["kv_cache"]}),
    ]


def test_an_engine_that_refuses_says_why(engine: FakeEngine) -> None:
    engine.failures["/release_memory_occupation"] = (400, "memory saver is not enabled")
    with pytest.raises(EngineError, match="HTTP 400 memory saver is not enabled"):
        SglangServerHooks(engine.url).evict("offload")
