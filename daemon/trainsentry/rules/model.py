"""The engine's own vocabulary: plain frozen dataclasses.

Pydantic stops at the file boundary (schema.py). Past it every rule is a frozen
dataclass: the hot path pays no validation, rules compare by value (a reload
that changes nothing keeps alert state), and nothing here knows about YAML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["warning", "critical"]
# which of two severities is the higher: routes filter by it, reports keep the worst
SEVERITY_RANK: dict[str, int] = {"warning": 1, "critical": 2}
SpanUnit = Literal["steps", "points", "seconds"]

# Verdict codes returned by conditions on every point; ints, not objects,
# because a verdict is produced for every point and every matching rule.
QUIET = 0  # the condition holds no alarm
ACTIVE = 1  # alarm at the rule's own severity
CRITICAL = 2  # alarm, escalated to critical whatever the rule's severity
# Inside a threshold's hysteresis band: keeps a firing alert firing, but neither
# starts nor continues a pending one (`for` counts points past the threshold).
HELD = -1

_SPAN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e(\d+))?\s*([a-z]*)\s*$", re.IGNORECASE)
_UNITS: dict[str, tuple[SpanUnit, float]] = {
    "": ("steps", 1.0),
    "step": ("steps", 1.0),
    "steps": ("steps", 1.0),
    "point": ("points", 1.0),
    "points": ("points", 1.0),
    "eval": ("points", 1.0),
    "evals": ("points", 1.0),
    "evaluation": ("points", 1.0),
    "evaluations": ("points", 1.0),
    "s": ("seconds", 1.0),
    "sec": ("seconds", 1.0),
    "secs": ("seconds", 1.0),
    "second": ("seconds", 1.0),
    "seconds": ("seconds", 1.0),
    "m": ("seconds", 60.0),
    "min": ("seconds", 60.0),
    "mins": ("seconds", 60.0),
    "minute": ("seconds", 60.0),
    "minutes": ("seconds", 60.0),
    "h": ("seconds", 3600.0),
    "hour": ("seconds", 3600.0),
    "hours": ("seconds", 3600.0),
    "d": ("seconds", 86400.0),
    "day": ("seconds", 86400.0),
    "days": ("seconds", 86400.0),
}
SPAN_HELP = "a span like `200 steps`, `10 points` (evaluations), `90s`, `5m` or `2h`"
HOLD_HELP = f"{SPAN_HELP}, optionally with `and N points` (`100 steps and 2 points`)"
_AND_POINTS = re.compile(r"^(.*\S)\s+and\s+(\d+)\s*points?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Span:
    """A length on the data's own axis: training steps, logged points, or seconds.

    Windows and `for` are measured on the run's clock, never the daemon's, so a
    replay of finished logs decides exactly as the live daemon did.
    """

    amount: float
    unit: SpanUnit
    # `for` and `keep_firing_for` only: also this many points. A point stands for
    # its interval, which is right for a mean (HF's loss) and wrong for a series
    # whose point is one step's value (HF's grad_norm): `100 steps` is one such
    # point at 500-step logging, `100 steps and 2 points` is never one batch.
    min_points: int = 0

    @classmethod
    def parse_hold(cls, text: str | int | float) -> Span:
        """A span, or `<span> and N points`; raises ValueError with the accepted forms."""
        match = _AND_POINTS.match(text) if isinstance(text, str) else None
        try:
            span = cls.parse(text if match is None else match.group(1))
        except ValueError:
            raise ValueError(f"expected {HOLD_HELP}, got {text!r}") from None
        if match is None:
            return span
        if span.unit == "points":
            raise ValueError(f"expected {HOLD_HELP}, got {text!r}: both are points")
        return cls(span.amount, span.unit, int(match.group(2)))

    @classmethod
    def parse(cls, text: str | int | float) -> Span:
        """A bare number is steps; raises ValueError with the accepted forms."""
        if isinstance(text, bool):
            raise ValueError(f"expected {SPAN_HELP}, got {text!r}")
        if isinstance(text, (int, float)):
            if text < 0:
                raise ValueError(f"expected {SPAN_HELP}, got a negative number")
            return cls(float(text), "steps")
        match = _SPAN.match(str(text))
        unit = _UNITS.get(match.group(3).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(f"expected {SPAN_HELP}, got {text!r}")
        amount = float(match.group(1)) * (10 ** int(match.group(2)) if match.group(2) else 1)
        return cls(amount * unit[1], unit[0])

    def __str__(self) -> str:
        if self.unit == "seconds":
            text = f"{self.amount:g}s"
            for size, suffix in ((3600.0, "h"), (60.0, "m")):
                if self.amount >= size and self.amount % size == 0:
                    text = f"{self.amount / size:g}{suffix}"
                    break
        else:
            text = f"{self.amount:g} {self.unit}"
        return f"{text} and {self.min_points} points" if self.min_points else text

    def reached(self, steps: float, seconds: float, points: int) -> bool:
        """Has a streak of `steps` steps, `seconds` of the run's time and `points` points
        lasted this long?"""
        if points < self.min_points:
            return False
        if self.amount <= 0:
            return True
        if self.unit == "steps":
            return steps >= self.amount
        if self.unit == "seconds":
            return seconds >= self.amount
        return points >= self.amount


# --- condition specs, one per kind; the evaluators live in threshold/window/pattern ---


@dataclass(frozen=True, slots=True)
class NonFinite:
    """NaN or ±inf: training that produced one has almost never recovered on its own."""

    # ... and, where set, `other` logged at the same step at most `other_at_most`: a
    # non-finite value that alone may be benign means more beside what the same record
    # says of the other series (HF logs a wholly NaN interval's loss as 0.0)
    other: str | None = None
    other_at_most: float | None = None


@dataclass(frozen=True, slots=True)
class Threshold:
    above: float | None = None
    below: float | None = None
    resolve_below: float | None = None  # hysteresis: stays active until back under this
    resolve_above: float | None = None
    critical_above: float | None = None
    critical_below: float | None = None


@dataclass(frozen=True, slots=True)
class Plateau:
    window: Span
    min_improvement: float = 0.0  # relative, e.g. 0.01 = 1 %
    min_delta: float = 0.0  # absolute, Keras EarlyStopping's min_delta
    method: Literal["best", "mean"] = "mean"
    goal: Literal["min", "max"] = "min"


@dataclass(frozen=True, slots=True)
class Rise:
    factor: float  # smoothed value over its own smoothed best
    smoothing: int = 20  # EWMA span in points
    min_delta: float = 0.0
    skip: int = 0  # points before the best is tracked (initial transients)
    # a level that has fallen back this fraction of the way from its peak towards its best
    # is recovering (a transient that passes), not diverging; 0 disables the test
    recovery: float = 0.0
    # a firing rise resolves only once the level is under this × its best (hysteresis);
    # None: under `factor`
    resolve_factor: float | None = None
    # the level is the mean over this span instead of an EWMA over points (window.py)
    window: Span | None = None


@dataclass(frozen=True, slots=True)
class Pair:
    other: str  # canonical name of the second series, same run
    ratio_above: float | None = None  # this / other
    gap_above: float | None = None  # this - other
    other_below: float | None = None
    other_above: float | None = None
    rise_from_best: float | None = None  # this above its own best by this fraction
    other_fall_since_best: float | None = None  # while the other fell by this fraction
    other_smoothing: int = 10  # EWMA span (points) of the other series
    jump_from_max: float | None = None  # this over the highest of its earlier values
    other_jump: float | None = None  # the other's latest value over its level before it


@dataclass(frozen=True, slots=True)
class Baseline:
    learn: Span
    skip: Span = Span(0.0, "points")
    rolling: bool = False
    # judge from this many points of the first baseline, before `learn` are in: a run
    # that logs a point an epoch must not wait `learn` epochs to be judged at all
    min_points: int | None = None
    z_above: float | None = None
    z_below: float | None = None
    ratio_above: float | None = None
    ratio_below: float | None = None
    value_above: float | None = None  # extra absolute guards, ANDed
    value_below: float | None = None


@dataclass(frozen=True, slots=True)
class Throughput:
    slowdown: float  # recent seconds-per-step over the baseline's
    source: Literal["clock", "step_time", "rate"] = "clock"
    learn: int = 50  # intervals (or values) in the baseline
    # ... or as many as cover this many steps, if fewer: sparse points are averages already
    learn_steps: int = 0
    skip: int = 5  # first intervals ignored: compilation, cache warm-up
    recent: int = 9  # median of the last N: a single checkpoint pause is not a drop
    # and at least this many seconds per step (per unit for `rate`) slower than the
    # baseline: ×3 of a 3 ms step is scheduler jitter, not a slowdown anyone notices
    min_increase: float = 0.0
    # clock only: and the latest interval between two stamps at least this many seconds
    # longer than its steps take at the baseline pace — with `recent: 1`, one pause
    # between logged steps, however many steps it spans
    min_gap: float = 0.0


@dataclass(frozen=True, slots=True)
class NoData:
    factor: float = 20.0  # silence longer than this many typical logging intervals
    min_silence: float = 900.0  # seconds; above writers' 120 s flush buffering
    max_silence: float | None = None
    learn: int = 32  # intervals remembered for the typical interval


@dataclass(frozen=True, slots=True)
class Stale:
    factor: float = 10.0  # the run went on this many of the series' typical intervals
    min_steps: int = 0  # and at least this many steps past the series' last point
    learn: int = 3  # intervals of the series seen before it is judged
    unchanged: bool = False  # a point repeating the value before it is no new point


@dataclass(frozen=True, slots=True)
class Growth:
    window: Span
    min_growth: float = 4.0  # fitted growth factor over the window
    min_r2: float = 0.8
    min_points: int = 8
    min_value: float = 0.0  # ignore growth while the value is below this
    threshold: float | None = None  # projection target
    critical_within: float | None = None  # steps to crossing that escalate to critical


@dataclass(frozen=True, slots=True)
class Spike:
    method: Literal["sigma", "ewma"] = "sigma"
    window: int = 100  # points behind the mean and sigma
    k: float = 6.0
    min_ratio: float = 1.5  # and at least this multiple of the mean: flat series have tiny σ
    fast: int = 3  # EWMA spans (points) for method ewma
    slow: int = 100
    ratio: float = 2.0
    warmup: int = 20  # points before a spike can be judged
    repeat_count: int | None = None  # this many spike episodes ...
    repeat_within: Span | None = None  # ... within this span escalate to critical
    settle: int = 1  # points back within normal that end a spike episode


@dataclass(frozen=True, slots=True)
class AcrossRanks:
    """Each rank of a job against the other ranks at the same step (rules/ranks.py).

    A straggler (`above_median`): the rank's value is at least this × the other
    ranks' median and, where `min_share` is set, more than it by that share of the
    median rank's seconds per step. A diverging rank (`outside_band`): the rank's
    value is `min_ratio` × (or 1/that) off the others' median and that many times
    the ranks' typical log-spread away, once `learn` steps taught the spread.
    """

    above_median: float | None = None
    min_share: float = 0.0
    outside_band: float | None = None
    min_ratio: float = 2.0
    learn: int = 20  # compared steps before the typical spread is known
    min_ranks: int = 3  # two ranks cannot say which of them is the odd one


@dataclass(frozen=True, slots=True)
class AcrossLayers:
    """Each layer of a run against the largest layer at the same step (rules/layers.py):
    active under `ratio_below` × the largest; between that and `resolve_above` ×, held."""

    ratio_below: float
    resolve_above: float


@dataclass(frozen=True, slots=True)
class Restarts:
    """A job's new attempt (rules/attempts.py): each restart; `storm` restarts within
    `within` seconds; or the last `no_progress` restarts resumed at no later step."""

    storm: int | None = None
    within: float | None = None
    no_progress: int | None = None


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """A job's checkpoints against its progress (rules/checkpoints.py): overdue once a
    record it logs is `overdue` × the cadence learned from `learn` intervals past its last
    checkpoint, in steps and in time (and at least `min_late` seconds); with `lost`,
    judged instead when one of its runs crashed or hung so: the work lost."""

    overdue: float = 3.0
    learn: int = 2
    min_late: float = 0.0
    lost: bool = False


RunEnd = Literal["crashed", "preempted", "cancelled", "finished"]


@dataclass(frozen=True, slots=True)
class Pattern:
    """A regex over a text log's events (rules/log_rules.py), not over a series.

    `levels`: only events of these levels ("error", ...; "" is a plain line with
    none); empty for any. `events`: only events of these kinds. `fallback`:
    a catch-all (any traceback) that stays quiet where a more telling rule
    (a CUDA OOM) matched the same event, so one crash pages once. `ends_run`:
    what the run's life is once this fires (a crash, a preemption), and
    `cause` the words for it (default: the matched text). `new_attempt`: the job
    runs again into the same logs (Slurm's requeue), so the run's next record
    begins another attempt of its job (rules/attempts.py).
    """

    regex: str
    levels: tuple[str, ...] = ()
    events: tuple[str, ...] = ()  # event kinds: line, traceback, report, record; empty for any
    fallback: bool = False  # only for events no other pattern rule matched
    ends_run: RunEnd | None = None
    cause: str | None = None
    # the rank that logs this waited in a collective for other ranks until it timed out:
    # a `collective_hang` rule names the ranks it waited for before this pages (hang.py)
    collective_timeout: bool = False
    new_attempt: bool = False


@dataclass(frozen=True, slots=True)
class CollectiveHang:
    """The ranks of a job that did not time out in a collective while others did: the ones
    the others waited for (rules/hang.py). Decided once every rank but one reported a
    timeout, or `grace` seconds after the first report."""

    grace: float = 10.0


@dataclass(frozen=True, slots=True)
class Action:
    """What a firing rule does besides notifying; opt-in per rule (alerts/notifier.py).

    `stop` writes the run's stop file (actions/stop_file.py); `command` runs an
    argument list, never a shell, with the alert in its environment.
    """

    kind: Literal["stop", "command"]
    command: tuple[str, ...] = ()
    timeout: float = 30.0  # seconds, command only


Condition = (
    NonFinite
    | Threshold
    | Plateau
    | Rise
    | Pair
    | Baseline
    | Throughput
    | NoData
    | Stale
    | Growth
    | Spike
    | AcrossRanks
    | AcrossLayers
    | Pattern
    | CollectiveHang
    | Restarts
    | Checkpoints
)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    condition: Condition
    severity: Severity = "warning"
    metrics: tuple[str, ...] = ()  # globs over canonical names
    tags: tuple[str, ...] = ()  # globs over raw tags
    family: str = ""  # critical inhibits warning within (run, family)
    for_: Span | None = None
    keep_firing_for: Span | None = None
    labels: tuple[tuple[str, str], ...] = ()
    message: str | None = None  # str.format template; see lifecycle.MESSAGE_FIELDS
    runbook: str | None = None
    min_step: int = 0  # points before this step are not evaluated
    # only series on this axis (engine.axis_of): a pace measured in steps means nothing
    # on Keras' per-epoch series, whose steps are epochs; None for every series
    axis: Literal["steps", "epochs"] | None = None
    actions: tuple[Action, ...] = ()  # run once when the alert first fires
    origin: str = field(default="", compare=False)  # "file:line" for humans

    @property
    def group(self) -> str:
        return self.family or self.name


@dataclass(frozen=True)
class RuleSet:
    """What the engine runs: the rules and the user's additions to the alias table."""

    rules: tuple[Rule, ...] = ()
    aliases: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (canonical, tags), user first

    def __len__(self) -> int:
        return len(self.rules)
