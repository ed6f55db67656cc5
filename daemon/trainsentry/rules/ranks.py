"""One rule on one series across the ranks of a job: a straggler, a rank that diverges.

In synchronous data parallel every rank steps at the pace of the slowest, so
a straggler never shows in its own step pace; it shows in the time the rank
spends on its own before the first collective of a step (waiting for its
batch, its forward pass), above the other ranks' at the same step. A rank fed
a bad shard, or with a silent hardware fault, shows as its loss leaving the
band the ranks' losses keep at the same step. So these rules compare ranks
point for point at equal steps, never a rank with its own past.

A step is compared once every rank of the group has passed it (logged a
later point of the series): then each rank's value at that step is in, in
whatever order the ranks' files were read, and the verdict is the same live
and in `replay`. The last step of a run that stops is never compared; a job
that stops stepping is the hang rules' (jobs/hang.py), not these.

Each rank of the group keeps one alert (its run, the rule, its tag), and its
lifecycle (`for`, `keep_firing_for`) runs on that rank's own steps and
stamps, as every alert's does. Only ranks are compared: a run that is no rank
of a job (jobs/identity.py) is never judged by these rules.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from trainsentry.jobs import member_of
from trainsentry.jobs.identity import MAX_RANKS_COMPARED
from trainsentry.rules import model as m
from trainsentry.rules.condition import RunView, fmt

# Steps held for a rank that lags behind the others (a hang, a slow reader): beyond
# this many, the oldest are dropped uncompared, so a job whose rank stopped costs a
# bounded few kB per series. A live job's ranks are within a step or two of each other.
MAX_PENDING_STEPS = 1024
# deviations (one per rank a compared step) kept for a band's typical spread
MAX_SPREAD = 4096


@dataclass(frozen=True, slots=True)
class Judged:
    """One rank's verdict at a compared step."""

    run: str
    step: int
    wall: float
    value: float
    verdict: int
    evidence: str


