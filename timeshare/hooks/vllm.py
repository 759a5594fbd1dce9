"""Hooks for vLLM's sleep mode (the engine started with enable_sleep_mode=True,
or `vllm serve --enable-sleep-mode` with VLLM_SERVER_DEV_MODE=1 for the HTTP
variant).

offload: sleep level 1 (weights to host memory; the KV cache is dropped, as
vLLM always does). discard: sleep level 2 (weights and KV cache dropped); on
admission the weights are reallocated, reloaded in place, and only then the
KV cache reallocated, so the reload never competes with it for memory. The
reload defaults to the engine's `reload_weights` (from the model's files); an
RL job that syncs fresh weights itself passes ``reload``.

In-flight requests. vLLM's ``sleep(level, mode)`` (vllm/entrypoints/llm.py,
``LLM.sleep``; POST /sleep?level=&mode= in vllm/entrypoints/serve/sleep/
api_router.py) takes a ``PauseMode`` (vllm/v1/engine/__init__.py): "abort"
ends every in-flight request at once and is vLLM's default; "wait" lets them
finish first. The mode came with vllm-project/vllm#34528 ("Add optional pause-mode arg
to sleep method"), first released in 0.17.0; before it, sleep ignored a mode
and did not wait. These hooks sleep with ``sleep_mode="wait"`` by default: an
engine's own requests finish before its memory goes (their time counts
against the agent's hook timeout). An in-process engine whose ``sleep`` takes
no ``mode``, or a server older than 0.17.0 (GET /version), is refused in one
line, unless the job chose ``sleep_mode="abort"``, accepting that in-flight
requests end."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from timeshare.hooks import WorkloadHooks
from timeshare.hooks._http import EngineError, post
from timeshare.hooks._version import require_release
from timeshare.hooks.protocol import EvictMode

LEVELS: dict[EvictMode, int] = {"offload": 1, "discard": 2}
SleepMode = Literal["wait", "abort"]
SLEEP_MODE_RELEASE = (0, 17, 0)
WAIT_NEEDS = "sleeps with a mode; an older one does not wait for in-flight requests"


class VllmHooks(WorkloadHooks):
    """An in-process engine: a `vllm.LLM` (anything with its sleep, wake_up
    and collective_rpc methods)."""

    def __init__(
        self, llm: Any, reload: Callable[[], None] | None = None, sleep_mode: SleepMode = "wait"
    ) -> None:
        self.llm = llm
        self.reload = reload or (lambda: llm.collective_rpc("reload_weights"))
        self.sleep_mode = sleep_mode
        self._takes_mode = "mode" in inspect.signature(llm.sleep).parameters
        if sleep_mode != "abort" and not self._takes_mode:
            raise EngineError(
                "this vLLM engine's sleep() takes no mode (vLLM < 0.17.0), so it cannot "
                "wait for in-flight requests: upgrade, or pass sleep_mode='abort'"
            )
        self._level = 0

    def evict(self, mode: EvictMode) -> None:
        if self._takes_mode:
            self.llm.sleep(level=LEVELS[mode], mode=self.sleep_mode)
        else:
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
    (POST /sleep?level=&mode=, /wake_up[?tags=], /collective_rpc)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        reload: Callable[[], None] | None = None,
        sleep_mode: SleepMode = "wait",
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.reload = reload or self._reload_weights
        self.sleep_mode = sleep_mode
        self._level = 0
        self._checked = sleep_mode == "abort"

    def evict(self, mode: EvictMode) -> None:
        if not self._checked:
            require_release(self.base_url, "/version", SLEEP_MODE_RELEASE, WAIT_NEEDS, self.timeout)
            self._checked = True
        query = [("level", str(LEVELS[mode])), ("mode", self.sleep_mode)]
        post(self.base_url, "/sleep", self.timeout, query=query)
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
