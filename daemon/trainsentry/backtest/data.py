"""What a backtest report shows, computed once and kept small.

A replay's output is a flat list of transitions; a reader wants it per run:
which series the alerts were about, over which steps each alert was firing
(and at which severity), where it first fired, and — across runs — which rule
fires how often. Everything here is plain data (no matplotlib, no HTML), so
the numbers a report shows can be tested without rendering it. Series are
downsampled here, before plotting, so a run of ten million points costs a
report the same as one of two thousand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trainsentry.alert import Transition
from trainsentry.point import Point
from trainsentry.rules.aliases import Aliases
from trainsentry.rules.model import SEVERITY_RANK, RuleSet
from trainsentry.rules.run_life import RunLife

MAX_POINTS = 2000  # per plotted series
CANONICAL_FIRST = ("loss", "grad_norm")  # the series a reader looks at first
_GREW = re.compile(r"grew ×[^ ]+ in (\d+) steps")


@dataclass(frozen=True, slots=True)
class FiringSpan:
    """Steps [start, end] over which one alert was firing at one severity."""

    rule: str
    severity: str
    start: int
    end: int


@dataclass(slots=True)
class RunData:
    """One run's points (grouped by raw tag) and the transitions the rules produced."""

    run: str
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    life: str = ""  # how the run ended: "finished", "crashed: CUDA out of memory ..."

    @property
    def firings(self) -> list[Transition]:
        """Firing transitions, escalations included, in the order they happened."""
        return [t for t in self.transitions if t.state == "firing"]

    def first_firing(self, rule: str) -> Transition | None:
        return next((t for t in self.firings if t.rule == rule), None)

    def first_critical(self) -> Transition | None:
        return next((t for t in self.firings if t.severity == "critical"), None)

    def first_non_finite(self) -> int | None:
        """The step a NaN/inf first appears in any series: what a lead time is measured to."""
        steps = [s for pts in self.series.values() for s, v in pts if not math.isfinite(v)]
        return min(steps) if steps else None

    def caught(self) -> dict[str, tuple[str, int]]:
        """rule → (highest severity reached, step of its first firing)."""
        out: dict[str, tuple[str, int]] = {}
        for t in self.firings:
            sev, step = out.get(t.rule, (t.severity, t.step))
            if SEVERITY_RANK.get(t.severity, 0) > SEVERITY_RANK.get(sev, 0):
                sev = t.severity
            out[t.rule] = (sev, step)
        return out