class RankComparison:
    """One rule on one tag across the ranks of one group (see the module)."""

    def __init__(self, spec: m.AcrossRanks) -> None:
        self.spec = spec
        self.latest: dict[str, int] = {}  # each rank's newest step of the series
        self.names: dict[str, str] = {}  # run → how a message names it ("rank 3")
        self.steps: dict[int, dict[str, tuple[float, float]]] = {}  # step → run → (wall, value)
        self.frontier = -(2**62)  # every rank has passed every step below it
        self.last_compared: dict[str, tuple[int, float]] = {}  # run → (step, wall), for pace
        self.spread: deque[float] = deque(maxlen=MAX_SPREAD)  # |log ratio| of past steps
        self.compared = 0  # steps compared with at least min_ranks ranks

    def push(self, run: str, step: int, wall: float, value: float) -> list[Judged]:
        """A rank's point; the verdicts of the steps it completed, in step order."""
        latest = self.latest.get(run)
        if latest is None:
            if len(self.latest) >= MAX_RANKS_COMPARED:
                return []
            rank = member_of(run).rank
            self.names[run] = f"rank {rank}" if rank is not None else run
        elif step < latest:  # resumed from a checkpoint: the ranks start comparing afresh
            self._reset()
        self.latest[run] = step
        self.steps.setdefault(step, {})[run] = (wall, value)
        if len(self.steps) > MAX_PENDING_STEPS:
            del self.steps[min(self.steps)]
        if latest is not None and latest > self.frontier:
            return []  # this rank was ahead of the slowest: nothing new is complete
        return self._complete()

    def leave(self, run: str) -> list[Judged]:
        """A rank whose run ended: the others' steps no longer wait for it."""
        if self.latest.pop(run, None) is None:
            return []
        self.names.pop(run, None)
        self.last_compared.pop(run, None)
        for values in self.steps.values():
            values.pop(run, None)
        return self._complete()

    def _reset(self) -> None:
        self.steps.clear()
        self.last_compared.clear()
        self.latest = dict.fromkeys(self.latest, -(2**62))
        self.frontier = -(2**62)

    def _complete(self) -> list[Judged]:
        if not self.latest:
            return []
        frontier = min(self.latest.values())
        if frontier <= self.frontier:
            return []
        self.frontier = frontier
        done = sorted(s for s in self.steps if s < frontier)
        out: list[Judged] = []
        for step in done:
            out.extend(self._judge(step, self.steps.pop(step)))
        return out

    def _judge(self, step: int, values: dict[str, tuple[float, float]]) -> list[Judged]:
        finite = {r: wv for r, wv in values.items() if math.isfinite(wv[1])}
        pace = self._pace(step, finite)
        if len(finite) < self.spec.min_ranks:
            return []
        self.compared += 1
        if self.spec.above_median is not None:
            return self._stragglers(step, finite, pace)
        return self._outside_band(step, finite)

    def _pace(self, step: int, values: dict[str, tuple[float, float]]) -> float | None:
        """The median rank's seconds per step since its last compared step, on its own
        stamps: the scale a straggler's excess is measured against, at any cadence."""
        paces = []
        for run, (wall, _) in values.items():
            before = self.last_compared.get(run)
            if before is not None and step > before[0] and wall > before[1]:
                paces.append((wall - before[1]) / (step - before[0]))
            self.last_compared[run] = (step, wall)
        return statistics.median(paces) if paces else None

    def _stragglers(
        self, step: int, values: dict[str, tuple[float, float]], pace: float | None
    ) -> list[Judged]:
        spec = self.spec
        factor = spec.above_median
        assert factor is not None
        runs = list(values)
        medians = _medians_of_others([values[r][1] for r in runs])
        out = []
        for run, median in zip(runs, medians, strict=True):
            wall, value = values[run]
            excess = value - median
            slow = value > 0 and value >= factor * max(median, 0.0)
            if slow and spec.min_share:
                slow = pace is not None and excess >= spec.min_share * pace
            times = f"x{fmt(value / median)}" if median > 0 else "above"
            share = f", {excess / pace:.0%} of the job's {fmt(pace)} s step" if pace else ""
            evidence = (
                f"of {self.names[run]} is {fmt(value)}, {times} the other ranks' median "
                f"{fmt(median)} (+{fmt(excess)} a step{share})"
            )
            out.append(Judged(run, step, wall, value, m.ACTIVE if slow else m.QUIET, evidence))
        return out

    def _outside_band(self, step: int, values: dict[str, tuple[float, float]]) -> list[Judged]:
        spec = self.spec
        band = spec.outside_band
        assert band is not None
        runs = [r for r, (_, v) in values.items() if v > 0]  # a log-ratio band: positive only
        if len(runs) < spec.min_ranks:
            return []
        typical = statistics.median(self.spread) if self.spread else math.nan
        learned = self.compared > spec.learn and math.isfinite(typical)
        least = max(math.log(spec.min_ratio), band * typical) if learned else math.inf
        shown = ", ".join(fmt(v) for v in sorted(values[r][1] for r in runs)[:16])
        keep = f"x{fmt(math.exp(typical))}" if math.isfinite(typical) else "a band not learned yet"
        medians = _medians_of_others([values[r][1] for r in runs])
        deviations = []
        out = []
        for run, median in zip(runs, medians, strict=True):
            wall, value = values[run]
            deviation = abs(math.log(value / median))
            deviations.append(deviation)
            evidence = (
                f"of {self.names[run]} is {fmt(value)}, x{fmt(value / median)} the other ranks' "
                f"median {fmt(median)} (ranks at this step: {shown}; they keep within {keep} "
                "of each other)"
            )
            verdict = m.ACTIVE if deviation >= least else m.QUIET
            out.append(Judged(run, step, wall, value, verdict, evidence))
        self.spread.extend(deviations)
        return out


def _medians_of_others(values: list[float]) -> list[float]:
    """For each value, the median of all the others: one sort, not one per rank (a job of
    thousands of ranks compares each step)."""
    n = len(values)
    order = sorted(range(n), key=values.__getitem__)
    ordered = [values[i] for i in order]
    place = [0] * n
    for position, i in enumerate(order):
        place[i] = position
    low, high = (n - 2) // 2, (n - 1) // 2  # the middle of the n - 1 others

    def at(j: int, skipped: int) -> float:
        return ordered[j] if j < skipped else ordered[j + 1]

    return [(at(low, place[i]) + at(high, place[i])) / 2 for i in range(n)]


class RankSeat:
    """An alert's condition for one rank of a comparison: the verdicts come from the
    comparison when a step is complete (engine.py settles them), not from its own point."""

    __slots__ = ("comparison", "said")

    def __init__(self, comparison: RankComparison | None) -> None:
        self.comparison = comparison  # None: the run is no rank of a job
        self.said = "has no other ranks to compare with"

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        return None  # judged with the other ranks, by the engine

    def evidence(self) -> str:
        return self.said
