"""A job of one RL framework's plug-in that takes its first turn, says
"holding", then crashes (when a line comes on its standard input) or waits
to be killed (tests/integration/test_integration_exits.py); "registered" registers its
process with the node's agent first, then waits (tests/integration/test_exit_watch.py):

    python -m tests.exiting_job FRAMEWORK crash|wait|registered

The environment names the group, job and gateway as a launcher would
(TIMESHARE_GROUP, TIMESHARE_JOB, TIMESHARE_ADDRESS, TIMESHARE_NODES)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from tests.rl_standins import Recorder, RemoteInferenceClient


def trl() -> None:
    # What GRPOTrainer's constructor does before TRL's: the same turns, the same exits.
    from timeshare.integrations.environment import turns_from_env
    from timeshare.integrations.trl import SETUP

    turns_from_env().acquire(SETUP)


def verl() -> Any:
    from hydra import compose, initialize_config_module

    from timeshare.integrations.verl import register_trainers

    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=["trainer.use_v1=True"])
    trainer = register_trainers()["timeshare_sync"](config)
    trainer._setup = lambda: None  # the Ray worker groups need GPUs
    trainer.on_init_end = lambda: None
    trainer.init()  # the setup turn
    return trainer


def slime() -> None:
    from timeshare.integrations.slime import TimeshareCallback

    TimeshareCallback().on_phase_begin("init", "both")


def openrlhf() -> None:
    from timeshare.integrations import openrlhf

    openrlhf.setup_turn()


def skyrl() -> None:
    from timeshare.integrations import skyrl

    skyrl.setup_turn()
    client = skyrl.inference_client(RemoteInferenceClient(Recorder("", "", "")))
    asyncio.run(client.wake_up(tags=["kv_cache"]))  # the first rollout turn


FRAMEWORKS = {"trl": trl, "verl": verl, "slime": slime, "openrlhf": openrlhf, "skyrl": skyrl}


def register_with_agent() -> None:
    """As a GPU worker does: its node's agent now knows this process is the job's."""
    import os

    from timeshare.registration import register_process

    group = os.environ.get("TIMESHARE_GROUP") or os.environ["TIMESHARE_TRAINER_GROUP"]
    register_process(group, os.environ["TIMESHARE_JOB"])


def main() -> None:
    framework, mode = sys.argv[1], sys.argv[2]
    FRAMEWORKS[framework]()
    if mode == "registered":
        register_with_agent()
    print("holding", flush=True)
    if mode == "crash":
        sys.stdin.readline()  # the test has seen the turn held
        raise RuntimeError(f"{framework}: a crash while holding the turn")
    time.sleep(600)


if __name__ == "__main__":
    main()
