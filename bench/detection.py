"""Detection benchmark: the default rule pack against two baselines, on the labelled corpus.

    python bench/detection.py [--corpus DIR] [--rules PATH ...] [--no-dynamics]
                              [--shapes-only | --no-shapes] [--no-run-details]

Every run of the corpus (bench/corpus.py) is read back with trainsentry's own
reader and replayed through its rule engine — the code path of `trainsentry
replay` — and, in the same process, through two baselines that need no rules:

- "NaN only": critical at the first non-finite loss, which is what Keras'
  TerminateOnNaN and Lightning's `check_finite` give;
- "gn>100|loss x3": critical when the gradient norm passes 100 or the loss
  triples from one step to the next (or is non-finite).

Scores, over the labels in each run's label.json: crash recall, lead (steps
from the first critical to the crash; over predictable crashes), recall of
non-crash faults (any alert at/after onset), criticals on healthy runs and
warnings per healthy run, each against its target. A dynamics section then
describes the corpus itself (symptom-to-crash times, healthy noise), the
numbers any threshold must respect.

A last section scores the framework-shapes runs (CORPUS/frameworks/, made by
`bench/corpus.py --shapes`) per logging shape: HF Trainer, Lightning, Keras
`fit`, TF2-style and tensorboardX logs as each framework writes them by
default, with the issue's measures and the runs that miss each target
(detection_shapes.py says how each is counted).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS = HERE / ".cache" / "corpus"
sys.path.insert(0, str(HERE.parent / "daemon"))

import detection_shapes  # noqa: E402

from trainsentry.point import Point  # noqa: E402
from trainsentry.sources.reading import iter_points  # noqa: E402

# What each corpus writer calls the training loss and total gradient norm
# (corpusgen/writers.py); the baselines read these directly, as an in-process
# callback would, so they do not depend on the alias table.
LOSS_TAG = {
    "hf_tb": "train/loss",
    "lightning_csv": "train_loss",
    "lightning_tb": "train_loss",
    "tbx_tutorial": "Loss/train",
    "jsonl_plain": "loss",
    "keras_tb": "train/batch_loss",
}
GRAD_TAG = {
    "hf_tb": "train/grad_norm",
    "lightning_csv": "grad_2.0_norm_total",
    "lightning_tb": "grad_2.0_norm_total",
    "tbx_tutorial": "Gradient/Norm",
    "jsonl_plain": "grad_norm",
    "keras_tb": "train/batch_grad_norm",
}

# Targets from issue 3.
MIN_LEAD = 10
MIN_MEDIAN_LEAD = 30
# Issue 29: a gradual divergence (an lr ramp) paged a median of 100 steps or more
# before the crash: time to stop and resume from a checkpoint before the damage.
GRADUAL_FAULTS = ("lr_ramp",)
MIN_MEDIAN_GRADUAL_LEAD = 100
# Faults of part of the network (its layers frozen, dead or starved of gradient) that
# the loss and total gradient norm of these small models do not show: where no
# per-layer series is logged they are unobservable, listed apart, not missed.
LAYER_FAULTS = ("frozen_layers", "dead_relu", "vanishing")
MAX_WARNINGS_PER_HEALTHY = 1.0
MIN_NONCRASH_RECALL = 0.8


@dataclass
class Alert:
    """A firing transition, on the training-step axis."""

    step: int
    severity: str
    rule: str
    metric: str


@dataclass
class Run:
    name: str
    label: dict[str, object]
    points: list[Point]

    @property
    def crash(self) -> int | None:
        return self.label["crash_step"]  # type: ignore[return-value]

    @property
    def onset(self) -> int:
        onset = self.label["onset_step"]
        return int(onset) if onset is not None else 0  # type: ignore[arg-type]


@dataclass
class Outcome:
    """What one detector did on one run."""

    alerts: list[Alert] = field(default_factory=list)
    error: str | None = None

    def first(self, severity: str | None = None, since: int = 0) -> Alert | None:
        """The first alert at or after `since`; of `severity` (critical: criticals only)."""
        for a in sorted(self.alerts, key=lambda a: a.step):
            if a.step >= since and (severity is None or a.severity == severity):
                return a
        return None


Detector = Callable[[Run], Outcome]


# --- reading ---------------------------------------------------------------


def load_runs(corpus: Path) -> list[Run]:
    """Every run directory under `corpus` (one holding label.json), read as `replay` reads it."""
    runs = []
    for label_path in sorted(corpus.glob("*/label.json")):
        run_dir = label_path.parent
        label = json.loads(label_path.read_text())
        points = list(iter_points([run_dir]))
        runs.append(Run(run_dir.name, label, points))
    return runs


def series(run: Run, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one tag, in step order."""
    return sorted((p.step, p.value) for p in run.points if p.tag == tag)


