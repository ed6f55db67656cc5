"""What a fleet's Prometheus needs of each rank a daemon follows: its step, its pace, the
node it runs on, its latest values of the series ranks are compared on, its last error.

Every node runs its own daemon, and no daemon sees a whole multi-node job; so
each exports its ranks on /metrics and Prometheus compares them across nodes
(deploy/prometheus/). The engine's cross-rank rules judge the ranks one daemon
sees; this book is only what is shown, kept per ranked run in a few hundred
bytes: the pace is the median of the last intervals between its points
(seconds per step, on the writer's own stamps), the values the latest of each
exported series, the node the one the probe's meta record names, else the
daemon's own.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainsentry.jobs import member_of
from trainsentry.point import ProbeMark, Row, TextEvent

# the series a rank's latest value is exported of (canonical names, rules/aliases.py): what
# the cross-rank rules compare, and what a job's dashboard shows per rank
EXPORTED = ("data_wait", "forward_time", "step_time", "loss", "grad_norm", "gpu_util")
PACE_INTERVALS = 9  # the median of this many: one checkpoint pause is not the pace
ERROR_CHARS = 200  # of a last error line, as a label: Prometheus keeps labels short


@dataclass(slots=True)
class RankState:
    """One ranked run as the fleet sees it."""

    job: str
    rank: int
    attempt: int | None
    node: str
    step: int = 0
    wall: float = math.nan
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_INTERVALS))
    values: dict[str, float] = field(default_factory=dict)
    last_error: str = ""

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.intervals) if self.intervals else math.nan


class RankBook:
    """The ranks of jobs this daemon follows (see the module)."""

    def __init__(self, node: str, canonical: Callable[[str], str]) -> None:
        self.node = node  # the daemon's own, for ranks no record names a host of
        self._canonical = canonical  # a tag's canonical name (the engine's alias table)
        self._exported: dict[str, str | None] = {}  # tag → its exported canonical, or None
        self._ranks: dict[str, RankState] = {}

    def _rank(self, run: str) -> RankState | None:
        state = self._ranks.get(run)
        if state is None:
            member = member_of(run)
            if member.rank is None:
                return None
            state = self._ranks[run] = RankState(member.job, member.rank, member.attempt, self.node)
        return state

    def rows(self, run: str, rows: list[Row]) -> None:
        """A ranked run's new records: its step, its pace, its exported values."""
        if not rows or not member_of(run).ranked:
            return
        state = self._rank(run)
        assert state is not None
        exported = self._exported
        for step, wall, tags, values in rows:
            if step > state.step and math.isfinite(state.wall) and wall > state.wall:
                state.intervals.append((wall - state.wall) / (step - state.step))
            if step != state.step or not math.isfinite(state.wall):
                state.step, state.wall = step, wall
            for tag, value in zip(tags, values, strict=True):
                name = exported.get(tag, "")
                if name == "":
                    canonical = self._canonical(tag)
                    name = exported[tag] = canonical if canonical in EXPORTED else None
                if name is not None:
                    state.values[name] = value

    def events(self, events: Iterable[TextEvent]) -> None:
        """A rank's text: its last error line (a traceback's exception line, an error)."""
        for event in events:
            if event.kind in ("traceback", "report") or event.level in ("error", "critical"):
                state = self._rank(event.run)
                if state is not None and event.lines:
                    state.last_error = event.lines[-1 if event.kind == "traceback" else 0][
                        :ERROR_CHARS
                    ]

    def marks(self, marks: Iterable[ProbeMark]) -> None:
        """The probe's meta record names the host a rank runs on."""
        for mark in marks:
            if mark.kind == "meta" and mark.host:
                state = self._rank(mark.run)
                if state is not None:
                    state.node = mark.host

    def of(self, run: str) -> RankState | None:
        return self._ranks.get(run)

    def forget(self, run: str) -> None:
        self._ranks.pop(run, None)
