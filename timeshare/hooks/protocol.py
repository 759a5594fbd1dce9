"""The workload hook protocol on the node agent's Unix socket: one JSON object
per line each way, on one long-lived connection per process.

    process -> agent  {"op": "hooks", "group": G, "job": J, "token": T, "mode": "offload",
                       "register_process": true, "evicted": false}
    agent -> process  {"ok": true, "pid": P}   or   {"ok": false, "error": "..."}
    agent -> process  {"id": 1, "call": "evict", "mode": "offload"}
    process -> agent  {"id": 1, "ok": true}    or   {"id": 1, "ok": false, "error": "..."}
    agent -> process  {"id": 2, "call": "admit"}
    process -> agent  {"id": 2, "ok": true}

The agent takes the process id from the kernel (SO_PEERCRED), and admits
the hooks only with the job's token T (timeshare.credentials): without it, a
process of another tenant could serve hooks that fail every switch of a job.
``register_process`` also registers the process as one of the job's, so the
checkpointing layers (cuda, freeze) act on it; ``evicted`` tells an agent
that restarted where the process stands. Closing the connection withdraws
the hooks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# offload: keep the contents in host memory; discard: drop what can be rebuilt
# (the KV cache, weights that can be reloaded).
EvictMode = Literal["offload", "discard"]
HookName = Literal["evict", "admit"]
# A reply's error is cut to this many characters, so every line stays short.
MAX_ERROR_CHARS = 1000
MAX_LINE_BYTES = 4096


class HookHello(BaseModel):
    op: Literal["hooks"] = "hooks"
    group: str
    job: str
    # The job's token, checked by the agent against the group's record; never kept.
    token: str = Field(default="", repr=False)
    # How this process wants to be evicted; the agent passes it to evict().
    mode: EvictMode = "offload"
    register_process: bool = True
    evicted: bool = False


class HookCall(BaseModel):
    id: int
    call: HookName
    mode: EvictMode | None = None


class HookReply(BaseModel):
    id: int
    ok: bool
    error: str = Field(default="", max_length=MAX_ERROR_CHARS)
