"""The framework-shapes section of bench/detection.py: the issue's measures per logging shape.

Each run under CORPUS/frameworks/ (bench/corpus.py --shapes) is read back
with trainsentry's reader and replayed through the rule engine, in the order
a live daemon reads it (`replay_transitions(order="input")`), so resolves
carry their reason. Steps of series on Keras' epoch axis are mapped to the
optimizer step that ends the epoch, so every measure is on one axis.

Measures, per shape, against the issue's targets:

- criticals on healthy runs (target: none) and warnings per healthy run (≤ 0.5);
- fault recall: a page (any firing, warnings notify too) at or after onset,
  and how late: logging intervals from the first logged point at or after
  onset (the first abnormal point) to the first page (target: ≤ 3; a slowdown
  also meets it within 2 s of wall time from its onset, which where every
  step is logged is the later of the two). A fault whose loss cannot be told
  from the run's noise by then (`shown_at`: an exact rank test that knows the
  onset) is timed from the point where it can, and listed apart; the count
  from the first abnormal point is printed beside the table;
- a fault the logs hold no trace of (frozen layers where no per-layer series is
  written, a slowdown in rows without wall times or over in less than the 2 s
  a page may take) is unobservable: listed apart, with the series that would
  have shown it, and not scored as a miss;
- crashes: a critical by the first logged point that shows the crash, and the
  lead before the crash in steps and logging intervals (negative: after);
- pages per incident: a run's firing transitions grouped into one page until
  every alert of that trainsentry run, and of the runs of its job (the
  notifier's `same_job`: Keras' CSV run and its TensorBoard run below it),
  has resolved (an alert the resolving point itself fires joins, as the
  notifier's held "recovered" resolve has it); a fault's incident is
  the pages that start at or after onset, and before its end for a fault that
  ends (a slowdown) (target: 1);
- flaps: a firing of a rule on a series after a "recovered" resolve of the
  same rule and series (target: none);
- ended quiet: the logged loss stays ≥ 3× its pre-fault best (or the run
  crashed) and nothing is firing when the run ends (target: none).

The baselines (NaN only; grad norm > 100 or loss ×3 in one step) read the
shape's own loss and grad-norm tags; pages, flaps and "ended quiet" are not
theirs to have (they never resolve), so only alerts are scored for them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from corpusgen.shapes.spec import SHAPES, on_epoch_axis
from rank_test import VISIBLE_P, first_visible

from trainsentry.jobs import same_job
from trainsentry.point import Point
from trainsentry.rules.aliases import Aliases
from trainsentry.sources.reading import iter_points

SHAPES_DIR = "frameworks"
MAX_HEALTHY_CRITICALS = 0
MAX_WARNINGS_PER_HEALTHY = 0.5
MAX_PAGE_DELAY_INTERVALS = 3.0
# A slowdown logged every step is paged within 2 s of wall time or 3 intervals,
# whichever is later: a second of persistence keeps a neighbour's bursts quiet,
# and 3 intervals of ms steps are over before anyone could tell jitter from it.
MAX_SLOWDOWN_DELAY_SECONDS = 2.0
# What would have shown a fault the run's logs hold no trace of.
SHOWN_BY = {
    "frozen_layers": "per-layer gradient norms (grad_norm/<layer>, Lightning's "
    "grad_2.0_norm/<layer> through its grad-norm recipe, or the probe's)",
    "slowdown": "a wall time per logged row (TensorBoard's event stamps, a `time` column "
    "in a CSV) or the probe's step time",
}
# A run trained without a fault can still overfit by its own numbers: its last
# evaluation this far above its best while its training loss fell this far since
# that best (twice the margins of the `overfitting` rule, so a run in the band
# between still counts against the pack). An overfitting warning there is true;
# it is counted apart, not as noise on a healthy run.
OVERFIT_RISE = 1.2
OVERFIT_TRAIN_FALL = 0.8
OVERFITTING_RULES = ("overfitting",)
MAX_PAGES_PER_INCIDENT = 1
CRASHED_FAULTS = ("lr_jump", "nan")
NAME_WIDTH = max(len(name) for name in SHAPES)


@dataclass
class Firing:
    """One firing transition (a new alert or an escalation), on the optimizer-step axis."""

    step: int
    severity: str
    rule: str
    metric: str
    run: str  # the trainsentry run id (a directory may hold several)

    def __str__(self) -> str:
        mark = "!" if self.severity == "critical" else ""
        return f"{self.rule}[{self.metric}]{mark}@{self.step}"


@dataclass
class Page:
    """Firing transitions of one trainsentry run between two moments of all-resolved."""

    first: Firing
    firings: list[Firing] = field(default_factory=list)


@dataclass
class Replay:
    """What one detector did on one run."""

    firings: list[Firing] = field(default_factory=list)
    pages: list[Page] = field(default_factory=list)
    flaps: list[str] = field(default_factory=list)
    firing_at_end: list[str] = field(default_factory=list)
    last_resolve: str = ""
    error: str | None = None
    resolves: bool = True  # False for baselines: their alerts never resolve


@dataclass
class ShapeRun:
    name: str
    label: dict[str, object]
    points: list[Point]

    @property
    def onset(self) -> int | None:
        return self.label["onset_step"]  # type: ignore[return-value]

    @property
    def crash(self) -> int | None:
        return self.label["crash_step"]  # type: ignore[return-value]

    @property
    def log_every(self) -> int:
        return int(self.label["log_every"])  # type: ignore[call-overload]

    @property
    def first_abnormal(self) -> int | None:
        return self.label["first_abnormal_step"]  # type: ignore[return-value]

    def train_step(self, run: str, tag: str, step: int) -> int:
        """`step` of `tag` in trainsentry run `run`, on the optimizer-step axis."""
        sub = run[len(self.name) + 1 :] if run.startswith(self.name + "/") else ""
        if on_epoch_axis(self.label.get("epoch_axis"), sub, tag):
            return (step + 1) * int(self.label["steps_per_epoch"])  # type: ignore[call-overload]
        return step

    def role_points(self, role: str) -> list[Point]:
        """The points of the label's `role` series (loss, grad_norm, ...)."""
        where = self.label["series"].get(role)  # type: ignore[union-attr]
        if not where:
            return []
        run = f"{self.name}/{where[0]}" if where[0] else self.name
        return [p for p in self.points if p.run == run and p.tag == where[1]]

    def series(self, role: str) -> list[tuple[int, float]]:
        """The label's `role` series, as (optimizer step, value)."""
        return sorted(
            (self.train_step(p.run, p.tag, p.step), p.value) for p in self.role_points(role)
        )