def to_train_step(run: Run, step: int, metric: str) -> int:
    """Keras' `epoch_*` series count epochs; an alert on them is mapped to the epoch's last step."""
    if run.label["writer"] == "keras_tb" and metric.rsplit("/", 1)[-1].startswith("epoch_"):
        per_epoch = int(run.label["steps_per_epoch"])  # type: ignore[arg-type]
        return (step + 1) * per_epoch - 1
    return step


# --- detectors -------------------------------------------------------------


def nan_only(run: Run) -> Outcome:
    """Critical at the first non-finite training loss."""
    for step, value in series(run, LOSS_TAG[str(run.label["writer"])]):
        if not math.isfinite(value):
            return Outcome([Alert(step, "critical", "non_finite_loss", "loss")])
    return Outcome()


def gn100_or_loss_x3(run: Run) -> Outcome:
    """Critical at every step where grad norm > 100, the loss triples in one step, or either
    is non-finite (every trigger, so one before onset does not hide one after it)."""
    writer = str(run.label["writer"])
    out = [
        Alert(step, "critical", "grad_norm_above_100", "grad_norm")
        for step, value in series(run, GRAD_TAG[writer])
        if not math.isfinite(value) or value > 100
    ]
    prev = math.nan
    for step, value in series(run, LOSS_TAG[writer]):
        if not math.isfinite(value) or (math.isfinite(prev) and prev > 0 and value > 3 * prev):
            out.append(Alert(step, "critical", "loss_x3_in_one_step", "loss"))
        prev = value
    return Outcome(out)


def engine_detector(rule_paths: list[str] | None) -> tuple[Detector | None, str]:
    """The rule engine as a detector, or None and the reason it cannot be used."""
    try:
        from trainsentry.backtest.replay import load_rules, replay_transitions

        rules = load_rules(rule_paths)
    except Exception as exc:  # report why, keep the baselines running
        return None, f"{type(exc).__name__}: {exc}"

    def detect(run: Run) -> Outcome:
        try:
            transitions = replay_transitions(run.points, rules)
        except Exception as exc:  # one bad run must not hide the rest
            return Outcome(error=f"{type(exc).__name__}: {exc}")
        alerts = [
            Alert(to_train_step(run, t.step, t.metric), t.severity, t.rule, t.metric)
            for t in transitions
            if t.state == "firing"
        ]
        return Outcome(alerts)

    return detect, ""


# --- scoring ---------------------------------------------------------------


@dataclass
class Score:
    crashes: int = 0
    caught: int = 0  # a critical at or before the crash, at/after onset
    leads: list[int] = field(default_factory=list)  # predictable crashes that were caught
    gradual_leads: list[int] = field(default_factory=list)  # the GRADUAL_FAULTS among them
    missed_predictable: list[str] = field(default_factory=list)
    short_lead: list[str] = field(default_factory=list)
    predictable: int = 0
    noncrash: int = 0
    noncrash_flagged: int = 0
    noncrash_missed: list[str] = field(default_factory=list)
    unobservable: list[str] = field(default_factory=list)
    healthy: int = 0
    healthy_with_critical: list[str] = field(default_factory=list)
    healthy_criticals: int = 0
    healthy_warnings: int = 0
    errors: list[str] = field(default_factory=list)


