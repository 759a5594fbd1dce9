"""Hooks for an SGLang server started with --enable-memory-saver.

What SGLang's own source says (sgl-project/sglang, python/sglang/srt/):
- ``Scheduler.release_memory_occupation`` (managers/scheduler_update_weights_mixin.py)
  asserts that no request is running: it must only be called once generation
  is paused. It is reached by POST /release_memory_occupation with JSON
  ``{"tags": [...]}``; no tags means every memory type.
- Every memory type is ``GPU_MEMORY_ALL_TYPES`` (constants.py): "kv_cache",
  "weights" and "cuda_graph". These hooks release the same three by default.
- ``resume_memory_occupation`` removes each tag it is given from the set of
  released ones (``offload_tags.remove``), so resuming a tag that was not
  released fails: only the tags that were released are resumed.
- POST /pause_generation takes ``PauseGenerationReqInput`` (managers/io_struct.py)
  with a ``mode``: "abort" (the default) ends every request; "retract" moves
  the running ones back to the waiting queue, where they are recomputed after
  POST /continue_generation; "in_place" keeps them in the running batch, which
  release refuses. These hooks pause with "retract", so no request is lost.
  Before the mode existed (verl's compatibility shim for sglang<=0.5.5 notes
  that pause_generation took no arguments), a pause aborted every request
  whatever was asked: the hooks refuse such a server (GET /get_server_info,
  "version") unless the job chose ``pause="abort"``.

Whether released weights survive is fixed when the server starts, not per
call: with --enable-weights-cpu-backup they are kept in host memory, which
offload needs; without it they are dropped. In discard mode with a
``model_path``, admission resumes the weights, reloads them (POST
/update_weights_from_disk) and only then resumes the rest, so the reload
never competes with the KV cache for memory. The KV cache is always dropped
on release."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from timeshare.hooks import WorkloadHooks
from timeshare.hooks._http import EngineError, post
from timeshare.hooks._version import require_release
from timeshare.hooks.protocol import EvictMode

TAGS = ("weights", "kv_cache", "cuda_graph")
# The first release whose /pause_generation honours a mode (see above).
PAUSE_MODE_RELEASE = (0, 5, 6)
# retract: running requests go back to the queue and finish after the
# admission; abort: they end now, with an "abort" finish reason.
PauseMode = Literal["retract", "abort"]


class SglangServerHooks(WorkloadHooks):
    def __init__(
        self,
        base_url: str,
        tags: Sequence[str] = TAGS,
        model_path: str | None = None,
        timeout: float = 600.0,
        pause: PauseMode = "retract",
    ) -> None:
        if not tags:
            raise ValueError("SglangServerHooks: give at least one memory tag to release")
        self.base_url = base_url
        self.tags = list(tags)
        self.model_path = model_path
        self.timeout = timeout
        self.pause = pause
        # The tags the engine holds released now: only these are resumed.
        self.released: list[str] = []
        self._reload = False
        self._checked = False

    def evict(self, mode: EvictMode) -> None:
        self._check_version()
        post(self.base_url, "/pause_generation", self.timeout, body={"mode": self.pause})
        try:
            post(
                self.base_url, "/release_memory_occupation", self.timeout, body={"tags": self.tags}
            )
        except EngineError:
            # Nothing was released: let the engine go on with its requests.
            self._continue()
            raise
        self.released = list(self.tags)
        self._reload = mode == "discard" and self.model_path is not None and "weights" in self.tags

    def admit(self) -> None:
        # Each step records what it did, so that an admission retried after a
        # failure (the agent retries a failed restore) resumes only what is
        # still released: SGLang refuses to resume a tag twice.
        if self._reload and "weights" in self.released:
            self._resume(["weights"])
        if self._reload:
            body = {"model_path": self.model_path}
            post(self.base_url, "/update_weights_from_disk", self.timeout, body=body)
            self._reload = False
        if self.released:
            self._resume(list(self.released))
        self._continue()

    def _resume(self, tags: list[str]) -> None:
        post(self.base_url, "/resume_memory_occupation", self.timeout, body={"tags": tags})
        self.released = [tag for tag in self.released if tag not in tags]

    def _continue(self) -> None:
        post(self.base_url, "/continue_generation", self.timeout, body={})

    def _check_version(self) -> None:
        if self._checked or self.pause == "abort":
            return
        what = "pauses with a mode; an older one aborts every running request"
        require_release(self.base_url, "/get_server_info", PAUSE_MODE_RELEASE, what, self.timeout)
        self._checked = True