def load(corpus: Path) -> list[ShapeRun]:
    root = corpus / SHAPES_DIR
    runs = []
    for label_path in sorted(root.glob("*/label.json")):
        label = json.loads(label_path.read_text())
        points = list(iter_points([label_path.parent]))
        runs.append(ShapeRun(label_path.parent.name, label, points))
    return runs


# --- detectors -------------------------------------------------------------


def engine(rule_paths: list[str] | None) -> Callable[[ShapeRun], Replay]:
    from trainsentry.backtest.replay import load_rules, replay_transitions

    rules = load_rules(rule_paths)

    def detect(run: ShapeRun) -> Replay:
        try:
            transitions = replay_transitions(run.points, rules, order="input")
        except Exception as exc:  # one bad run must not hide the rest
            return Replay(error=f"{type(exc).__name__}: {exc}")
        out = Replay()
        active: dict[str, set[tuple[str, str]]] = {}
        recovered: set[tuple[str, str, str]] = set()
        recovered_at: dict[str, int] = {}  # run → the step of its latest "recovered" resolve
        for t in transitions:
            key = (t.rule, t.metric)
            live = active.setdefault(t.run, set())
            step = run.train_step(t.run, t.metric, t.step)
            if t.state == "firing":
                firing = Firing(step, t.severity, t.rule, t.metric, t.run)
                out.firings.append(firing)
                if (t.run, *key) in recovered and t.escalated_from is None:
                    out.flaps.append(str(firing))
                    recovered.discard((t.run, *key))
                job_open = any(alerts for r, alerts in active.items() if same_job(r, t.run))
                # fired by the point that recovered the job's last alert: the notifier's
                # held resolve makes it the same incident (an update, not a page)
                joins = any(same_job(r, t.run) for r, at in recovered_at.items() if at == t.step)
                if not job_open and not joins:
                    out.pages.append(Page(firing))
                out.pages[-1].firings.append(firing)
                live.add(key)
                continue
            live.discard(key)
            if t.reason == "run finished":
                out.firing_at_end.append(f"{t.rule}[{t.metric}]")
            else:
                out.last_resolve = f"{t.rule}[{t.metric}] resolved ({t.reason}) @{step}"
            if t.reason == "recovered":
                recovered.add((t.run, *key))
                recovered_at[t.run] = t.step
        return out

    return detect