def score(runs: list[Run], outcomes: dict[str, Outcome]) -> Score:
    s = Score()
    for run in runs:
        out = outcomes[run.name]
        if out.error:
            s.errors.append(f"{run.name}: {out.error}")
        if run.label["healthy"]:
            s.healthy += 1
            crit = [a for a in out.alerts if a.severity == "critical"]
            s.healthy_criticals += len(crit)
            s.healthy_warnings += sum(1 for a in out.alerts if a.severity == "warning")
            if crit:
                s.healthy_with_critical.append(run.name)
        elif run.crash is not None:
            _score_crash(s, run, out)
        else:
            seen = out.first(since=run.onset) is not None
            if not seen and not _observable(run):
                s.unobservable.append(run.name)
                continue
            s.noncrash += 1
            if seen:
                s.noncrash_flagged += 1
            else:
                s.noncrash_missed.append(run.name)
    return s


def _observable(run: Run) -> bool:
    return run.label["fault"] not in LAYER_FAULTS or detection_shapes.logs_layer_norms(run.points)


def _score_crash(s: Score, run: Run, out: Outcome) -> None:
    s.crashes += 1
    crit = out.first("critical", since=run.onset)
    caught = crit is not None and crit.step <= (run.crash or 0)
    s.caught += caught
    if not run.label["predictable"]:
        return
    s.predictable += 1
    if not caught or crit is None:
        s.missed_predictable.append(run.name)
        return
    lead = (run.crash or 0) - crit.step
    s.leads.append(lead)
    if run.label["fault"] in GRADUAL_FAULTS:
        s.gradual_leads.append(lead)
    if lead < MIN_LEAD:
        s.short_lead.append(f"{run.name} ({lead})")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_scores(name: str, s: Score) -> None:
    leads = sorted(s.leads)
    median = statistics.median(leads) if leads else math.nan
    lowest = leads[0] if leads else math.nan
    every = not s.missed_predictable and not s.short_lead and s.predictable > 0
    recall = s.noncrash_flagged / s.noncrash if s.noncrash else math.nan
    per_healthy = s.healthy_warnings / s.healthy if s.healthy else math.nan
    print(f"\n== {name}")
    print(f"  crash recall (critical by the crash)   {s.caught}/{s.crashes}")
    print(
        f"  predictable crashes caught ≥{MIN_LEAD} ahead   "
        f"{s.predictable - len(s.missed_predictable) - len(s.short_lead)}/{s.predictable}"
        f"   {_verdict(every)}"
    )
    print(
        f"  lead, steps (predictable)              median {median}  min {lowest}"
        f"   {_verdict(median >= MIN_MEDIAN_LEAD)} (median ≥ {MIN_MEDIAN_LEAD})"
    )
    gradual = statistics.median(s.gradual_leads) if s.gradual_leads else math.nan
    print(
        f"  {'lead, steps (gradual: ' + ', '.join(GRADUAL_FAULTS) + ')':39}median {gradual}"
        f"  of {len(s.gradual_leads)}   {_verdict(gradual >= MIN_MEDIAN_GRADUAL_LEAD)}"
        f" (median ≥ {MIN_MEDIAN_GRADUAL_LEAD})"
    )
    print(
        f"  non-crash fault recall                 {s.noncrash_flagged}/{s.noncrash}"
        f" = {recall:.0%}   {_verdict(recall >= MIN_NONCRASH_RECALL)} (≥ 80%)"
    )
    print(
        f"  healthy runs with a critical           {len(s.healthy_with_critical)}/{s.healthy}"
        f" ({s.healthy_criticals} criticals)   {_verdict(not s.healthy_with_critical)}"
    )
    print(
        f"  warnings per healthy run               {per_healthy:.2f}"
        f"   {_verdict(per_healthy <= MAX_WARNINGS_PER_HEALTHY)} (≤ 1)"
    )
    for title, names in (
        ("missed predictable crashes", s.missed_predictable),
        ("caught < 10 steps ahead", s.short_lead),
        ("missed non-crash faults", s.noncrash_missed),
        ("unobservable without per-layer series (not scored)", s.unobservable),
        ("healthy runs with a critical", s.healthy_with_critical),
        ("errors", s.errors),
    ):
        if names:
            print(f"  {title}: " + ", ".join(names))


def _step(a: Alert | None) -> str:
    return "-" if a is None else str(a.step)