def group_points(points: Iterable[Point]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run → tag → [(step, value)], in the order the points came."""
    runs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for p in points:
        runs.setdefault(p.run, {}).setdefault(p.tag, []).append((p.step, p.value))
    return runs


def build_runs(
    grouped: dict[str, dict[str, list[tuple[int, float]]]],
    transitions: Sequence[Transition],
    lives: Mapping[str, RunLife] | None = None,
) -> list[RunData]:
    """RunData per run, runs with alerts first (by first firing step), then the rest by name."""
    out = {run: RunData(run, series) for run, series in grouped.items()}
    for t in transitions:
        out.setdefault(t.run, RunData(t.run)).transitions.append(t)
    for run, life in (lives or {}).items():
        if run in out:
            out[run].life = life.told

    def order(r: RunData) -> tuple[int, str]:
        return (0, r.run) if r.firings else (1, r.run)

    return sorted(out.values(), key=order)


def firing_spans(transitions: Sequence[Transition]) -> dict[str, list[FiringSpan]]:
    """metric tag → spans. An escalation splits an alert's span into warning, then critical."""
    open_: dict[tuple[str, str], tuple[str, int]] = {}  # (rule, metric) → (severity, since)
    last_step: dict[str, int] = {}
    out: dict[str, list[FiringSpan]] = {}
    for t in transitions:
        key = (t.rule, t.metric)
        last_step[t.metric] = max(last_step.get(t.metric, t.step), t.step)
        if t.state == "firing":
            if key in open_:  # escalated: close the lower-severity part
                sev, since = open_[key]
                out.setdefault(t.metric, []).append(FiringSpan(t.rule, sev, since, t.step))
            open_[key] = (t.severity, t.step)
        elif key in open_:
            sev, since = open_.pop(key)
            out.setdefault(t.metric, []).append(FiringSpan(t.rule, sev, since, t.step))
    for (rule, metric), (sev, since) in open_.items():  # replay always resolves; be safe anyway
        out.setdefault(metric, []).append(FiringSpan(rule, sev, since, last_step[metric]))
    return out


def plotted_tags(run: RunData, aliases: Aliases, *, context: bool, limit: int = 6) -> list[str]:
    """The alerts' series, loss and grad_norm first; with `context`, those two even unalerted."""
    alerted = list(dict.fromkeys(t.metric for t in run.firings))
    if context:
        alerted += [tag for tag in run.series if aliases.resolve(tag) in CANONICAL_FIRST]

    def rank(tag: str) -> tuple[int, int]:
        canonical = aliases.resolve(tag)
        first = CANONICAL_FIRST.index(canonical) if canonical in CANONICAL_FIRST else 9
        return (first, alerted.index(tag))

    tags = sorted(dict.fromkeys(t for t in alerted if t in run.series), key=rank)
    return tags[:limit]


def downsample(
    points: Sequence[tuple[int, float]], limit: int = MAX_POINTS
) -> list[tuple[int, float]]:
    """At most `limit` points: min and max of each bucket, so spikes survive; all non-finite kept.

    Non-finite points are what the plot marks in red; dropping one would hide
    the very event an alert was about. They are few, so keeping them all does
    not break the bound in practice, and they are capped at a tenth of it.
    """
    bad = [p for p in points if not math.isfinite(p[1])][: limit // 10]
    good = [p for p in points if math.isfinite(p[1])]
    room = limit - len(bad)
    if len(good) <= room:
        return sorted(good + bad)
    buckets = max(room // 2, 1)
    size = len(good) / buckets
    kept: list[tuple[int, float]] = []
    for b in range(buckets):
        chunk = good[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        kept.extend(sorted({lo, hi}))
    return sorted(kept + bad)


def growth_fit(
    series: Sequence[tuple[int, float]], firing: Transition
) -> tuple[int, int, float, float] | None:
    """(first step, last step, slope, intercept) of log(value) ~ step, as the rule saw it.

    The transition keeps only the fit's text ("grew ×12 in 29 steps (...)"),
    not its coefficients; the window's extent in steps is in that text, so the
    same least squares over the same points is redone here. None if the message
    has no fit (too few points) or the window has under two usable points.
    """
    found = _GREW.search(firing.message)
    if found is None:
        return None
    first = firing.step - int(found.group(1))
    window = [
        (s, math.log(v))
        for s, v in series
        if first <= s <= firing.step and math.isfinite(v) and v > 0
    ]
    xs = sorted({s for s, _ in window})
    if len(xs) < 2:
        return None
    n = len(window)
    mx = sum(s for s, _ in window) / n
    my = sum(y for _, y in window) / n
    sxx = sum((s - mx) ** 2 for s, _ in window)
    slope = sum((s - mx) * (y - my) for s, y in window) / sxx
    return first, firing.step, slope, my - slope * mx


@dataclass(frozen=True, slots=True)
class RuleSummary:
    """One rule across all runs: how often it fired, where first, how bad it got."""

    rule: str
    severity: str
    runs: int
    firings: int
    first_steps: tuple[tuple[str, int], ...]  # (run, step of the first firing), per run


def summarize(runs: Sequence[RunData]) -> list[RuleSummary]:
    """Rules by how many runs they fired in, then by name."""
    acc: dict[str, tuple[str, int, list[tuple[str, int]]]] = {}
    for run in runs:
        for rule, (sev, step) in run.caught().items():
            best, count, firsts = acc.get(rule, (sev, 0, []))
            if SEVERITY_RANK.get(sev, 0) > SEVERITY_RANK.get(best, 0):
                best = sev
            firsts.append((run.run, step))
            count += sum(1 for t in run.firings if t.rule == rule and not t.escalated_from)
            acc[rule] = (best, count, firsts)
    out = [RuleSummary(r, s, len(f), c, tuple(f)) for r, (s, c, f) in acc.items()]
    return sorted(out, key=lambda s: (-s.runs, s.rule))


def aliases_for(rules: RuleSet) -> Aliases:
    """The same tag → canonical mapping the engine used for these rules."""
    return Aliases().extended(rules.aliases)
