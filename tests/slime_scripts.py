"""Slime's two training drivers as the phase callback sees them: every
``on_phase_begin``/``on_phase_end``/``close`` call of llm-d's Slime fork
(aishukamal/slime, branch feat/phase-callbacks: train.py at 738fd760,
train_async.py at 1cdf4e6b), in the order the scripts make them for given
arguments. Each call is the script's own call site, read from
tests/upstream/slime.json (tests.upstream.extract writes it from the fork's
source), so a phase renamed or moved upstream changes what is replayed here
and fails the site checks in tests/integration/test_slime_integration.py. Everything
between the calls (Ray, Megatron, SGLang) is left out: the callback sees
only these calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.upstream.extract import load

SITES = {script: load("slime")[script] for script in ("train.py", "train_async.py")}


@dataclass(frozen=True)
class SlimeArgs:
    """The arguments of Slime's that decide which phases run."""

    num_rollout: int = 3
    start_rollout_id: int = 0
    release_train: bool = False
    offload_rollout: bool = False
    eval_interval: int | None = None
    skip_eval_before_train: bool = False
    update_weights_interval: int = 1


# Arguments that between them reach every call site of both scripts.
ARGUMENTS = [
    SlimeArgs(),
    SlimeArgs(offload_rollout=True, eval_interval=2),
    SlimeArgs(release_train=True, eval_interval=1),
    SlimeArgs(num_rollout=0, eval_interval=1),
    SlimeArgs(num_rollout=4, update_weights_interval=2, eval_interval=1),
]


def periodic(rollout_id: int, interval: int | None) -> bool:
    """slime.utils.misc.should_run_periodic_action, for a run of one epoch."""
    return interval is not None and (rollout_id + 1) % interval == 0


class Replay:
    """Calls ``callback`` as one script's call sites do; records what was called."""

    def __init__(self, script: str, callback: Any) -> None:
        self.sites = SITES[script]
        self.callback = callback
        self.calls: list[tuple[str, ...]] = []
        self.used: set[int] = set()

    def at(self, *sites: int, rollout_id: int | None = None) -> None:
        """Make the calls of these sites, one after the other."""
        context = None if rollout_id is None else {"rollout_id": rollout_id}
        for site in sites:
            event, *phase_role = self.sites[site]
            self.used.add(site)
            self.calls.append((event, *phase_role))
            if event == "close":
                self.callback.close()
            elif event == "begin":
                self.callback.on_phase_begin(*phase_role, context)
            else:
                self.callback.on_phase_end(*phase_role, context)


def train(callback: Any, args: SlimeArgs) -> Replay:
    """train.py's train(args)."""
    run = Replay("train.py", callback)
    run.at(0, 1)  # init: placement groups, engines, models, first weight push
    if args.num_rollout == 0 and args.eval_interval is not None:
        run.at(2, 3)
    for rollout_id in range(args.start_rollout_id, args.num_rollout):
        if args.eval_interval is not None and rollout_id == 0 and not args.skip_eval_before_train:
            run.at(4, 5, rollout_id=rollout_id)
        run.at(6, 7, rollout_id=rollout_id)  # generate
        if args.offload_rollout:
            run.at(8, 9, rollout_id=rollout_id)
        if args.release_train:
            run.at(10, 11, rollout_id=rollout_id)  # create
        run.at(12, 13, rollout_id=rollout_id)  # train
        if args.offload_rollout and not args.release_train:
            run.at(14, 15, rollout_id=rollout_id)  # onload weights
        run.at(16, 17, rollout_id=rollout_id)  # weight_sync
        if args.offload_rollout:
            run.at(18, 19, rollout_id=rollout_id)  # onload kv
        if periodic(rollout_id, args.eval_interval):
            run.at(20, 21, rollout_id=rollout_id)
    run.at(22)
    return run


def train_async(callback: Any, args: SlimeArgs) -> Replay:
    """train_async.py's train(args): generation N+1 is dispatched inside train N."""
    run = Replay("train_async.py", callback)
    run.at(0, 1)
    run.at(2, rollout_id=args.start_rollout_id)  # the first generate, dispatched
    pending = True
    for rollout_id in range(args.start_rollout_id, args.num_rollout):
        if pending:
            run.at(3, rollout_id=rollout_id)  # collected
            pending = False
        if args.release_train:
            run.at(4, 5, rollout_id=rollout_id)
        run.at(6, rollout_id=rollout_id)  # train begins
        if rollout_id + 1 < args.num_rollout:
            run.at(7, rollout_id=rollout_id + 1)  # the next generate, dispatched inside train
            pending = True
        run.at(8, rollout_id=rollout_id)  # train ends
        if args.release_train or (rollout_id + 1) % args.update_weights_interval == 0:
            if pending:
                run.at(9, rollout_id=rollout_id)
                pending = False
            run.at(10, 11, rollout_id=rollout_id)  # weight_sync
        if periodic(rollout_id, args.eval_interval):
            run.at(12, 13, rollout_id=rollout_id)
    run.at(14)
    return run


SCRIPTS = {"train.py": train, "train_async.py": train_async}