def print_runs(runs: list[Run], results: dict[str, dict[str, Outcome]]) -> None:
    """First warning/critical per detector against onset and crash, one line per run."""
    names = list(results)
    head = f"{'run':40} {'onset':>5} {'crash':>5}"
    for n in names:
        head += f" | {n[:16]:>16}"
    print("\n== per run: first alert (any severity) / first critical, at/after step 0")
    print(head)
    for run in runs:
        line = f"{run.name:40} {run.label['onset_step']!s:>5} {run.crash!s:>5}"
        for n in names:
            out = results[n][run.name]
            line += f" | {_step(out.first()):>7} /{_step(out.first('critical')):>7}"
        print(line)
    if "default pack" in results:
        print("\n== default pack: first firing rules per run (step rule [metric])")
        for run in runs:
            alerts = sorted(results["default pack"][run.name].alerts, key=lambda a: a.step)
            shown = ", ".join(
                f"{a.step} {a.rule}[{a.metric}]{'!' if a.severity == 'critical' else ''}"
                for a in alerts[:4]
            )
            more = f" (+{len(alerts) - 4})" if len(alerts) > 4 else ""
            print(f"  {run.name:40} {shown or '-'}{more}")


# --- corpus dynamics -------------------------------------------------------


def _history(corpus: Path, run: Run) -> dict[str, list[float]]:
    return json.loads((corpus / run.name / "history.json").read_text())


def _pre_median(values: list[float], onset: int, span: int = 100) -> float:
    pre = [v for v in values[max(0, onset - span) : onset] if math.isfinite(v)]
    return statistics.median(pre) if pre else math.nan


def _first_above(values: list[float], since: int, bound: float) -> int | None:
    for i in range(since, len(values)):
        if not math.isfinite(values[i]) or values[i] > bound:
            return i
    return None


def print_dynamics(corpus: Path, runs: list[Run]) -> None:
    """Symptom-to-crash times per faulty run, and the noise of healthy runs."""
    print("\n== corpus dynamics (raw per-step series from history.json)")
    print("  crashes: first step ≥ onset with grad norm > 3× / loss > 2× the pre-onset median")
    print(f"  {'run':40} {'onset':>5} {'gn>3x':>6} {'loss>2x':>7} {'crash':>6} {'lead avail':>10}")
    for run in runs:
        if run.crash is None or run.label["healthy"]:
            continue
        h = _history(corpus, run)
        gn, loss = h["grad_norm"], h["loss"]
        sym_g = _first_above(gn, run.onset, 3 * _pre_median(gn, run.onset))
        sym_l = _first_above(loss, run.onset, 2 * _pre_median(loss, run.onset))
        firsts = [s for s in (sym_g, sym_l) if s is not None]
        avail = run.crash - min(firsts) if firsts else None
        print(
            f"  {run.name:40} {run.onset:>5} {sym_g!s:>6} {sym_l!s:>7} {run.crash:>6} {avail!s:>10}"
        )
    _print_healthy_noise(corpus, [r for r in runs if r.label["healthy"]])
    _print_noncrash_effects(corpus, [r for r in runs if not r.label["healthy"] and r.crash is None])


def _ratios(values: Iterable[float]) -> list[float]:
    v = [x for x in values if math.isfinite(x) and x > 0]
    return [b / a for a, b in pairwise(v)]


def _print_healthy_noise(corpus: Path, runs: list[Run]) -> None:
    print("\n  healthy noise: grad norm max/median (all steps, and after step 50),")
    print("  largest one-step loss ratio, loss max after step 50 / median, step_time max/median")
    rows = []
    for run in runs:
        h = _history(corpus, run)
        gn, loss = h["grad_norm"], h["loss"]
        med = statistics.median(gn)
        late = gn[50:]
        st = [v for _, v in series(run, _step_time_tag(run))]
        row = (
            max(gn) / med,
            max(late) / statistics.median(late),
            max(_ratios(loss)),
            max(loss[50:]) / statistics.median(loss[50:]),
            max(st) / statistics.median(st) if st else math.nan,
        )
        rows.append(row)
        print(
            f"  {run.name:40} gn {row[0]:6.1f} {row[1]:6.1f}  loss step× {row[2]:5.2f}"
            f"  loss max/med {row[3]:5.2f}  step_time {row[4]:5.1f}  (max gn {max(gn):.2f})"
        )
    if rows:
        worst = [max(r[i] for r in rows) for i in range(5)]
        print(
            f"  WORST over healthy: gn max/med {worst[0]:.1f} (after step 50: {worst[1]:.1f}),"
            f" one-step loss ratio {worst[2]:.2f}, loss max/med {worst[3]:.2f},"
            f" step_time max/med {worst[4]:.1f}"
        )