def _baseline(alerts: Iterable[tuple[int, str, str]]) -> Replay:
    firings = [Firing(step, "critical", rule, tag, "") for step, rule, tag in alerts]
    firings.sort(key=lambda f: f.step)
    return Replay(firings=firings, resolves=False)


def nan_only(run: ShapeRun) -> Replay:
    """Critical at the first non-finite training loss (TerminateOnNaN, check_finite)."""
    for step, value in run.series("loss"):
        if not math.isfinite(value):
            return _baseline([(step, "non_finite_loss", "loss")])
    return Replay(resolves=False)


def gn100_or_loss_x3(run: ShapeRun) -> Replay:
    """Critical where the grad norm passes 100, the loss triples in one logged point, or
    either is non-finite."""
    alerts = [
        (step, "grad_norm_above_100", "grad_norm")
        for step, value in run.series("grad_norm")
        if not math.isfinite(value) or value > 100
    ]
    prev = math.nan
    for step, value in run.series("loss"):
        if not math.isfinite(value) or (math.isfinite(prev) and prev > 0 and value > 3 * prev):
            alerts.append((step, "loss_x3_in_one_step", "loss"))
        prev = value
    return _baseline(alerts)


# --- scoring ---------------------------------------------------------------


@dataclass
class ShapeScore:
    """One detector's measures on one shape; the lists name the runs that miss a target."""

    healthy: int = 0
    healthy_critical: list[str] = field(default_factory=list)
    warnings: int = 0
    warned: list[str] = field(default_factory=list)
    overfit: list[str] = field(default_factory=list)  # true overfitting warnings, apart
    faults: int = 0
    paged: int = 0
    delays: list[float] = field(default_factory=list)  # logging intervals, paged faults
    late: list[str] = field(default_factory=list)
    # paged late from onset but within the target from where the loss first shows it
    shown_late: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    unobservable: list[str] = field(default_factory=list)
    crashes: int = 0
    crash_caught: int = 0
    crash_leads: list[tuple[int, float]] = field(default_factory=list)
    crash_missed: list[str] = field(default_factory=list)
    incident_pages: list[int] = field(default_factory=list)
    extra_pages: list[str] = field(default_factory=list)
    flaps: int = 0
    flapped: list[str] = field(default_factory=list)
    should_fire: int = 0
    ended_quiet: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _fmt(firings: list[Firing], limit: int = 3) -> str:
    shown = ", ".join(str(f) for f in firings[:limit])
    return shown + (f" (+{len(firings) - limit})" if len(firings) > limit else "")


def score(runs: list[ShapeRun], results: dict[str, Replay]) -> ShapeScore:
    s = ShapeScore()
    for run in runs:
        out = results[run.name]
        if out.error:
            s.errors.append(f"{run.name}: {out.error}")
        if run.label["healthy"]:
            _score_healthy(s, run, out)
        else:
            _score_fault(s, run, out)
        if out.resolves:
            _score_lifecycle(s, run, out)
    return s


def _score_healthy(s: ShapeScore, run: ShapeRun, out: Replay) -> None:
    s.healthy += 1
    crit = [f for f in out.firings if f.severity == "critical"]
    warn = [f for f in out.firings if f.severity == "warning"]
    if _overfits(run):
        true = [f for f in warn if f.rule in OVERFITTING_RULES]
        if true:
            s.overfit.append(f"{run.name}: {_fmt(true)}")
        warn = [f for f in warn if f.rule not in OVERFITTING_RULES]
    s.warnings += len(warn)
    if crit:
        s.healthy_critical.append(f"{run.name}: {_fmt(crit)}")
    if warn:
        s.warned.append(f"{run.name}: {_fmt(warn)}")


