"""Hooks for an SGLang server started with --enable-memory-saver, through
POST /release_memory_occupation and /resume_memory_occupation (JSON "tags").

Whether released weights survive is fixed when the server starts, not per
call: with --enable-weights-cpu-backup they are kept in host memory, which
offload needs; without it they are dropped. In discard mode with a
``model_path``, admission resumes the weights, reloads them (POST
/update_weights_from_disk) and only then resumes the rest, so the reload
never competes with the KV cache for memory. The KV cache is always dropped
on release."""

from __future__ import annotations

from collections.abc import Sequence

from timeshare.hooks import WorkloadHooks
from timeshare.hooks._http import post
from timeshare.hooks.protocol import EvictMode

TAGS = ("weights", "kv_cache")


class SglangServerHooks(WorkloadHooks):
    def __init__(
        self,
        base_url: str,
        tags: Sequence[str] = TAGS,
        model_path: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.base_url = base_url
        self.tags = list(tags)
        self.model_path = model_path
        self.timeout = timeout
        self._reload = False

    def evict(self, mode: EvictMode) -> None:
        post(self.base_url, "/release_memory_occupation", self.timeout, body={"tags": self.tags})
        self._reload = mode == "discard" and self.model_path is not None and "weights" in self.tags

    def admit(self) -> None:
        rest = self.tags
        if self._reload:
            self._resume(["weights"])
            body = {"model_path": self.model_path}
            post(self.base_url, "/update_weights_from_disk", self.timeout, body=body)
            rest = [tag for tag in self.tags if tag != "weights"]
        if rest:
            self._resume(rest)
        self._reload = False

    def _resume(self, tags: list[str]) -> None:
        post(self.base_url, "/resume_memory_occupation", self.timeout, body={"tags": tags})
