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
from collections.abc import Iterable
from dataclasses import dataclass

from trainsentry.jobs import member_of
from trainsentry.jobs.identity import MAX_RANKS_COMPARED
from trainsentry.rules import model as m
from trainsentry.rules.condition import RunView, fmt

# Steps held for a rank that lags behind the others (a hang, a slow reader): beyond
# this many, the oldest are dropped uncompared, so a job whose rank stopped costs a
# bounded few kB per series. A live job's ranks are within a step or two of each other;
# a backfill reads one rank's file after another, each within this many steps' reach.
MAX_PENDING_STEPS = 1024
# compared steps whose median deviation makes a band's typical spread: a median of
# medians, a sort of this many floats a compared step (the pooled deviations of every
# rank were a sort of 4,096, half a fleet's cross-rank cost)
MAX_SPREAD_STEPS = 256
NO_STEP = -(2**62)


@dataclass(frozen=True, slots=True)
class Said:
    """What a verdict rests on, said in words only when an alert shows it: a compared
    step makes one per rank, and most are quiet."""

    name: str  # "rank 3"
    value: float
    median: float  # of the other ranks
    pace: float | None = None  # a straggler's: the job's seconds per step
    ranks: tuple[float, ...] = ()  # a band's: every rank's value at the step
    typical: float = math.nan  # a band's: the ranks' typical log-distance

    def text(self) -> str:
        value, median = self.value, self.median
        if self.ranks:
            shown = ", ".join(fmt(v) for v in sorted(self.ranks)[:16])
            keep = (
                f"x{fmt(math.exp(self.typical))}"
                if math.isfinite(self.typical)
                else "a band not learned yet"
            )
            return (
                f"of {self.name} is {fmt(value)}, x{fmt(value / median)} the other ranks' "
                f"median {fmt(median)} (ranks at this step: {shown}; they keep within {keep} "
                "of each other)"
            )
        excess, pace = value - median, self.pace
        times = f"x{fmt(value / median)}" if median > 0 else "above"
        share = f", {excess / pace:.0%} of the job's {fmt(pace)} s step" if pace else ""
        return (
            f"of {self.name} is {fmt(value)}, {times} the other ranks' median "
            f"{fmt(median)} (+{fmt(excess)} a step{share})"
        )


@dataclass(frozen=True, slots=True)
class Judged:
    """One rank's verdict at a compared step."""

    run: str
    step: int
    wall: float
    value: float
    verdict: int
    said: Said


class RankComparison:
    """One rule on one tag across the ranks of one group (see the module)."""

    def __init__(self, spec: m.AcrossRanks, expected: Iterable[str] = ()) -> None:
        self.spec = spec
        self.latest: dict[str, int] = {}  # each rank's newest step of the series
        self.names: dict[str, str] = {}  # run → how a message names it ("rank 3")
        self.steps: dict[int, dict[str, tuple[float, float]]] = {}  # step → run → (wall, value)
        self.frontier = NO_STEP  # every rank has passed every step below it
        self.last_compared: dict[str, tuple[int, float]] = {}  # run → (step, wall), for pace
        # the median log-distance of the ranks at each past compared step
        self.spread: deque[float] = deque(maxlen=MAX_SPREAD_STEPS)
        self.compared = 0  # steps compared with at least min_ranks ranks
        for run in expected:
            self.expect(run)

    def expect(self, run: str) -> None:
        """A rank whose log is followed but not read yet (a backfill reads one rank's file
        after another): the others' steps wait for it, so the order the files are read
        in changes no verdict."""
        if run not in self.latest and len(self.latest) < MAX_RANKS_COMPARED:
            self.latest[run] = NO_STEP
            rank = member_of(run).rank
            self.names[run] = f"rank {rank}" if rank is not None else run

    def push(self, run: str, step: int, wall: float, value: float) -> list[Judged]:
        """A rank's point; the verdicts of the steps it completed, in step order."""
        latest = self.latest.get(run)
        if latest is None:
            if len(self.latest) >= MAX_RANKS_COMPARED:
                return []
            self.expect(run)
            latest = NO_STEP
        elif step < latest:  # resumed from a checkpoint: the ranks start comparing afresh
            self._reset()
        self.latest[run] = step
        self.steps.setdefault(step, {})[run] = (wall, value)
        if len(self.steps) > MAX_PENDING_STEPS:
            return self._overflow()
        if latest > self.frontier:
            return []  # this rank was ahead of the slowest: nothing new is complete
        return self._complete()

    def _overflow(self) -> list[Judged]:
        """More steps held than the bound: a rank expected but silent does not log this
        series (it leaves), else the oldest step goes uncompared."""
        silent = [run for run, step in self.latest.items() if step == NO_STEP]
        if silent:
            out: list[Judged] = []
            for run in silent:
                out.extend(self.leave(run))
            return out
        del self.steps[next(iter(self.steps))]  # the first held: the oldest but for rewinds
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
        self.latest = dict.fromkeys(self.latest, NO_STEP)
        self.frontier = NO_STEP

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
            slow = value > 0 and value >= factor * max(median, 0.0)
            if slow and spec.min_share:
                slow = pace is not None and value - median >= spec.min_share * pace
            said = Said(self.names[run], value, median, pace=pace)
            out.append(Judged(run, step, wall, value, m.ACTIVE if slow else m.QUIET, said))
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
        ranks = tuple(values[r][1] for r in runs)
        medians = _medians_of_others(list(ranks))
        deviations = []
        out = []
        for run, median in zip(runs, medians, strict=True):
            wall, value = values[run]
            deviation = abs(math.log(value / median))
            deviations.append(deviation)
            verdict = m.ACTIVE if deviation >= least else m.QUIET
            said = Said(self.names[run], value, median, ranks=ranks, typical=typical)
            out.append(Judged(run, step, wall, value, verdict, said))
        self.spread.append(statistics.median(deviations))
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
        self.said: Said | None = None

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        return None  # judged with the other ranks, by the engine

    def evidence(self) -> str:
        return self.said.text() if self.said is not None else "has no other ranks to compare with"