def _overfits(run: ShapeRun) -> bool:
    """Whether the logs show the run overfitting, whatever was injected: its last
    evaluation OVERFIT_RISE× its best or more, and the median of its last training
    losses OVERFIT_TRAIN_FALL× or less the median of those up to that best."""
    val, loss = run.series("val_loss"), run.series("loss")
    if len(val) < 3 or len(loss) < 3:
        return False
    at, best = min(val, key=lambda point: point[1])
    before = [v for step, v in loss if step <= at][-5:]
    last = [v for _, v in loss[-5:]]
    if not before:
        return False
    fell = statistics.median(last) <= OVERFIT_TRAIN_FALL * statistics.median(before)
    return val[-1][1] >= OVERFIT_RISE * best and fell


ALIASES = Aliases()


def logs_layer_norms(points: Iterable[Point]) -> bool:
    """Whether a run logs a gradient norm per layer (the probe's, Lightning's grad_norm)."""
    return any(ALIASES.resolve(tag).startswith("grad_norm/") for tag in {p.tag for p in points})


def _unobservable(run: ShapeRun) -> str | None:
    """Why the run's logs cannot show its fault, or None where they can: frozen
    layers leave the loss and total norm as a slow run's, and show only in per-layer
    series; a slowdown shows only where rows carry their own wall time (Lightning's
    CSVLogger writes none: every row read back has the file's), and only if it
    lasts: steps of a fraction of a millisecond slowed ×5 for 300 steps are over
    in under a second, before the 2 s the target gives a page (the pack's
    throughput rule waits 1 s so a neighbour's bursts stay quiet)."""
    fault = str(run.label.get("fault"))
    if fault == "frozen_layers" and not logs_layer_norms(run.points):
        return f"would show in {SHOWN_BY[fault]}"
    if fault != "slowdown":
        return None
    if len({p.wall_time for p in run.role_points("loss")}) <= 2:
        return f"would show in {SHOWN_BY[fault]}"
    onset = run.onset or 0
    duration = int(run.label["spec"].get("duration") or 0)  # type: ignore[attr-defined]
    lasted = _wall_at(run, onset + duration) - _wall_at(run, onset)
    if lasted < MAX_SLOWDOWN_DELAY_SECONDS:
        return (
            f"slowed for {lasted:.1f} s of wall time in all ({duration} steps), over before"
            f" the {MAX_SLOWDOWN_DELAY_SECONDS:.0f} s a page may take"
        )
    return None


# The logged losses before the onset a later point is told apart from: the run's own
# spread at its cadence (20 points: a single batch's loss ranges ×3-5 over that many on
# the corpus's small-batch shapes)
SPREAD_POINTS = 20


def shown_at(run: ShapeRun) -> int | None:
    """The step of the loss point at which an oracle that knows the onset first tells
    the points since onset from the SPREAD_POINTS before it (bench/rank_test.py);
    None where the fault's trace is not the loss (per-layer norms, wall time) or
    never shows in it."""
    if run.onset is None or run.label.get("fault") in ("frozen_layers", "slowdown"):
        return None
    losses = run.series("loss")
    before = [v for st, v in losses if st < run.onset][-SPREAD_POINTS:]
    after = [(st, v) for st, v in losses if st >= run.onset]
    n = first_visible([v for _, v in after], before)
    return after[n - 1][0] if n is not None else None


def _wall_at(run: ShapeRun, step: int) -> float:
    """The wall time of the run's last loss point at or before `step`."""
    walls = [
        p.wall_time for p in run.role_points("loss") if run.train_step(p.run, p.tag, p.step) <= step
    ]
    return max(walls, default=math.nan)


