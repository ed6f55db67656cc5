"""The notification stage's front door: the main loop hands it transitions.

`submit` runs on the main loop, between evaluating a cycle's points and
committing their read offsets, and does only local, quick work: it saves the
incident bundle, writes the stop file of a rule that asks for one, and writes
one outbox row per receiver that wants the alert — all before the offsets
commit, so a crash re-derives what was not yet written. The network is left
to the delivery workers (dispatch.py), one per receiver.

History is not news: transitions of data older than the horizon (`since`,
the same one the terminal uses) update the firing book but tell no one, and
the resolve of an alert nobody was told about is not sent either.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsentry.actions.stop_file import stop_file_path, write_stop_file
from trainsentry.alert import Command, Notice, Transition, went_quiet
from trainsentry.alerts.dispatch import Lane
from trainsentry.alerts.grouping import Firing, FiringBook, due_time
from trainsentry.alerts.incident import write_bundle
from trainsentry.alerts.message import link_for
from trainsentry.alerts.outbox import Entry, Outbox
from trainsentry.alerts.plot import Plotter
from trainsentry.alerts.route import Route
from trainsentry.rules import model as m
from trainsentry.sinks.base import Sink
from trainsentry.store import Store

log = logging.getLogger(__name__)

COMMAND_ROUTE = Route(
    "command", "command", group_wait=0.0, repeat_interval=0.0, rate_limit=None, batch=False
)


def make_sink(route: Route) -> Sink:
    if route.kind == "apprise":
        from trainsentry.sinks.apprise_sink import AppriseSink

        return AppriseSink(route.url, route.timeout)
    if route.kind == "alertmanager":
        from trainsentry.sinks.alertmanager import AlertmanagerSink

        return AlertmanagerSink(route.url, route.timeout, resend=route.repeat_interval)
    from trainsentry.actions.command import CommandSink

    return CommandSink()


def notification_key(t: Transition, receiver: str, kind: str) -> str:
    """The idempotency key: the same transition re-derived after a crash gets the same key."""
    wall = t.wall_time if math.isfinite(t.wall_time) else None  # as the alert line has it
    parts = (t.run, t.rule, t.metric, t.state, t.severity, t.step, wall)
    text = "\x1f".join(map(repr, parts)) + f"\x1f{receiver}\x1f{kind}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def threshold_of(rule: m.Rule | None, severity: str) -> float | None:
    """The line to draw on the plot and quote in the message, where the rule has one."""
    c = rule.condition if rule else None
    if isinstance(c, m.Threshold):
        if severity == "critical" and (
            c.critical_above is not None or c.critical_below is not None
        ):
            return c.critical_above if c.critical_above is not None else c.critical_below
        return c.above if c.above is not None else c.below
    if isinstance(c, m.Growth):
        return c.threshold
    return None


def _lower_is_worse(rule: m.Rule | None) -> bool:
    c = rule.condition if rule else None
    return isinstance(c, m.Threshold) and c.above is None and c.below is not None


class Notifier:
    def __init__(
        self,
        routes: Sequence[Route],
        outbox: Outbox,
        *,
        state_dir: Path,
        store: Store | None = None,
        rule_of: Callable[[str], m.Rule | None] = lambda name: None,
        run_dir: Callable[[str], Path | None] = lambda run: None,
        run_meta: Callable[[str], dict[str, Any]] = lambda run: {"run": run},
        since: float = -math.inf,
        link_template: str | None = None,
        control_dir: Path | None = None,
        clock: Callable[[], float] = time.time,
        sinks: dict[str, Sink] | None = None,
    ) -> None:
        self.routes = [*routes, COMMAND_ROUTE]
        self.outbox = outbox
        self.incidents = state_dir / "incidents"
        self.store = store
        self.book = FiringBook()
        self._rule_of = rule_of
        self._run_dir = run_dir
        self._run_meta = run_meta
        self.since = since
        self.link_template = link_template
        self.control_dir = control_dir
        self._clock = clock
        sinks = sinks or {}
        self.lanes = {
            r.receiver: Lane(r, sinks.get(r.receiver) or make_sink(r), outbox, clock=clock)
            for r in self.routes
        }
        self._by_receiver = {r.receiver: r for r in self.routes}
        self.plots = Plotter()  # each incident's PNG beside its bundle
        orphans = outbox.waiting_receivers() - set(self.lanes)
        if orphans:
            log.warning(
                "%d receiver(s) no longer configured have notifications queued; "
                "they are kept until the route is back",
                len(orphans),
            )

    def start(self) -> None:
        for lane in self.lanes.values():
            lane.start()
        self.plots.start()

    # -- the main loop's calls -----------------------------------------------

    def submit(self, transitions: Sequence[Transition], *, relearned: bool = False) -> None:
        """Tell the receivers; `relearned` transitions only update the firing book.

        Relearned ones are re-derived after a restart from points read before it
        (see snapshot.py): their rows are in the outbox already, their incident
        saved and their actions taken, so only the book must learn them again.
        """
        entries: list[Entry] = []
        for t in transitions:
            shown = not (t.wall_time < self.since)  # NaN (no time) is shown
            if t.state == "firing":
                self._firing(t, shown, entries, relearned)
            elif t.state == "resolved":
                self._resolved(t, shown, entries)
        if not relearned:
            self._enqueue(entries)

    def tick(self) -> None:
        """Repeat what is still firing to receivers last told a repeat interval ago."""
        now = self._clock()
        entries: list[Entry] = []
        for entry, route in self.book.due_repeats(self.routes, now):
            n = entry.repeats.get(route.receiver, 0) + 1
            entry.repeats[route.receiver] = n
            entry.receivers[route.receiver] = now
            a = entry.alert
            key = notification_key(a, route.receiver, f"repeat{n}")
            entries.append(
                Entry(key, route.receiver, a.run, a.severity, entry.notice("repeat", now), now)
            )
        entries.extend(self.book.due_resolves(now))
        self._enqueue(entries)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the workers; a send in flight is abandoned and its rows stay queued."""
        for lane in self.lanes.values():
            lane.stop()
        self.plots.stop()  # a plot being drawn finishes in its own process
        deadline = time.monotonic() + timeout
        for lane in self.lanes.values():
            lane.join(max(0.0, deadline - time.monotonic()))
        if all(lane.join(0) for lane in self.lanes.values()):
            self.outbox.close()

    # -- transitions -----------------------------------------------------------

    def _firing(self, t: Transition, shown: bool, entries: list[Entry], relearned: bool) -> None:
        now = self._clock()
        before = self.book.get(t.key)
        flapped = before is not None and before.resolving is not None
        resolved_to: frozenset[str] = frozenset()
        if flapped and before is not None:  # fired again within the hold: it never resolved
            before.resolving, resolved_to = None, before.resolved_to
            before.resolved_to = frozenset()
        entry = self.book.fire(t, now, shown)
        if not shown:
            return
        escalated = t.severity == "critical" and entry.told_severity != "critical"
        if flapped and not escalated and not resolved_to:
            return  # the same alert, still firing as its receivers were told
        rule = self._rule_of(t.rule)
        first = before is None or not before.shown
        if first:
            entry.first_step = t.step
            entry.first_wall = t.wall_time if math.isfinite(t.wall_time) else None
        entry.threshold = threshold_of(rule, t.severity)
        entry.link = link_for(self.link_template, t)
        incident = None if relearned else self._save_incident(t, entry)
        if incident is not None:
            entry.incident = str(incident)
        actions: tuple[str, ...] = ()
        if rule is not None and rule.actions and first and not relearned:
            actions = self._act(t, rule, now, entries)
        notice = entry.notice("firing", now, actions)
        critical = t.severity == "critical"
        opener = self.book.opener(t.run, t.key)
        joining = notice
        if opener is not None:
            a = opener.alert
            step = a.step if opener.first_step is None else opener.first_step
            joining = replace(notice, joins=f"{a.rule} at step {step} of {a.run}")
        for route in self.routes:
            if route.kind == "command" or not route.accepts(t.severity, t.labels):
                continue
            if flapped and not escalated and route.receiver not in resolved_to:
                continue  # its resolve was held: to it, the alert never stopped firing
            key = notification_key(t, route.receiver, "firing")
            joins = self.book.joins(t.run, route.receiver, t.key, critical)
            due = due_time(route, t.severity, now, joins)
            told = joining if joins is not None and route.group_interval > 0 else notice
            entries.append(Entry(key, route.receiver, t.run, t.severity, told, due))
            entry.receivers[route.receiver] = now
        if critical or not entry.told_severity:
            entry.told_severity = t.severity

    def _resolved(self, t: Transition, shown: bool, entries: list[Entry]) -> None:
        entry = self.book.get(t.key)
        # A firing someone was told of gets its resolve, however old its data: the
        # horizon keeps history from paging, not a told alert from ending.
        if entry is None or not entry.shown:
            self.book.resolve(t.key)
            return
        now = self._clock()
        peak, peak_step = self._peak(entry, t)
        held: list[Entry] = []
        hold = 0.0
        told_at_once: list[str] = []
        notice = Notice(
            t, "resolved", now, since=entry.since, reason=t.reason, link=entry.link,
            duration=self._duration(entry, t, now), peak=peak, peak_step=peak_step,
        )  # fmt: skip
        for receiver in entry.receivers:
            route = self._by_receiver.get(receiver)
            if route is None:
                continue
            key = notification_key(t, receiver, "resolved")
            due = due_time(route, t.severity, now)
            told = Entry(key, receiver, t.run, t.severity, notice, due)
            # a resolve the data made ("recovered", "settled at ...") is told once it has
            # stayed so a group interval (flap damping)
            if went_quiet(t.reason) and route.group_interval > 0:
                held.append(told)
                hold = max(hold, route.group_interval)
            else:
                entries.append(told)
                told_at_once.append(receiver)
        if held:
            entry.resolving, entry.resolve_at = held, now + hold
            entry.resolved_to = frozenset(told_at_once)
        else:
            self.book.resolve(t.key)

    def _enqueue(self, entries: list[Entry]) -> None:
        if not entries:
            return
        self.outbox.enqueue(entries)
        for receiver in {e.receiver for e in entries}:
            lane = self.lanes.get(receiver)
            if lane is not None:
                lane.poke()

    # -- evidence and actions --------------------------------------------------

    def _save_incident(self, t: Transition, entry: Firing) -> Path | None:
        if self.store is None:
            return None
        try:
            extra = {"threshold": entry.threshold, "link": entry.link}
            path = write_bundle(self.incidents, t, self.store, self._run_meta(t.run), extra)
        except (OSError, ValueError) as exc:
            log.warning("could not save the incident bundle of %s on %s: %s", t.rule, t.run, exc)
            return None
        self.plots.draw(path)
        return path

    def _act(
        self, t: Transition, rule: m.Rule, now: float, entries: list[Entry]
    ) -> tuple[str, ...]:
        done: list[str] = []
        run_dir = self._run_dir(t.run)
        for action in rule.actions:
            if action.kind == "stop":
                try:
                    path = write_stop_file(stop_file_path(t.run, run_dir, self.control_dir), t)
                    done.append(f"wrote stop file {path}")
                    log.warning("%s on %s: wrote %s", t.rule, t.run, path)
                except OSError as exc:
                    hint = "" if self.control_dir else " (read-only log root? see --control-dir)"
                    done.append(f"stop file NOT written: {exc.strerror or exc}{hint}")
                    log.error("%s on %s: stop file not written: %s%s", t.rule, t.run, exc, hint)
            elif action.kind == "command":
                notice = Notice(
                    t, "action", now, run_dir=str(run_dir) if run_dir else None,
                    command=Command(tuple(action.command), action.timeout),
                )  # fmt: skip
                key = notification_key(t, COMMAND_ROUTE.receiver, f"command:{action.command!r}")
                entries.append(Entry(key, COMMAND_ROUTE.receiver, t.run, t.severity, notice, now))
                done.append(f"runs {action.command[0]}")
        return tuple(done)

    def _duration(self, entry: Firing, t: Transition, now: float) -> float:
        first = entry.first_wall
        if first is not None and math.isfinite(t.wall_time) and t.wall_time >= first:
            return t.wall_time - first
        return now - entry.since

    def _peak(self, entry: Firing, t: Transition) -> tuple[float | None, int | None]:
        """The worst value while it fired, and its step; None where the store cannot tell."""
        series = self.store.get(t.run, t.metric) if self.store is not None else None
        first = entry.first_step if entry.first_step is not None else entry.alert.step
        recent = series.recent() if series else []
        if not recent or recent[0].step > first:
            # The store no longer (or not yet, after a restart) holds the whole firing
            # span: a peak of part of it would be stated as fact and be wrong.
            return None, None
        points = [p for p in recent if first <= p.step <= t.step]
        if not points:
            return None, None
        if any(not math.isfinite(p.value) for p in points):
            worst = next(p for p in points if not math.isfinite(p.value))
        elif _lower_is_worse(self._rule_of(t.rule)):
            worst = min(points, key=lambda p: p.value)
        else:
            worst = max(points, key=lambda p: p.value)
        return worst.value, worst.step
