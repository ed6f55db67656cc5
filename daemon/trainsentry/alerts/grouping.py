"""When a notification may leave: group wait, repeat interval, rate limit, backoff.

Alertmanager's timing, per run instead of per label set: a run that goes bad
usually trips several rules within seconds (loss spike, gradient growth,
non-finite), and one message saying so beats three. So warnings wait
`group_wait` for company; criticals leave at once and take whatever of their
run is waiting along (the outbox's `take`). A still-firing alert is said again
after `repeat_interval`, so a page that scrolled away comes back. And a rate
limit per receiver holds messages back when a flapping run would flood a
channel; what is held leaves together, as one message per run.

The waiting itself lives in the outbox rows (`due`), not in memory, so a
warning held for its group wait survives a crash like any other row. The
firing book (what is firing now, since when, who was told) lives in memory
and is saved with the engine's state (snapshot.py), so after a restart what
was firing is still repeated, re-sent to Alertmanager, and resolved.

A page means "act now", so a person gets one per run per incident (a run and
the runs in its sub-directories are one job's, and so are the ranks and attempts
of one job: `jobs.same_job`). Once a
run's first critical has been told to a receiver, its later criticals (the
epoch loss after the step loss, every layer's norm after the total) join that
incident: they leave together at most every `group_interval`, as an update,
not as pages of their own; warnings after any told alert of the run do the
same. A resolve the data made ("recovered", "settled at a new level ...") is held the route's group
interval before it is told: if the alert fires again meanwhile it was one alert all along (flap
damping), and neither the resolve nor the re-fire is sent; another alert of the
run that fires meanwhile joins the incident the held resolve belongs to (the
run is not back: its loss fell under the critical's line and not under the
warning's). A resolve for any
other reason (run finished, deleted) is told at once, and so is any resolve
to a route without a group interval (Alertmanager, which groups by itself;
such a route is told the re-fire too).

Every function takes `now`: the delivery workers and the tests pass the clock
in, so nothing here sleeps or reads the time.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsentry.alert import AlertKey, Notice, NoticeKind, Transition
from trainsentry.alerts.route import Route
from trainsentry.jobs import same_job

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0  # an endpoint down for a day is retried every ~5 minutes


def due_time(route: Route, severity: str, now: float, joins: float | None = None) -> float:
    """Criticals at once; warnings (and resolves of warnings) after the group wait; an
    alert joining an incident told at `joins` no sooner than a group interval after it."""
    due = now if severity == "critical" else now + route.group_wait
    if joins is not None and route.group_interval > 0:
        due = max(due, joins + route.group_interval)
    return due


def rate_allowed_at(route: Route, sent_times: Sequence[float], now: float) -> float:
    """The earliest time the receiver may take another message (now, if not limited).

    `sent_times` are this receiver's deliveries within the last period, oldest
    first (the outbox's sent log, so a restart does not reset the limit).
    """
    if route.rate_limit is None:
        return now
    count, period = route.rate_limit
    recent = [t for t in sent_times if t > now - period]
    if len(recent) < count:
        return now
    return recent[-count] + period


def backoff(attempts: int, rng: Callable[[], float] = random.random) -> float:
    """Exponential backoff with jitter: 1 s, 2 s, 4 s ... capped at 5 minutes.

    The jitter (50-100 % of the step) keeps daemons that lost the same
    endpoint at the same moment from retrying in lockstep when it returns.
    """
    step = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2.0 ** min(max(0, attempts), 30))
    return step * (0.5 + 0.5 * rng())


@dataclass(slots=True)
class Firing:
    """One alert that is firing now, as the notifier told it."""

    alert: Transition  # the latest firing transition
    since: float  # daemon clock when it first fired
    shown: bool  # False for history older than the horizon: nobody was told
    receivers: dict[str, float] = field(default_factory=dict)  # receiver → last told
    repeats: dict[str, int] = field(default_factory=dict)  # receiver → repeats sent
    first_step: int | None = None  # where the shown firing began
    first_wall: float | None = None
    threshold: float | None = None
    link: str | None = None
    incident: str | None = None  # its bundle's path
    # A resolve the data made held for flap damping: its notifications and when they go
    resolving: list[Any] | None = None  # the outbox entries, written at `resolve_at`
    resolve_at: float = 0.0
    told_severity: str = ""  # the highest severity its receivers were told
    resolved_to: frozenset[str] = frozenset()  # receivers told the held resolve at once

    def notice(self, kind: NoticeKind, now: float, actions: tuple[str, ...] = ()) -> Notice:
        """What a firing or a repeat of this alert tells its receivers."""
        return Notice(
            self.alert, kind, now, since=self.since, threshold=self.threshold, link=self.link,
            incident=self.incident, first_step=self.first_step, first_wall=self.first_wall,
            actions=actions,
        )  # fmt: skip


class FiringBook:
    """What is firing, keyed like `Transition.key`: (run, rule, metric)."""

    def __init__(self) -> None:
        self._firing: dict[AlertKey, Firing] = {}

    def fire(self, alert: Transition, now: float, shown: bool) -> Firing:
        """A firing or escalation: an escalation keeps `since` and whom it told."""
        entry = self._firing.get(alert.key)
        if entry is None:
            entry = self._firing[alert.key] = Firing(alert, now, shown)
        else:
            entry.alert = alert
            entry.shown = entry.shown or shown
        return entry

    def resolve(self, key: AlertKey) -> Firing | None:
        return self._firing.pop(key, None)

    def get(self, key: AlertKey) -> Firing | None:
        return self._firing.get(key)

    def joins(self, run: str, receiver: str, key: AlertKey, critical: bool) -> float | None:
        """When `receiver` was last told of an open incident of `run` that an alert `key`
        would join (None: it opens one). A critical joins only an incident already paged
        with a critical: a critical after warnings is the page."""
        told = [
            when
            for e in self._incident(run, key)
            if (not critical or e.told_severity == "critical")
            and (when := e.receivers.get(receiver)) is not None
        ]
        return max(told, default=None)

    def opener(self, run: str, key: AlertKey) -> Firing | None:
        """The first-told alert of the open incident of `run`'s job, other than `key`."""
        told = [e for e in self._incident(run, key) if e.receivers]
        return min(told, key=lambda e: min(e.receivers.values()), default=None)

    def _incident(self, run: str, key: AlertKey) -> Iterator[Firing]:
        """The alerts of `run`'s job's open incident, but `key`: those firing and those whose
        resolve the data made is held. An alert that fires as another of its run recovers (a
        loss that fell back under the critical's line but stayed above the warning's) is
        the same incident going on, told as its update, not a new one."""
        for k, e in self._firing.items():
            if k != key and same_job(k[0], run):
                yield e

    def due_resolves(self, now: float) -> list[Any]:
        """The held resolves whose hold is over; their alerts leave the book."""
        out: list[Any] = []
        for key, entry in list(self._firing.items()):
            if entry.resolving is not None and entry.resolve_at <= now:
                out.extend(entry.resolving)
                del self._firing[key]
        return out

    def due_repeats(self, routes: Sequence[Route], now: float) -> list[tuple[Firing, Route]]:
        """(alert, route) pairs whose last message to that route is a repeat interval old."""
        out = []
        by_receiver = {r.receiver: r for r in routes}
        for entry in self._firing.values():
            if entry.resolving is not None:
                continue
            for receiver, told in entry.receivers.items():
                route = by_receiver.get(receiver)
                repeat = route.repeat_interval if route is not None else 0.0
                if route is not None and repeat > 0 and now - told >= repeat:
                    out.append((entry, route))
        return out

    def __len__(self) -> int:
        """Alerts firing now (a held resolve's alert is no longer)."""
        return sum(e.resolving is None for e in self._firing.values())
