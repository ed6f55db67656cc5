"""Points in, alert transitions out: the one code path for `run` and `replay`.

The engine owns no clock, thread or file. The live runtime feeds it points as
the tailer delivers them and calls `tick(now)` on a timer; `replay` feeds it a
finished run's points. Every decision is made on the data's own axis (steps,
the run's wall times), so both paths produce the same transitions for the
same points.

Per new tag, the alias table and the rules' selectors are consulted once and
the result cached; a point then costs one dict lookup plus one O(1) update per
rule that reads its series. A rule over a pattern gets one alert per matching
series: (run, rule, tag) is an alert's identity.

Inhibition (a critical silences the warnings of its run and rule family) is
applied to what is *shown*: each alert's state machine runs regardless, and a
firing warning that a critical covers is resolved with reason "inhibited by
<rule>"; if its condition still holds when the critical resolves (or holds
again while its lifecycle still fires), it fires again. Firing only by its
`keep_firing_for` latch is not holding: that would page on healthy data.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from trainsentry.alert import RECOVERED, Severity, State, Transition
from trainsentry.jobs import member_of
from trainsentry.jobs.identity import MAX_RANKS_COMPARED
from trainsentry.point import CHECKPOINT_PREFIX, Point, Row, batches_of
from trainsentry.rules import model as m
from trainsentry.rules.aliases import Aliases, glob_matcher
from trainsentry.rules.clock import NoDataClock, StaleCondition, ThroughputCondition
from trainsentry.rules.condition import Evaluator, OtherSeries, fmt, reason_of
from trainsentry.rules.layers import AcrossLayersCondition, LayerGroup
from trainsentry.rules.lifecycle import (
    CANCELLED,
    ESCALATED,
    FIRED,
    FIRING,
    INACTIVE,
    PENDING,
    RESOLVED,
    Lifecycle,
)
from trainsentry.rules.model import QUIET
from trainsentry.rules.pattern import GrowthCondition, SpikeCondition
from trainsentry.rules.ranks import Judged, RankComparison, RankSeat
from trainsentry.rules.threshold import NonFiniteCondition, ThresholdCondition
from trainsentry.rules.window import (
    BaselineCondition,
    PairCondition,
    PlateauCondition,
    RiseCondition,
    WindowRiseCondition,
)

# "grad_norm at step 340 grew ×18 in 40 steps ...": evidence reads as the predicate
DEFAULT_MESSAGE = "{canonical} at step {step} {evidence}"
RUN_WIDE = "*"  # the metric of a run-level alert (no data)
EVERY_SERIES = ("*",)  # the metrics of a rule that reads every series of a run
EPOCH_AXIS = "@epoch"  # a series logged at step = epoch (axis_of)
# `tick` fires a no-data alert at most a hundredth of its shortest silence late, at
# most this late (the default pack's 15 minutes: 5 s), and need not be called more
# often: each call walks every run's clocks, 2 ms a second at a thousand runs.
TICK_LATENESS = 0.01
TICK_MAX_SECONDS = 5.0

_FACTORIES: dict[type, Any] = {
    m.NonFinite: NonFiniteCondition,
    m.Threshold: ThresholdCondition,
    m.Plateau: PlateauCondition,
    m.Rise: RiseCondition,
    m.Pair: PairCondition,
    m.Baseline: BaselineCondition,
    m.Throughput: ThroughputCondition,
    m.Growth: GrowthCondition,
    m.Spike: SpikeCondition,
    m.NoData: NoDataClock,
    m.Stale: StaleCondition,
}


def make_condition(spec: m.Condition) -> Evaluator:
    factory = _FACTORIES[type(spec)]
    if isinstance(spec, m.Rise) and spec.window is not None:
        factory = WindowRiseCondition  # a window mean for the level, not an EWMA
    condition: Evaluator = factory(spec)
    return condition


NO_STEP = -(2**62)  # an alert's last step before its series' first point


@dataclass(eq=False, slots=True)
class Alert:
    """One rule on one series of one run: its condition, its lifecycle, what was shown."""

    rule: m.Rule
    run: str
    metric: str
    canonical: str
    condition: Any  # an Evaluator, or a NoDataClock for run-level rules
    lifecycle: Lifecycle
    shown: Severity | None = None  # severity last emitted as firing; None when not shown
    holding: bool = False  # the condition's latest verdict holds the alarm (not the latch)
    last_step: int = NO_STEP
    last_wall: float = math.nan
    value: float = math.nan
    # what firing() last rendered for it, and what that depended on: an alert left
    # firing on an idle run renders the same every second (the HTTP snapshot)
    view: tuple[tuple[int, float, str], Transition] | None = None

    def severity(self) -> Severity:
        escalated = self.lifecycle.level >= m.CRITICAL
        return "critical" if escalated or self.rule.severity == "critical" else "warning"


@dataclass(eq=False, slots=True)
class _Run:
    name: str
    others: dict[str, OtherSeries] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)
    clocks: dict[str, Alert] = field(default_factory=dict)  # rule name → no-data alert
    series: dict[str, list[Alert]] = field(default_factory=dict)  # tag → its rules' alerts
    last_step: int = 0
    last_wall: float = 0.0
    # The clock rules last advanced and the stamp they were advanced to: the other
    # points of a record (same step, same stamp) leave them as they are.
    marked: tuple[m.Rule, ...] = ()
    marked_step: int = 0
    marked_wall: float = math.nan
    # (run step, n, alert): when a `stale` series of this run becomes suspicious; a heap
    stale: list[tuple[float, int, Alert]] = field(default_factory=list)
    stale_pushed: int = 0
    # (alert, step, its lifecycle's point before): jump pairs of a record whose other
    # series is written after them (Lightning's LearningRateMonitor: the lr before the loss)
    awaiting: list[tuple[Alert, int, tuple[int, float]]] = field(default_factory=list)
    # the rows of a step a feed of points left open (`feed_all`: another run's point
    # came between two of its values): judged with the rest of the step
    held: list[Row] = field(default_factory=list)
    # the tags of the step judged last: a step read live that holds some of them, not
    # all, may go on in the run's next read (`feed_rows`' `now`)
    step_tags: tuple[str, ...] = ()
    # rule name → its layers' newest values: an `across_layers` rule compares them
    layers: dict[str, LayerGroup] = field(default_factory=dict)

    # the axis of the value being judged: its pair reads the other series on that axis
    axis: str = ""

    def other(self, canonical: str) -> OtherSeries | None:
        return self.others.get(canonical + self.axis)


def _complete(before: tuple[str, ...], first: Row, more: list[Row]) -> bool:
    """Whether a step read live is all there, as far as the run's writing shows: it holds
    every tag the step before it held, or none of them (a record of another kind, an
    evaluation's line between training steps, is whole as written). Part of a step cut
    by a read holds some of the tags its writer logs every step, not all."""
    if not more and first[2] == before:  # a record a step, the same tags every step
        return True
    tags = set(first[2]).union(*(row[2] for row in more))
    return tags.issuperset(before) or tags.isdisjoint(before)


def axis_of(tag: str) -> str:
    """The axis a series is logged on, as far as its name says: Keras' TensorBoard
    callback writes `epoch_loss` at step = epoch beside `batch_loss` at step = batch
    (update_freq), two axes under one canonical name. A rule pairing two series pairs
    them on one axis (validation's epoch loss with the epoch train loss), else it would
    compare an epoch's value with a batch's (EPOCH_AXIS or "" for the step axis)."""
    return EPOCH_AXIS if tag.rpartition("/")[2].startswith("epoch_") else ""


@dataclass(frozen=True, slots=True)
class _Binding:
    canonical: str
    series_rules: tuple[m.Rule, ...]
    clock_rules: tuple[m.Rule, ...]
    # No rule judges the tag's values, nor pairs with it: a point only moves its
    # run's clocks and step. Most of a fleet's series are such (everything is
    # logged, a few are judged).
    idle: bool
    stale: bool = False  # a `stale` rule watches the tag: its deadline is kept by its run
    axis: str = ""  # axis_of(tag)


# Per row shape: (position, clock rules to move, None) or (position, (), binding to judge).
_Plan = tuple[tuple[int, tuple[m.Rule, ...], "_Binding | None"], ...]


class Engine:
    def __init__(self, rules: m.RuleSet | Iterable[m.Rule], aliases: Aliases | None = None) -> None:
        self._base_aliases = aliases or Aliases()
        self._bindings: dict[str, _Binding] = {}
        self._plans: dict[tuple[str, ...], _Plan] = {}
        self._runs: dict[str, _Run] = {}
        # (group, rule, tag) → the ranks of a job compared on one series (ranks.py)
        # group → (rule, tag) → the ranks of a job compared on one series (ranks.py)
        self._comparisons: dict[str, dict[tuple[m.Rule, str], RankComparison]] = {}
        self._ranks: dict[str, set[str]] = {}  # group → its ranks followed or fed
        # run → when its last step read live was left open, to be judged with the rest of
        # it or, once its writer has been quiet, by `settle`
        self._open: dict[str, float] = {}
        self._load(rules)

    def _load(self, rules: m.RuleSet | Iterable[m.Rule]) -> None:
        ruleset = rules if isinstance(rules, m.RuleSet) else m.RuleSet(tuple(rules))
        self.rules = ruleset.rules
        self.aliases = self._base_aliases.extended(ruleset.aliases)
        self._selectors = [
            (rule, glob_matcher(rule.metrics), glob_matcher(rule.tags)) for rule in self.rules
        ]
        spans: dict[str, set[int]] = {}
        for rule in self.rules:
            c = rule.condition
            if isinstance(c, m.Pair):
                spans.setdefault(c.other, set()).add(c.other_smoothing)
            elif isinstance(c, m.NonFinite) and c.other is not None:
                spans.setdefault(c.other, set())  # its latest value only, no level
        self._other_spans = {name: frozenset(s) for name, s in spans.items()}
        waits = [
            min(c.min_silence, c.max_silence if c.max_silence is not None else math.inf)
            for c in (rule.condition for rule in self.rules)
            if isinstance(c, m.NoData)
        ]
        self.tick_every = min(TICK_MAX_SECONDS, TICK_LATENESS * min(waits, default=math.inf))
        self._clock_sets: dict[tuple[m.Rule, ...], tuple[m.Rule, ...]] = {}
        self._bindings.clear()
        self._plans.clear()

    def reload(self, rules: m.RuleSet | Iterable[m.Rule]) -> list[Transition]:
        """Swap the rules of a live engine, keeping the state of every unchanged rule.

        Rules compare by value, so a reload that leaves a rule as it was keeps
        its windows and its firing alerts; a removed or changed rule's alerts
        resolve with reason "rule changed" and a changed rule starts afresh.
        """
        self._load(rules)
        keep = set(self.rules)
        out: list[Transition] = []
        for run in self._runs.values():
            gone = [a for a in run.alerts if a.rule not in keep]
            self._end(run, gone, run.last_step, run.last_wall, "rule changed", out)
            run.alerts = [a for a in run.alerts if a.rule in keep]
            run.awaiting = [w for w in run.awaiting if w[0].rule in keep]
            run.clocks = {name: a for name, a in run.clocks.items() if a.rule in keep}
        for comparisons in self._comparisons.values():
            for key in [k for k in comparisons if k[0] not in keep]:
                del comparisons[key]
        for run in self._runs.values():
            run.stale.clear()  # deadlines of the old alerts; the new ones push theirs
            for tag, alerts in run.series.items():
                binding = self._bindings.get(tag) or self._bind(tag)
                kept = {a.rule: a for a in alerts if a.rule in keep}
                alerts[:] = [
                    kept.get(rule) or self._new_alert(run, rule, tag, binding.canonical)
                    for rule in binding.series_rules
                ]
        return out

    # --- feeding ---

    def _bind(self, tag: str) -> _Binding:
        canonical = self.aliases.resolve(tag)
        series: list[m.Rule] = []
        clocks: list[m.Rule] = []
        saved = tag.startswith(CHECKPOINT_PREFIX)
        on = "epochs" if axis_of(tag) == EPOCH_AXIS else "steps"
        for rule, metrics, tags in self._selectors:
            if rule.axis is not None and rule.axis != on:
                continue
            if (metrics and metrics.match(canonical)) or (tags and tags.match(tag)):
                if not isinstance(rule.condition, m.NoData):
                    series.append(rule)
                elif not saved or rule.metrics != EVERY_SERIES:
                    # a checkpoint is a file on disk, not data the run logs: a rule over
                    # every series does not take a save for the run going on
                    clocks.append(rule)
        idle = not series and canonical not in self._other_spans
        # one tuple per distinct set of clock rules: _feed compares them by identity
        clock_rules = self._clock_sets.setdefault(tuple(clocks), tuple(clocks))
        stale = any(isinstance(rule.condition, m.Stale) for rule in series)
        binding = _Binding(canonical, tuple(series), clock_rules, idle, stale, axis_of(tag))
        self._bindings[tag] = binding
        return binding

    def feed(self, point: Point) -> list[Transition]:
        """Evaluate one point; the transitions it caused, in order."""
        return self.feed_all((point,))

    def feed_all(self, points: Iterable[Point]) -> list[Transition]:
        """Evaluate points in order; the transitions they caused, in order.

        Consecutive points of one run, step and stamp are one record: they are
        judged as the live path judges a row (`feed_rows`).
        """
        out: list[Transition] = []
        held: set[str] = set()
        for run_id, rows in batches_of(points):
            self._feed(run_id, rows, out, hold=True)  # another run's point may cut a step
            held.add(run_id)
        for run_id in held:
            self._settle_held(run_id, out)
        return out

    def feed_rows(
        self, run_id: str, rows: Iterable[Row], *, now: float | None = None
    ) -> list[Transition]:
        """Evaluate one run's rows in order; the transitions they caused, in order.

        Live (`now` given), a read may end inside a step: a writer flushes when its
        queue fills (SummaryWriter's 10 events), not where a step ends, and the step's
        other values come with the next read. Judged at once, its loss would be judged
        without the lr logged beside it, and a spike fire that replay, reading the
        whole step, inhibits. So the last step of the rows is left open when it holds some
        of the tags the step before it held, not all (`_complete`; a complete step, the
        common case, is judged at once), and judged with the rest of it, or by `settle`
        once it waited.
        """
        out: list[Transition] = []
        self._feed(run_id, rows, out, opened=now)
        return out

    def settle(self, before: float) -> list[Transition]:
        """The open steps left before `before`, judged as they are: their writer has been
        quiet since, so no more of them is coming."""
        out: list[Transition] = []
        for run_id in [r for r, when in self._open.items() if when < before]:
            self._settle_held(run_id, out)
        return out

    def _settle_held(self, run_id: str, out: list[Transition]) -> None:
        run = self._runs.get(run_id)
        if run is not None and run.held:
            self._feed(run_id, (), out)
        self._open.pop(run_id, None)

    def _feed(
        self,
        run_id: str,
        rows: Iterable[Row],
        out: list[Transition],
        hold: bool = False,
        opened: float | None = None,
    ) -> None:
        """The daemon's per-record hot path: a run's rows, a step at a time.

        A step is one moment: its values are judged in one order whatever order
        the writer put them in (`_turn`: a row's in its plan's order; a step of
        several rows, value by value), and an alert that fired and
        was inhibited within it was never shown (`_moment`). So W&B's and MLflow's
        orders of one step's tags, or a run's files read in another interleaving,
        give one verdict.
        """
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run(run_id)
        held: Row | None = None
        group: list[Row] = []
        if run.held:  # the step a feed left open: its other values may follow
            held, group, run.held = run.held[0], run.held[1:], []
            self._open.pop(run_id, None)
        for row in rows:
            if held is None:
                held = row
            elif row[0] == held[0]:
                group.append(row)
            else:
                self._moment(run, held, group, out)
                held, group = row, []
        if held is None:
            return
        if hold:
            run.held = [held, *group]
        elif opened is not None and not _complete(run.step_tags, held, group):
            run.held = [held, *group]
            self._open[run_id] = opened
        else:
            self._moment(run, held, group, out)

    def _moment(self, run: _Run, first: Row, more: list[Row], out: list[Transition]) -> None:
        """One step's rows, judged as one moment."""
        mark = len(out)
        if not more:
            self._row(run, first, out)
            run.step_tags = first[2]
        else:
            values = [
                (tag, wall, value)
                for _, wall, tags, vals in (first, *more)
                for tag, value in zip(tags, vals, strict=True)
            ]
            values.sort(key=lambda v: self._turn(v[0]))
            step = first[0]
            for tag, wall, value in values:
                self._row(run, Row(step, wall, (tag,), (value,)), out)
            run.last_wall = max(v[1] for v in values)
            run.step_tags = tuple(dict.fromkeys(v[0] for v in values))
        if len(out) - mark > 1:
            _unshown(out, mark)

    def _turn(self, tag: str) -> tuple[bool, str]:
        """A value's place in its step: the series other rules compare against first (a
        NaN grad_norm is judged beside the loss of its own step, not the step before),
        then by tag; a sort by it is stable, so two values of one tag keep their order."""
        binding = self._bindings.get(tag) or self._bind(tag)
        return (binding.canonical not in self._other_spans, tag)

    def _row(self, run: _Run, row: Row, out: list[Transition]) -> None:
        """One record. Most values are of series no rule judges (they only move their
        run's clocks and step), so what a row of given tags asks for is worked out once
        per shape (`_plan`): the positions whose no-data clocks move, and the positions
        a rule judges, in one order (`_turn`). A 20-value row of one judged tag costs
        one clock check and one judgement, not twenty lookups. The clocks are advanced
        once per stamp (`_Run.marked`; each clock also skips a stamp it has seen, for
        rows whose tags have other clock rules)."""
        step, wall, tags, values = row
        plan = self._plans.get(tags)
        if plan is None:
            plan = self._plan(tags)
        run.last_step, run.last_wall = step, wall
        if run.stale and run.stale[0][0] < step:
            self._check_stale(run, step, wall, out)
        for i, clocks, binding in plan:
            if binding is not None:
                self._judge(run, binding, tags[i], step, wall, values[i], out)
            elif clocks is not run.marked or step != run.marked_step or wall != run.marked_wall:
                self._advance_clocks(run, clocks, step, wall, out)
                run.marked, run.marked_step, run.marked_wall = clocks, step, wall

    def _plan(self, tags: tuple[str, ...]) -> _Plan:
        """What a row of these tags asks for: its clocks moved first, then its judged values
        in one order (`_turn`), not the order a writer put them in."""
        steps: list[tuple[int, tuple[m.Rule, ...], _Binding | None]] = []
        judged: list[tuple[int, tuple[m.Rule, ...], _Binding | None]] = []
        moved: set[tuple[m.Rule, ...]] = set()
        for i, tag in enumerate(tags):
            binding = self._bindings.get(tag) or self._bind(tag)
            clocks = binding.clock_rules
            if clocks and clocks not in moved:  # again in one row: a clock moves once a stamp
                moved.add(clocks)
                steps.append((i, clocks, None))
            if not binding.idle:
                judged.append((i, (), binding))
        judged.sort(key=lambda entry: self._turn(tags[entry[0]]))
        if len(self._plans) >= 65536:  # logs whose every line has new keys
            self._plans.clear()
        plan = self._plans[tags] = (*steps, *judged)
        return plan

    def _judge(
        self,
        run: _Run,
        binding: _Binding,
        tag: str,
        step: int,
        wall: float,
        value: float,
        out: list[Transition],
    ) -> None:
        canonical = binding.canonical
        run.axis = binding.axis
        spans = self._other_spans.get(canonical)
        if spans is not None:
            key = canonical + binding.axis
            other = run.others.get(key)
            if other is None:
                other = run.others[key] = OtherSeries(spans)
            other.push(step, value)
            if run.awaiting:
                self._judge_awaiting(run, canonical, step, out)
        alerts = run.series.get(tag)
        if alerts is None:
            alerts = run.series[tag] = [
                self._new_alert(run, rule, tag, canonical) for rule in binding.series_rules
            ]
        # Every point of a judged series runs this loop once per rule on it (a loss has a
        # dozen): an alert judged quiet reads its last stamp once and builds nothing.
        for alert in alerts:
            rule = alert.rule
            if step < rule.min_step:
                continue
            condition = alert.condition
            if type(condition) is RankSeat:
                if condition.comparison is not None:
                    judged = condition.comparison.push(run.name, step, wall, value)
                    self._compared(rule, tag, judged, out)
                continue
            last_step, last_wall = alert.last_step, alert.last_wall
            if step < last_step:  # the run resumed from a checkpoint: start the window afresh
                alert.condition = condition = self._condition(run, rule, tag)
                last_step, last_wall = step, wall
            alert.last_step = step
            alert.last_wall = wall
            alert.value = value
            verdict = condition.update(step, wall, value, run)
            if not alert.holding and (
                verdict is None or (verdict == QUIET and alert.lifecycle.phase == INACTIVE)
            ):
                continue  # the common case: an idle alert judged quiet (or not judged) stays so
            before = last_step, last_wall
            if verdict == m.HELD and type(condition) is PairCondition and condition.awaits:
                run.awaiting = [w for w in run.awaiting if w[0] is not alert]  # its latest only
                run.awaiting.append((alert, step, before))
                if alert.lifecycle.phase == PENDING:
                    continue  # a wait is no verdict: judged when the other's value comes
            self._settle(run, alert, verdict, step, wall, before, out)
        if binding.stale:
            self._watch_stale(run, alerts)

    def _settle(
        self,
        run: _Run,
        alert: Alert,
        verdict: int | None,
        step: int,
        wall: float,
        before: tuple[int, float],
        out: list[Transition],
    ) -> None:
        """Move the alert's lifecycle by a verdict on its latest point; tell what changed."""
        last = before if before[0] != NO_STEP else None
        event = alert.lifecycle.observe(verdict, step, wall, last)
        if verdict is not None:
            alert.holding = verdict >= m.ACTIVE or (verdict == m.HELD and alert.lifecycle.firing)
        if event is FIRED or event is ESCALATED:
            self._reconcile(run, alert, step, wall, RECOVERED, out)
        elif event is RESOLVED:  # the condition says whether the series came back
            self._reconcile(run, alert, step, wall, reason_of(alert.condition), out)
        elif event is CANCELLED:
            reason_of(alert.condition)  # the streak ended: so does the level kept for it
        elif alert.shown is None and alert.holding and alert.lifecycle.firing:
            self._reconcile(run, alert, step, wall, "recovered", out)  # muted: holds again

    def _compared(
        self, rule: m.Rule, tag: str, judged: list[Judged], out: list[Transition]
    ) -> None:
        """Settle the verdicts of steps the ranks of a job completed: each on its rank's own
        alert of this rule and tag, at that rank's step and stamp (ranks.py)."""
        for j in judged:
            run = self._runs.get(j.run)
            alerts = run.series.get(tag) if run is not None else None
            alert = next((a for a in alerts or () if a.rule is rule), None)
            if run is None or alert is None:
                continue
            before = alert.last_step, alert.last_wall
            alert.last_step, alert.last_wall, alert.value = j.step, j.wall, j.value
            alert.condition.said = j.said
            self._settle(run, alert, j.verdict, j.step, j.wall, before, out)

    def _judge_awaiting(self, run: _Run, canonical: str, step: int, out: list[Transition]) -> None:
        """Judge again the jump pairs of this record that waited for `canonical`'s value.

        A jump pairs two values of one record, but a writer may log the jumping
        series first: judged on its own point, the pair saw the other's previous
        record, and paged one logging interval late. A record whose step has
        passed drops its waiters: the other was not logged with it.
        """
        waiting, run.awaiting = run.awaiting, []
        axis = run.axis
        for alert, at, before in waiting:
            if at != step or alert.last_step != step:
                continue
            condition: PairCondition = alert.condition
            if condition.spec.other != canonical or axis_of(alert.metric) != axis:
                run.awaiting.append((alert, at, before))
                continue
            verdict = condition.update(step, alert.last_wall, alert.value, run)
            self._settle(run, alert, verdict, step, alert.last_wall, before, out)

    # --- silence of one series while its run goes on ---

    def _watch_stale(self, run: _Run, alerts: list[Alert]) -> None:
        for alert in alerts:
            condition = alert.condition
            if isinstance(condition, StaleCondition):
                due = condition.deadline()
                if due < math.inf:
                    run.stale_pushed += 1
                    heapq.heappush(run.stale, (due, run.stale_pushed, alert))

    def _check_stale(self, run: _Run, step: int, wall: float, out: list[Transition]) -> None:
        """The run passed deadlines of `stale` series: those not written since are stale.

        A series pushes a deadline with each of its points, so most entries are
        outdated by a later point by the time the run reaches them; only one that
        is still the series' own deadline fires.
        """
        while run.stale and run.stale[0][0] < step:
            due, _, alert = heapq.heappop(run.stale)
            condition: StaleCondition = alert.condition
            if condition.deadline() != due or alert.lifecycle.firing:
                continue
            condition.now = step
            alert.holding = True
            if alert.lifecycle.observe(m.ACTIVE, step, wall, None) in (FIRED, ESCALATED):
                self._reconcile(run, alert, step, wall, "", out)

    def _condition(self, run: _Run, rule: m.Rule, metric: str) -> Any:
        """A new condition of `rule` on `metric`: its own, or its seat in what it shares
        (a comparison across the ranks of a job, the layers of its run)."""
        spec = rule.condition
        if isinstance(spec, m.AcrossRanks):
            return RankSeat(self._comparison(run.name, rule, metric))
        if isinstance(spec, m.AcrossLayers):
            group = run.layers.setdefault(rule.name, LayerGroup())
            return AcrossLayersCondition(spec, metric, group)
        return make_condition(spec)

    def _new_alert(self, run: _Run, rule: m.Rule, metric: str, canonical: str) -> Alert:
        condition = self._condition(run, rule, metric)
        alert = Alert(
            rule, run.name, metric, canonical, condition,
            Lifecycle(rule.for_, rule.keep_firing_for),
        )  # fmt: skip
        run.alerts.append(alert)
        return alert

    def _comparison(self, run_id: str, rule: m.Rule, tag: str) -> RankComparison | None:
        """The comparison of `tag` under `rule` among the ranks of `run_id`'s group; None
        for a run that is no rank of a job (jobs/identity.py)."""
        member = member_of(run_id)
        if not member.ranked:
            return None
        self.expect(run_id)
        comparisons = self._comparisons.setdefault(member.group, {})
        comparison = comparisons.get((rule, tag))
        if comparison is None:
            spec: m.AcrossRanks = rule.condition  # type: ignore[assignment]
            comparison = RankComparison(spec, self._ranks[member.group])
            comparisons[(rule, tag)] = comparison
        return comparison

    def expect(self, run_id: str) -> None:
        """A rank's log is followed: its group's comparisons wait for its points, however
        the ranks' files are read one after another (ranks.py). Runs that are no ranks of
        a job are nothing to expect."""
        member = member_of(run_id)
        if not member.ranked:
            return
        ranks = self._ranks.setdefault(member.group, set())
        if run_id in ranks or len(ranks) >= MAX_RANKS_COMPARED:
            return
        ranks.add(run_id)
        for comparison in self._comparisons.get(member.group, {}).values():
            comparison.expect(run_id)

    # --- time: silence is judged on the run's clock, fired at its deadline ---

    def _advance_clocks(
        self, run: _Run, rules: tuple[m.Rule, ...], step: int, wall: float, out: list[Transition]
    ) -> None:
        for rule in rules:
            alert = run.clocks.get(rule.name)
            if alert is None:
                alert = run.clocks[rule.name] = self._new_alert(run, rule, RUN_WIDE, RUN_WIDE)
            else:
                clock: NoDataClock = alert.condition
                if clock.last_step == step and wall <= clock.last_wall:
                    continue  # another tag of the same record: nothing new for this clock
            # _check_clock's own test, inlined (a point moves the clocks of every record):
            # this point came after the deadline (a gap a replay sees, or a tick missed)
            clock = alert.condition
            lifecycle = alert.lifecycle
            if (
                lifecycle.phase != FIRING
                and clock.last_step is not None
                and wall > clock.last_wall + clock.wait
            ):
                self._check_clock(run, alert, wall, out)
            clock.observe(step, wall)
            alert.last_step, alert.value = step, math.nan
            # a quiet verdict changes nothing in an inactive lifecycle
            if lifecycle.phase != INACTIVE and lifecycle.observe(m.QUIET, step, wall) is RESOLVED:
                self._reconcile(run, alert, step, wall, "data resumed", out)

    def _check_clock(self, run: _Run, alert: Alert, now: float, out: list[Transition]) -> None:
        clock: NoDataClock = alert.condition
        if alert.lifecycle.firing or clock.verdict(now) != m.ACTIVE:
            return
        due = clock.due()
        step = clock.last_step if clock.last_step is not None else run.last_step
        if alert.lifecycle.observe(m.ACTIVE, step, due) in (FIRED, ESCALATED):
            self._reconcile(run, alert, step, due, "", out)
            # what was firing on this run can no longer recover: resolve it, clocks aside
            others = [a for a in run.alerts if a.metric != RUN_WIDE]
            self._end(run, others, step, due, "data stopped", out)

    def _end(
        self,
        run: _Run,
        alerts: list[Alert],
        step: int,
        wall: float,
        reason: str,
        out: list[Transition],
    ) -> None:
        # stop every lifecycle first, so a resolving critical cannot re-show a warning
        for alert in alerts:
            alert.lifecycle.stop()
        for alert in alerts:
            if alert.shown is not None:
                self._reconcile(run, alert, step, wall, reason, out)

    def tick(self, now: float, now_of: Callable[[str], float] | None = None) -> list[Transition]:
        """Live only: fire no-data alerts whose deadline `now` (or `now_of(run)`) has passed.

        Called every `tick_every` seconds (or more often); an alert is stamped
        with its deadline, not with the tick that noticed it.
        """
        out: list[Transition] = []
        for run_id, run in self._runs.items():
            at = now if now_of is None else now_of(run_id)
            for alert in run.clocks.values():
                self._check_clock(run, alert, at, out)
        return out

    def shift_clock(self, run_id: str, seconds: float) -> None:
        """A clock step in the run's stamps (told by silence_clock.py): move what its clocks
        remember by as much, so the step reads as neither silence nor a hang."""
        run = self._runs.get(run_id)
        if run is None:
            return
        run.last_wall += seconds
        for alert in run.clocks.values():
            clock: NoDataClock = alert.condition
            clock.last_wall += seconds
            clock.step_wall += seconds
        for alert in run.alerts:
            cond = alert.condition
            if isinstance(cond, ThroughputCondition) and cond.last is not None:
                cond.last = (cond.last[0], cond.last[1] + seconds)

    # --- ending ---

    def finish(self, run_id: str, reason: str = "run finished") -> list[Transition]:
        """Resolve what is firing on a run and forget it (it ended, or was deleted)."""
        out: list[Transition] = []
        self._settle_held(run_id, out)  # its last step, left open: no more of it comes
        run = self._runs.pop(run_id, None)
        if run is not None:
            self._end(run, run.alerts, run.last_step, run.last_wall, reason, out)
        member = member_of(run_id)
        if member.ranked:  # the other ranks' steps no longer wait for this one (fed or not)
            ranks = self._ranks.get(member.group)
            if ranks is not None:
                ranks.discard(run_id)
                if not ranks:
                    del self._ranks[member.group]
                    self._comparisons.pop(member.group, None)
            for (rule, tag), comparison in self._comparisons.get(member.group, {}).items():
                self._compared(rule, tag, comparison.leave(run_id), out)
        return out

    def finish_all(self, reason: str = "run finished") -> list[Transition]:
        out: list[Transition] = []
        for run_id in list(self._runs):
            out.extend(self.finish(run_id, reason))
        return out

    def runs(self) -> list[str]:
        return list(self._runs)

    def reads(self, tag: str) -> bool:
        """Whether a rule judges this tag's series (the store keeps more of those)."""
        binding = self._bindings.get(tag) or self._bind(tag)
        return bool(binding.series_rules)

    def firing(self) -> list[Transition]:
        """The alerts shown as firing now, as their latest firing transition would read."""
        out = []
        for run in self._runs.values():
            for a in run.alerts:
                if a.shown is None:
                    continue
                # a message is a function of the alert's state, which moves only with
                # its series' points (last_step), the run's stamp, or what is shown
                step, wall, shown = key = (a.last_step, run.last_wall, a.shown)
                if a.view is None or a.view[0] != key:
                    a.view = (key, self._transition(a, "firing", shown, step, wall, None, None))
                out.append(a.view[1])
        return out

    def _ranks_behind(self, run_id: str) -> str:
        """Where the other ranks of a quiet rank's group are: the rank that stopped first,
        or is behind, is the one a hung job waits for (rules/hang.py names it once the
        collective's timeout comes). "" for a run that is no rank of a job."""
        member = member_of(run_id)
        if not member.ranked:
            return ""
        ranks = [
            (run.last_step, run.last_wall, name)
            for name in self._ranks.get(member.group, ())
            if (run := self._runs.get(name)) is not None
        ]
        if len(ranks) < 2:
            return ""
        ranks.sort()
        step, wall, first = ranks[0]
        newest = max(r[1] for r in ranks)
        same = all(r[0] == step for r in ranks)
        if same and newest - wall < 1.0:
            return (
                f"; all {len(ranks)} ranks of {member.job} stopped at step {step} within"
                f" {newest - wall:.2g} s of each other: none is behind (a collective's timeout"
                " will say which rank the others wait for)"
            )
        lowest = member_of(first).rank
        ahead = max(r[0] for r in ranks)
        return (
            f"; rank {lowest} of {member.job} stopped first, at step {step},"
            f" {newest - wall:.3g} s before the last rank wrote (the others reached up to step"
            f" {ahead})"
        )

    # --- what is shown: escalation, inhibition, messages ---

    def _reconcile(
        self, run: _Run, alert: Alert, step: int, wall: float, reason: str, out: list[Transition]
    ) -> None:
        want = alert.severity() if alert.lifecycle.firing else None
        blocker = self._inhibitor(run, alert) if want == "warning" else None
        if blocker is not None:
            want, reason = None, f"inhibited by {blocker.rule.name}"
        shown = alert.shown
        if want == shown:
            return
        alert.shown = want
        if want is None:
            out.append(self._transition(alert, "resolved", shown, step, wall, reason, None))
        else:
            out.append(self._transition(alert, "firing", want, step, wall, None, shown))
        if "critical" in (want, shown):  # the family's warnings may be (un)covered now
            group = alert.rule.group
            for other in run.alerts:
                shown_or_held = other.shown == "warning" or (
                    other.shown is None and other.lifecycle.firing and other.holding
                )
                if other is not alert and other.rule.group == group and shown_or_held:
                    self._reconcile(run, other, step, wall, "recovered", out)

    def _inhibitor(self, run: _Run, alert: Alert) -> Alert | None:
        group = alert.rule.group
        for other in run.alerts:
            if other is not alert and other.shown == "critical" and other.rule.group == group:
                return other
        return None

    def _transition(
        self,
        alert: Alert,
        state: State,
        severity: Severity | None,
        step: int,
        wall: float,
        reason: str | None,
        escalated_from: Severity | None,
    ) -> Transition:
        rule = alert.rule
        if state == "resolved":
            value = f" = {fmt(alert.value)}" if not math.isnan(alert.value) else ""
            message = f"resolved ({reason}): {alert.canonical}{value} at step {step}"
        else:
            message = self._render(alert, step, wall)
        return Transition(
            run=alert.run,
            rule=rule.name,
            severity=severity or alert.severity(),
            state=state,
            step=step,
            wall_time=wall,
            metric=alert.metric,
            value=alert.value,
            message=message,
            canonical=alert.canonical,
            family=rule.group,
            reason=reason,
            escalated_from=escalated_from,
            runbook=rule.runbook,
            labels=dict(rule.labels),
        )

    def _render(self, alert: Alert, step: int, wall: float) -> str:
        rule = alert.rule
        fields = {
            "run": alert.run,
            "rule": rule.name,
            "severity": alert.severity(),
            "metric": alert.metric,
            "canonical": alert.canonical if alert.canonical != RUN_WIDE else "run",
            "value": alert.value,
            "step": step,
            "wall_time": wall,
            "evidence": alert.condition.evidence(),
            "runbook": rule.runbook or "",
            "labels": dict(rule.labels),
        }
        if alert.metric == RUN_WIDE:  # a rank that went quiet: where the job's ranks are
            fields["evidence"] += self._ranks_behind(alert.run)
        try:
            default = "{evidence}" if alert.metric == RUN_WIDE else DEFAULT_MESSAGE
            return (rule.message or default).format_map(fields)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
            text = DEFAULT_MESSAGE.format_map(fields)
            return f"{text} (message template of {rule.name} failed: {exc})"


def _unshown(out: list[Transition], mark: int) -> None:
    """Drop from `out[mark:]` (one step's transitions) each alert's firing that a critical
    of the same step inhibited: shown and taken back in one moment, it was never shown.
    In another order of the step's values the warning would not have fired at all."""
    fired: dict[tuple[str, str, str], int] = {}
    dropped: set[int] = set()
    for i in range(mark, len(out)):
        t = out[i]
        key = (t.run, t.rule, t.metric)
        if t.state == "firing" and t.escalated_from is None:
            fired[key] = i
        elif t.state == "resolved" and (t.reason or "").startswith("inhibited by "):
            at = fired.pop(key, None)
            if at is not None:
                dropped.update((at, i))
    if dropped:
        out[mark:] = [t for i, t in enumerate(out[mark:], mark) if i not in dropped]
