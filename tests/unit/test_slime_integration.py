"""The Slime phase callback against the call sites of llm-d's Slime fork
(tests/slime_scripts.py, from tests/upstream/slime.json), with no scheduler:
the fork calls it where it was checked, the replays reach every call site,
and without its environment it does nothing. Slime is not on PyPI and needs
GPUs (Megatron, SGLang): the fork's source is read instead
(tests.upstream.extract). Against a scheduler:
tests/integration/test_slime_integration.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.slime_scripts import ARGUMENTS, SCRIPTS, SITES, SlimeArgs
from tests.upstream.extract import load
from timeshare.integrations.slime import TimeshareCallback

# The fork's call sites the callback was written for: (event, phase, role).
CHECKED_SITES = {
    "train.py": [
        ("begin", "init", "both"), ("end", "init", "both"),
        *[("begin", "eval", "sampler"), ("end", "eval", "sampler")] * 2,
        ("begin", "generate", "sampler"), ("end", "generate", "sampler"),
        ("begin", "offload", "sampler"), ("end", "offload", "sampler"),
        ("begin", "create", "trainer"), ("end", "create", "trainer"),
        ("begin", "train", "trainer"), ("end", "train", "trainer"),
        ("begin", "onload", "sampler"), ("end", "onload", "sampler"),
        ("begin", "weight_sync", "both"), ("end", "weight_sync", "both"),
        ("begin", "onload", "sampler"), ("end", "onload", "sampler"),
        ("begin", "eval", "sampler"), ("end", "eval", "sampler"), ("close",),
    ],
    "train_async.py": [
        ("begin", "init", "both"), ("end", "init", "both"),
        ("begin", "generate", "sampler"), ("end", "generate", "sampler"),
        ("begin", "create", "trainer"), ("end", "create", "trainer"),
        ("begin", "train", "trainer"), ("begin", "generate", "sampler"),
        ("end", "train", "trainer"), ("end", "generate", "sampler"),
        ("begin", "weight_sync", "both"), ("end", "weight_sync", "both"),
        ("begin", "eval", "sampler"), ("end", "eval", "sampler"), ("close",),
    ],
}  # fmt: skip


def test_the_fork_calls_the_callback_where_it_was_checked() -> None:
    facts = load("slime")
    for script, sites in SITES.items():
        assert [tuple(site) for site in sites] == CHECKED_SITES[script], (
            f"llm-d's Slime fork changed its {script} phases ({facts['pinned']}): check "
            "timeshare.integrations.slime against them, then CHECKED_SITES"
        )
    assert set(facts["PhaseCallback"]) == {"on_phase_begin", "on_phase_end", "close"}
    assert facts["PhaseCallback"]["on_phase_begin"] == ["self", "phase", "role", "context"]
    assert facts["loader_calls"] == [0]  # the fork makes the callback with no arguments
    TimeshareCallback()  # ... which ours allows


def test_the_replays_reach_every_call_site() -> None:
    class Nothing:
        def on_phase_begin(self, *args: Any) -> None: ...
        def on_phase_end(self, *args: Any) -> None: ...
        def close(self) -> None: ...

    for script, replay in SCRIPTS.items():
        used = set().union(*(replay(Nothing(), args).used for args in ARGUMENTS))
        assert used == set(range(len(SITES[script]))), (script, used)


def test_without_its_environment_the_callback_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("TIMESHARE_JOB", "TIMESLICE_JOB_ID", "TIMESHARE_TRAINER_GROUP",
                     "TIMESLICE_TRAINER_GROUP", "TIMESHARE_SAMPLER_GROUP",
                     "TIMESLICE_SAMPLER_GROUP"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    # Nowhere to connect: any call that tried would fail.
    monkeypatch.setenv("TIMESHARE_ADDRESS", "127.0.0.1:1")
    callback = TimeshareCallback()
    assert callback.turns is None
    for script, replay in SCRIPTS.items():
        assert replay(callback, SlimeArgs()).calls, script