def _score_fault(s: ShapeScore, run: ShapeRun, out: Replay) -> None:
    onset = run.onset or 0
    after = [f for f in out.firings if f.step >= onset]
    why = None if after else _unobservable(run)
    if why is not None:
        s.unobservable.append(f"{run.name}: {why}")
        return
    s.faults += 1
    first_point = run.first_abnormal if run.first_abnormal is not None else onset
    if not after:
        before = [f for f in out.firings if f.step < onset]
        why = f"fired only before onset: {_fmt(before)}" if before else "nothing fired"
        s.missed.append(f"{run.name}: {why}")
    else:
        s.paged += 1
        delay = (after[0].step - first_point) / run.log_every
        s.delays.append(delay)
        seconds = (
            _wall_at(run, after[0].step) - _wall_at(run, onset)
            if run.label.get("fault") == "slowdown"
            else math.inf
        )
        if delay > MAX_PAGE_DELAY_INTERVALS and not seconds <= MAX_SLOWDOWN_DELAY_SECONDS:
            wall = f", {seconds:.1f} s" if math.isfinite(seconds) else ""
            entry = f"{run.name}: {delay:.1f} intervals{wall}, first {after[0]}"
            shown = shown_at(run)
            limit = first_point + MAX_PAGE_DELAY_INTERVALS * run.log_every
            if shown is None or shown <= limit:
                s.late.append(entry)
            else:
                since = (after[0].step - shown) / run.log_every
                entry += f"; the loss shows the fault from {shown}, {since:+.1f} intervals"
                late = since > MAX_PAGE_DELAY_INTERVALS
                (s.late if late else s.shown_late).append(entry)
    if run.crash is not None:
        s.crashes += 1
        visible = next((st for st, _ in run.series("loss") if st >= run.crash), run.crash)
        crit = next((f for f in after if f.severity == "critical"), None)
        if crit is not None and crit.step <= visible:
            s.crash_caught += 1
            lead = run.crash - crit.step
            s.crash_leads.append((lead, lead / run.log_every))
        else:
            why = f"first critical {crit}" if crit else f"no critical; {_fmt(after) or 'nothing'}"
            s.crash_missed.append(f"{run.name} (crash @{run.crash}, seen @{visible}): {why}")


def _score_lifecycle(s: ShapeScore, run: ShapeRun, out: Replay) -> None:
    if out.flaps:
        s.flaps += len(out.flaps)
        more = f" (+{len(out.flaps) - 3})" if len(out.flaps) > 3 else ""
        s.flapped.append(f"{run.name}: " + ", ".join(out.flaps[:3]) + more)
    if not run.label["healthy"]:
        onset = run.onset or 0
        # a fault that ends (a slowdown's `duration`) is not what a page after its end is about
        duration = int(run.label["spec"].get("duration") or 0)  # type: ignore[attr-defined]
        ends = onset + duration if duration else math.inf
        incident = [p for p in out.pages if onset <= p.first.step < ends]
        if incident:
            s.incident_pages.append(len(incident))
            if len(incident) > MAX_PAGES_PER_INCIDENT:
                starts = ", ".join(str(p.first) for p in incident[:4])
                s.extra_pages.append(f"{run.name}: {len(incident)} pages, starting {starts}")
    if run.label["healthy"]:
        return
    crashed = run.crash is not None
    if run.label["stayed_x3"] or crashed:
        s.should_fire += 1
        if not out.firing_at_end:
            loss = run.label["loss"]
            assert isinstance(loss, dict)
            why = (
                "crashed"
                if crashed
                else f"loss {_num(loss['final'])} vs best {_num(loss['best_pre'])}"
            )
            last = out.last_resolve or "nothing ever fired"
            s.ended_quiet.append(f"{run.name} ({why}): {last}")


