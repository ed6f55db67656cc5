"""What a fleet's Prometheus needs of each rank a daemon follows: its step, its pace, the
node it runs on, its latest values of the series ranks are compared on, its last error.

Every node runs its own daemon, and no daemon sees a whole multi-node job; so
each exports its ranks on /metrics and Prometheus compares them across nodes
(deploy/prometheus/). The engine's cross-rank rules judge the ranks one daemon
sees; this book is only what is shown, kept per ranked run in a few hundred
bytes: the pace is the median of the last intervals between its points
(seconds per step, on the writer's own stamps), the values the latest of each
exported series, the node the daemon's `node` setting, else the host the probe's
meta record names, else the daemon's host.
"""

from __future__ import annotations

import logging
import math
import socket
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainsentry.jobs import member_of
from trainsentry.jobs.identity import MAX_RANKS_COMPARED
from trainsentry.point import ProbeMark, Row, TextEvent
from trainsentry.sources.names import safe_name

log = logging.getLogger(__name__)

# the series a rank's latest value is exported of (canonical names, rules/aliases.py): what
# the cross-rank rules compare, and what a job's dashboard shows per rank
EXPORTED = ("data_wait", "forward_time", "step_time", "loss", "grad_norm", "gpu_util")
# Where a value comes from, as Prometheus compares ranks only within one: the probe's
# `data_wait` is all a rank does outside its forward, backward and optimizer step (its
# logging, a checkpoint), a job's own `data_time` only its data loader's wait; one job often
# has both kinds of rank runs (the probe's files and torchrun's per-rank logs), and in one
# median the probe's ranks would all look slow.
PROBE_PREFIX = "probe/"
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
    values: dict[tuple[str, str], float] = field(default_factory=dict)  # (series, source)
    last_error: str = ""

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.intervals) if self.intervals else math.nan


class RankBook:
    """The ranks of jobs this daemon follows (see the module)."""

    def __init__(self, node: str | None, canonical: Callable[[str], str]) -> None:
        # The node set in the config names every rank this daemon follows (a daemon beside
        # each node); unset, the host a probe's meta record names, else this host.
        self.node = node or socket.gethostname() or "localhost"
        self._node_set = node is not None
        self._canonical = canonical  # a tag's canonical name (the engine's alias table)
        # tag → its exported (canonical, source), or None
        self._exported: dict[str, tuple[str, str] | None] = {}
        self._ranks: dict[str, RankState] = {}
        self._groups: dict[str, int] = {}  # group → its ranks seen

    def _rank(self, run: str) -> RankState | None:
        state = self._ranks.get(run)
        if state is None:
            member = member_of(run)
            if member.rank is None:
                return None
            state = self._ranks[run] = RankState(member.job, member.rank, member.attempt, self.node)
            self._counted(member.group)
        return state

    def _counted(self, group: str) -> None:
        """Said once: a group of more ranks than one comparison takes (rules/ranks.py)."""
        n = self._groups[group] = self._groups.get(group, 0) + 1
        if n == MAX_RANKS_COMPARED + 1:
            log.warning(
                "%s has more than %d ranks: the ranks past the first %d are judged as runs of"
                " their own, not compared with the others",
                safe_name(group),
                MAX_RANKS_COMPARED,
                MAX_RANKS_COMPARED,
            )

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
                if tag not in exported:
                    exported[tag] = _exported(tag, self._canonical(tag))
                key = exported[tag]
                if key is not None:
                    state.values[key] = value

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
        if self._node_set:
            return
        for mark in marks:
            if mark.kind == "meta" and mark.host:
                state = self._rank(mark.run)
                if state is not None:
                    state.node = mark.host

    def of(self, run: str) -> RankState | None:
        return self._ranks.get(run)

    def forget(self, run: str) -> None:
        if self._ranks.pop(run, None) is not None:
            group = member_of(run).group
            self._groups[group] -= 1
            if not self._groups[group]:
                del self._groups[group]


def _exported(tag: str, canonical: str) -> tuple[str, str] | None:
    if canonical not in EXPORTED:
        return None
    return canonical, "probe" if tag.startswith(PROBE_PREFIX) else "log"
