"""The stack's own costs as measured: what bench.placement tells the model.

From synthetic jobs' records (client clocks) and their group's history
(scheduler clocks, same machine): how long a job's message takes to reach
the scheduler, an acquire granted at once and a yield take as the job sees
them, and, for each hand-over, the wait before the switch begins, the
switch's time beyond its transfers, and the wait from its end until the
waiting job's acquire returns; and how much longer than asked the jobs' own
phases ran (a loaded host wakes a sleeping job late). Means, not medians,
since a job's iteration adds these up (a tail of slow calls costs what it
costs), but with each sample capped at STALL times the median: one stall of
the whole shared host during the calibration says nothing about the run
that follows.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from timeshare.history import GroupHistory
from timeshare.placement.spec import StackCosts
from timeshare.synthetic import SyntheticJobReport

# A sample counts for at most this many times the median.
STALL = 5.0


class CostSamples:
    def __init__(self) -> None:
        # The samples of each of StackCosts' figures, by its name less "_seconds".
        self.samples = {
            name.removesuffix("_seconds"): list[float]() for name in StackCosts.model_fields
        }

    def add(
        self, reports: Sequence[SyntheticJobReport], history: GroupHistory, bandwidth: float
    ) -> None:
        """``bandwidth``: the sim agent's bytes a second."""
        samples = self.samples
        for report in reports:
            iteration = report.spec.iteration or []
            for index, phase in enumerate(report.phases):
                nominal = iteration[index % len(iteration)].seconds if iteration else None
                if nominal is not None:
                    samples["overrun"].append(phase.end - phase.start - nominal)
        client = {(r.spec.job, t.epoch): t for r in reports for t in r.turns}
        switches = {s.epoch: s for s in history.switches if s.ok}
        turns = sorted(history.turns, key=lambda t: t.epoch)
        for turn in turns:
            mine = client.get((turn.job, turn.epoch))
            if mine is None:
                continue
            samples["message"].append(turn.requested_at - mine.requested)
            samples["yield"].append(mine.yielded - mine.work_end)
            if turn.epoch not in switches and turn.granted_at - turn.requested_at < 1e-3:
                samples["acquire"].append(mine.granted - mine.requested)
        for previous, turn in itertools.pairwise(turns):
            switch = switches.get(turn.epoch)
            mine = client.get((turn.job, turn.epoch))
            if switch is None or mine is None:
                continue
            if turn.requested_at < previous.released_at:
                # It waited: the switch is planned on the holder's yield.
                samples["plan"].append(switch.started_at - previous.released_at)
            transfer = switch.bytes_moved / bandwidth
            samples["switch"].append(switch.finished_at - switch.started_at - transfer)
            samples["grant"].append(mine.granted - switch.finished_at)

    def costs(self, capped: bool = True) -> StackCosts:
        """``capped`` False: the plain means, which add up to exactly what
        the recorded jobs spent."""
        defaults = StackCosts()

        def mean(samples: list[float], default: float) -> float:
            if not samples:
                return default
            cap = STALL * max(0.0, statistics.median(samples)) if capped else float("inf")
            return max(0.0, statistics.fmean(min(sample, cap) for sample in samples))

        return StackCosts(**{
            f"{name}_seconds": mean(samples, getattr(defaults, f"{name}_seconds"))
            for name, samples in self.samples.items()
        })  # fmt: skip

    def counts(self) -> str:
        acquires, yields, switches = (len(self.samples[n]) for n in ("acquire", "yield", "switch"))
        return f"{acquires} immediate acquires, {yields} yields, {switches} switches"