def _num(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# --- printing --------------------------------------------------------------


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def _row(shape: str, s: ShapeScore, lifecycle: bool) -> str:
    per_healthy = s.warnings / s.healthy if s.healthy else math.nan
    within = s.paged - len(s.late)
    leads = sorted(s.crash_leads)
    lead = f"{leads[0][0]}/{leads[0][1]:.1f}" if leads else "-"
    cols = [
        f"{shape:{NAME_WIDTH}}",
        f"{len(s.healthy_critical)}/{s.healthy}".rjust(5),
        f"{per_healthy:.2f}".rjust(5),
        f"{s.paged}/{s.faults}".rjust(5),
        f"{within}/{s.faults}".rjust(5),
        _median(s.delays).rjust(6),
        f"{s.crash_caught}/{s.crashes}".rjust(5),
        lead.rjust(10),
    ]
    if lifecycle:
        pages = f"{max(s.incident_pages)}" if s.incident_pages else "-"
        cols += [
            pages.rjust(5),
            str(s.flaps).rjust(5),
            f"{len(s.ended_quiet)}/{s.should_fire}".rjust(6),
        ]
    return " ".join(cols)


def _header(lifecycle: bool) -> str:
    cols = [
        f"{'shape':{NAME_WIDTH}}",
        "h.crit".rjust(5),
        "w/h".rjust(5),
        "paged".rjust(5),
        "≤3int".rjust(5),
        "delay".rjust(6),
        "crash".rjust(5),
        "min lead".rjust(10),
    ]
    if lifecycle:
        cols += ["pg/in".rjust(5), "flaps".rjust(5), "quiet".rjust(6)]
    targets = [
        " " * NAME_WIDTH,
        "0".rjust(5),
        "≤0.5".rjust(5),
        "all".rjust(5),
        "all".rjust(5),
        "≤3".rjust(6),
        "all".rjust(5),
        "st/int".rjust(10),
    ]
    if lifecycle:
        targets += ["1".rjust(5), "0".rjust(5), "0".rjust(6)]
    return " ".join(cols) + "\n" + " ".join(targets) + "   <- targets"


def _misses(s: ShapeScore) -> list[tuple[str, list[str]]]:
    per_healthy = s.warnings / s.healthy if s.healthy else 0.0
    return [
        ("critical on a healthy run", s.healthy_critical),
        (
            f"warnings on healthy runs ({per_healthy:.2f}/run, target ≤ 0.5)",
            s.warned if per_healthy > MAX_WARNINGS_PER_HEALTHY else [],
        ),
        ("fault never paged", s.missed),
        (
            "paged > 3 intervals after the first abnormal point (a slowdown: and > 2 s)",
            s.late,
        ),
        ("crash without a critical by the point that shows it", s.crash_missed),
        ("more than one page for the incident", s.extra_pages),
        ("flaps (re-fired after a 'recovered' resolve)", s.flapped),
        ("ended quiet (loss ≥3× its best or crashed, nothing firing at the end)", s.ended_quiet),
        ("errors", s.errors),
    ]


def print_section(corpus: Path, rule_paths: list[str] | None, details: bool = True) -> int:
    """Print the framework-shapes tables; returns how many runs were scored."""
    runs = load(corpus)
    if not runs:
        print(
            f"\nno framework-shape runs under {corpus / SHAPES_DIR}; run bench/corpus.py --shapes"
        )
        return 0
    detectors: dict[str, Callable[[ShapeRun], Replay]] = {
        "default pack" if not rule_paths else "rules": engine(rule_paths),
        "NaN only": nan_only,
        "gn>100|loss x3": gn100_or_loss_x3,
    }
    results = {n: {r.name: d(r) for r in runs} for n, d in detectors.items()}
    by_shape: dict[str, list[ShapeRun]] = {}
    for run in runs:
        by_shape.setdefault(str(run.label["shape"]), []).append(run)
    order = [s for s in SHAPES if s in by_shape] + [s for s in by_shape if s not in SHAPES]
    print(f"\n\n=== framework shapes: {len(runs)} runs in {len(order)} logging shapes")
    print(
        "  h.crit: healthy runs with a critical; w/h: warnings per healthy run; paged: faults\n"
        "  with any alert at/after onset; ≤3int: paged within 3 logging intervals of the first\n"
        "  abnormal point, or of the point where the loss first shows the fault where that is\n"
        "  later (bench/rank_test.py); delay: median of that, in intervals; crash: critical by\n"
        "  the logged point showing the crash; min lead: steps/intervals from the first\n"
        "  critical to the crash (negative: after); pg/in: most pages for one incident;\n"
        "  quiet: ended quiet / runs that should end firing"
    )
    for name in detectors:
        lifecycle = results[name][runs[0].name].resolves
        print(f"\n== {name}")
        print(_header(lifecycle))
        for shape in order:
            shape_runs = by_shape[shape]
            print(_row(shape, score(shape_runs, results[name]), lifecycle))
        total = score(runs, results[name])
        print(_row("ALL", total, lifecycle))
        strict = total.paged - len(total.late) - len(total.shown_late)
        print(
            f"  ≤3int counted from the first point after onset instead, however the loss"
            f" looked there: {strict}/{total.faults}"
        )
    main = next(iter(detectors))
    print(f"\n== {main}: runs that miss a target, by shape")
    for shape in order:
        scored = score(by_shape[shape], results[main])
        misses = [(t, names) for t, names in _misses(scored) if names]
        if scored.unobservable:  # not misses: listed apart, with what would show them
            print(f"  {shape}: unobservable in these logs (not scored):")
            for entry in scored.unobservable:
                print(f"      {entry}")
        if scored.shown_late:  # met: the loss held no trace to page on before
            print(
                f"  {shape}: paged > 3 intervals after onset, within 3 of the point where the"
                f" loss first shows the fault (an exact rank test that knows the onset,"
                f" p < {VISIBLE_P}; met):"
            )
            for entry in scored.shown_late:
                print(f"      {entry}")
        if scored.overfit:
            print(
                f"  {shape}: healthy runs overfitting by their own numbers (validation"
                f" ≥ ×{OVERFIT_RISE} its best, training down to ×{OVERFIT_TRAIN_FALL}"
                " since), their overfitting warnings true (not counted):"
            )
            for entry in scored.overfit:
                print(f"      {entry}")
        if not misses:
            print(f"  {shape}: all targets met")
            continue
        print(f"  {shape}:")
        for title, names in misses:
            print(f"    {title}:")
            for entry in names:
                print(f"      {entry}")
    _print_resumed(runs, detectors[main])
    if details:
        _print_runs(runs, results[main])
    return len(runs)


def resumed(run: ShapeRun) -> ShapeRun:
    """A healthy run's second half as a run of its own: what a run resumed from a
    checkpoint into a new log directory (Lightning's version_1, HF's new runs/<date>)
    shows the daemon, whose first points are then a trained model's noisy losses."""
    half = max((st for st, _ in run.series("loss")), default=0) // 2
    points = [p for p in run.points if run.train_step(p.run, p.tag, p.step) >= half]
    return ShapeRun(run.name, run.label, points)


def _print_resumed(runs: list[ShapeRun], detect: Callable[[ShapeRun], Replay]) -> None:
    """The healthy runs again, resumed half-way: the references a rule learns from a
    run's first points (its start, its first baseline) are then a trained model's."""
    s = ShapeScore()
    for run in runs:
        if run.label["healthy"]:
            later = resumed(run)
            _score_healthy(s, later, detect(later))
    per = s.warnings / s.healthy if s.healthy else math.nan
    print(
        "\n== default pack on the healthy runs resumed half-way (their second half as a new"
        f"\n   run): {len(s.healthy_critical)}/{s.healthy} with a critical (target 0),"
        f" {per:.2f} warnings per run (≤ 0.5)"
    )
    for entry in s.healthy_critical + s.warned:
        print(f"    {entry}")


def _print_runs(runs: list[ShapeRun], results: dict[str, Replay]) -> None:
    print("\n== default pack, per run: onset / first abnormal point / crash; pages (first firing")
    print("   of each); what was still firing at the end")
    for run in runs:
        out = results[run.name]
        pages = "; ".join(f"{_fmt(p.firings, 2)}" for p in out.pages[:3])
        more = f" (+{len(out.pages) - 3} pages)" if len(out.pages) > 3 else ""
        end = ",".join(out.firing_at_end) or "-"
        print(
            f"  {run.name:38} {run.onset!s:>5}/{run.first_abnormal!s:>5}/{run.crash!s:>5}"
            f"  {pages or '-'}{more}  | end: {end}"
        )
