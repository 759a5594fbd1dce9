"""Hooks for vLLM's sleep mode (the engine started with enable_sleep_mode=True,
or `vllm serve --enable-sleep-mode` with VLLM_SERVER_DEV_MODE=1 for the HTTP
variant).

offload: sleep level 1 (weights to host memory; the KV cache is dropped, as
vLLM always does). discard: sleep level 2 (weights and KV cache dropped); on
admission the weights are reallocated, reloaded in place, and only then the
KV cache reallocated, so the reload never competes with it for memory. The
reload defaults to the engine's `reload_weights` (from the model's files); an
RL job that syncs fresh weights itself passes ``reload``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timeshare.hooks import WorkloadHooks
from timeshare.hooks._http import post
from timeshare.hooks.protocol import EvictMode

LEVELS: dict[EvictMode, int] = {"offload": 1, "discard": 2}


class VllmHooks(WorkloadHooks):
    """An in-process engine: a `vllm.LLM` (anything with its sleep, wake_up
    and collective_rpc methods)."""

    def __init__(self, llm: Any, reload: Callable[[], None] | None = None) -> None:
        self.llm = llm
        self.reload = reload or (lambda: llm.collective_rpc("reload_weights"))
        self._level = 0

    def evict(self, mode: EvictMode) -> None:
        self.llm.sleep(level=LEVELS[mode])
        self._level = LEVELS[mode]

    def admit(self) -> None:
        if self._level == 2:
            self.llm.wake_up(tags=["weights"])
            self.reload()
            self.llm.wake_up(tags=["kv_cache"])
        else:
            self.llm.wake_up()
        self._level = 0


class VllmServerHooks(WorkloadHooks):
    """A vLLM OpenAI-compatible server, through its development endpoints
    (POST /sleep?level=, /wake_up[?tags=], /collective_rpc)."""

    def __init__(
        self, base_url: str, timeout: float = 600.0, reload: Callable[[], None] | None = None
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.reload = reload or self._reload_weights
        self._level = 0

    def evict(self, mode: EvictMode) -> None:
        post(self.base_url, "/sleep", self.timeout, query=[("level", str(LEVELS[mode]))])
        self._level = LEVELS[mode]

    def admit(self) -> None:
        if self._level == 2:
            post(self.base_url, "/wake_up", self.timeout, query=[("tags", "weights")])
            self.reload()
            post(self.base_url, "/wake_up", self.timeout, query=[("tags", "kv_cache")])
        else:
            post(self.base_url, "/wake_up", self.timeout)
        self._level = 0

    def _reload_weights(self) -> None:
        post(self.base_url, "/collective_rpc", self.timeout, body={"method": "reload_weights"})
