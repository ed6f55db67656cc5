"""A collective hang, said by the rank that caused it rather than by the ranks that waited.

When one rank of a job stops before a collective (a data loader that hangs,
an exception caught and swallowed, a rank stuck in I/O), every other rank
waits in that collective until the process group's timeout, then raises:
gloo's "Timed out waiting ... for recv operation", NCCL's watchdog report.
Each such report is a crash of the rank that logged it, and torchrun names
the first of them as the root cause, which is a rank that did nothing wrong.
The rank the others waited for is the one that did *not* time out.

So a pattern rule marked `collective_timeout` does not fire at once on a rank
of a job: its report waits here until every rank of the group but one has
reported and a second passed with no other report (that one is blocked), or
`grace` seconds after the first report (those that have not reported are);
then the `collective_hang` rule fires on the blocked rank, quoting the timeout
lines, and the held reports fire after it, in the same incident. Runs that
are no ranks of a job fire as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainsentry.jobs import member_of
from trainsentry.point import TextEvent
from trainsentry.rules import model as m


@dataclass(frozen=True, slots=True)
class Report:
    """A rank's timeout, held: what `LogEngine._matched` fires once the hang is decided (its
    rule's regex matched again then: a match object cannot be saved with the alert state)."""

    run: str
    rule: m.Rule
    event: TextEvent
    step: int
    wall: float


@dataclass(slots=True)
class Wait:
    """The timeouts reported in one group (one attempt of a job), first report first."""

    group: str
    first_wall: float
    last_wall: float
    reports: dict[str, Report] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    group: str
    blocked: tuple[str, ...]  # the runs of ranks that did not time out, by rank
    reports: tuple[Report, ...]  # the held timeouts, by rank


# The ranks of a job that waited in one collective time out within milliseconds of each
# other (they began waiting together, with one timeout); their reports are read within a
# cycle or two. Once every rank but one has reported, a second with no new report says
# the last one is not coming: it is the blocked rank, not a report still on its way.
SETTLE_SECONDS = 1.0


def by_rank(run: str) -> tuple[int, str]:
    rank = member_of(run).rank
    return (rank if rank is not None else -1, run)


class HangWatch:
    """The held timeouts of each group, and when they are decided (see the module)."""

    def __init__(self, rule: m.Rule | None) -> None:
        self.rule = rule  # the collective_hang rule; None: timeouts fire as they come
        self._waits: dict[str, Wait] = {}

    @property
    def grace(self) -> float:
        spec = self.rule.condition if self.rule is not None else None
        return spec.grace if isinstance(spec, m.CollectiveHang) else 0.0

    def hold(self, report: Report, ranks: set[str]) -> bool:
        """Hold a rank's timeout until the hang is decided; False (fire it now) for a run
        that is no rank of a job, or where no hang rule is loaded."""
        member = member_of(report.run)
        if self.rule is None or not member.ranked or len(ranks) < 2:
            return False
        wall = report.wall if math.isfinite(report.wall) else 0.0
        wait = self._waits.get(member.group)
        if wait is None:
            wait = self._waits[member.group] = Wait(member.group, wall, wall)
        if report.run not in wait.reports:
            wait.reports[report.run] = report
            wait.last_wall = max(wait.last_wall, wall)
        return True

    @property
    def waiting(self) -> bool:
        return bool(self._waits)

    def due(self, now: float, ranks_of: dict[str, set[str]]) -> list[Verdict]:
        """The groups decided by now: every rank but one reported and no other report came
        for SETTLE_SECONDS, or the grace is over (`now` inf: everything held, as at the end
        of a replay)."""
        out = []
        for group, wait in list(self._waits.items()):
            ranks = ranks_of.get(group, set()) | set(wait.reports)
            silent = ranks - set(wait.reports)
            settled = len(silent) <= 1 and now >= wait.last_wall + SETTLE_SECONDS
            if not settled and now < wait.first_wall + self.grace:
                continue
            del self._waits[group]
            reports = tuple(sorted(wait.reports.values(), key=lambda r: by_rank(r.run)))
            out.append(Verdict(group, tuple(sorted(silent, key=by_rank)), reports))
        return out

    def reload(self, rule: m.Rule | None) -> list[Verdict]:
        """A new hang rule (or none): what was held is decided now, with what it has."""
        held = self.due(math.inf, {}) if rule != self.rule else []
        self.rule = rule
        return held