STEP_TIME_TAG = {
    "hf_tb": "train/step_time",
    "lightning_csv": "step_time",
    "lightning_tb": "step_time",
    "tbx_tutorial": "Time/step",
    "jsonl_plain": "step_time",
    "keras_tb": "train/batch_step_time",
}


def _step_time_tag(run: Run) -> str:
    return STEP_TIME_TAG[str(run.label["writer"])]


def _print_noncrash_effects(corpus: Path, runs: list[Run]) -> None:
    print("\n  non-crash faults: size of the symptom after onset (vs the 100 steps before)")
    for run in runs:
        h = _history(corpus, run)
        gn, loss = h["grad_norm"], h["loss"]
        o = run.onset
        pre_g, pre_l = _pre_median(gn, o), _pre_median(loss, o)
        post = slice(o, o + 100)
        g_post = statistics.median(gn[post]) if gn[post] else math.nan
        l_peak = max(loss[post]) if loss[post] else math.nan
        l_post = statistics.median(loss[post]) if loss[post] else math.nan
        val = h["val"]
        vmin = min(v for _, v in val) if val else math.nan
        vend = val[-1][1] if val else math.nan
        note = (
            f"gn median {pre_g:.3g} → {g_post:.3g} (×{g_post / pre_g:.2g}); "
            f"loss median {pre_l:.3g} → {l_post:.3g}, peak {l_peak:.3g}; "
            f"val min {vmin:.3g} end {vend:.3g}"
        )
        if run.label["fault"] == "vanishing":
            note = f"gn median {statistics.median(gn):.3g}; loss {loss[0]:.3g} → {loss[-1]:.3g}"
        print(f"  {run.name:40} onset {o:>4}: {note}")


# --- main ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--rules", nargs="*", default=None, help="rule files (default: shipped pack)")
    ap.add_argument("--no-dynamics", action="store_true", help="skip the corpus statistics")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--shapes-only", action="store_true", help="only the framework shapes")
    part.add_argument("--no-shapes", action="store_true", help="skip the framework shapes")
    ap.add_argument(
        "--no-run-details", action="store_true", help="framework shapes: no per-run lines"
    )
    args = ap.parse_args(argv)
    scored = 0
    if not args.shapes_only:
        scored += classic(args)
    if not args.no_shapes:
        scored += detection_shapes.print_section(args.corpus, args.rules, not args.no_run_details)
    if not scored:
        print(f"no runs with label.json under {args.corpus}; run bench/corpus.py first")
        return 2
    return 0


def classic(args: argparse.Namespace) -> int:
    """The classic corpus's sections; returns how many runs were scored."""
    runs = load_runs(args.corpus)
    if not runs:
        return 0
    detectors: dict[str, Detector] = {}
    engine, why = engine_detector(args.rules)
    if engine is not None:
        detectors["default pack" if not args.rules else "rules"] = engine
    detectors["NaN only"] = nan_only
    detectors["gn>100|loss x3"] = gn100_or_loss_x3
    healthy = sum(1 for r in runs if r.label["healthy"])
    crashes = sum(1 for r in runs if r.crash is not None)
    print(f"corpus {args.corpus}: {len(runs)} runs, {healthy} healthy, {crashes} crashes")
    if engine is None:
        print(f"rule engine unusable, baselines only: {why}")
    results = {n: {r.name: d(r) for r in runs} for n, d in detectors.items()}
    for n in detectors:
        print_scores(n, score(runs, results[n]))
    print_runs(runs, results)
    if not args.no_dynamics:
        print_dynamics(args.corpus, runs)
    return len(runs)


if __name__ == "__main__":
    raise SystemExit(main())
