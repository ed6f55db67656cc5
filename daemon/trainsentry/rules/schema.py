"""The rule file as pydantic sees it: the one place input is distrusted.

Every model forbids unknown keys (a misspelt `keep_firing_for` must not be
silently ignored), and a rule names its condition by a key of its own
(`growth:`, `spike:` ...) rather than a `kind:` field, so pydantic reports an
error in a growth rule against the growth fields only instead of one error per
member of a union. `to_rule` hands the engine plain dataclasses.
"""

from __future__ import annotations

import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, field_validator, model_validator

from trainsentry.rules import model as m
from trainsentry.rules.pattern_set import PatternError, compile_regex

MESSAGE_FIELDS = frozenset(
    {"run", "rule", "severity", "metric", "canonical", "value", "step", "wall_time"}
    | {"evidence", "runbook", "labels"}
    | {"match", "path", "line"}  # pattern rules' (log_rules.py)
)


def _span(value: Any, *, hold: bool = False) -> m.Span:
    if isinstance(value, m.Span):
        return value
    if not isinstance(value, (str, int, float)):
        help_ = m.HOLD_HELP if hold else m.SPAN_HELP
        raise ValueError(f"expected {help_}, got {type(value).__name__}")
    return m.Span.parse_hold(value) if hold else m.Span.parse(value)


def _time(value: Any) -> m.Span:
    span = _span(value)
    if span.unit != "seconds":
        raise ValueError(f"expected a time like `10s`, `30m` or `2h`, got {value!r}")
    return span


SpanField = Annotated[m.Span, PlainValidator(_span)]
SecondsField = Annotated[m.Span, PlainValidator(_time)]  # a span of the run's clock only
# `for` and `keep_firing_for`: a span, or one with `and N points`
HoldField = Annotated[m.Span, PlainValidator(lambda value: _span(value, hold=True))]
Positive = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(ge=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class NonFiniteSpec(Strict):
    other: str | None = None
    other_at_most: float | None = None

    @model_validator(mode="after")
    def _paired(self) -> NonFiniteSpec:
        if (self.other is None) != (self.other_at_most is None):
            raise ValueError("`other` and `other_at_most` go together")
        return self


class ThresholdSpec(Strict):
    above: float | None = None
    below: float | None = None
    resolve_below: float | None = None
    resolve_above: float | None = None
    critical_above: float | None = None
    critical_below: float | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ThresholdSpec:
        if self.above is None and self.below is None:
            raise ValueError("a threshold needs `above` or `below`")
        if self.resolve_below is not None and (
            self.above is None or self.resolve_below > self.above
        ):
            raise ValueError("`resolve_below` needs `above` and must not exceed it")
        if self.resolve_above is not None and (
            self.below is None or self.resolve_above < self.below
        ):
            raise ValueError("`resolve_above` needs `below` and must not be under it")
        return self


class PlateauSpec(Strict):
    window: SpanField
    min_improvement: float = Field(0.0, ge=0)
    min_delta: float = Field(0.0, ge=0)
    method: Literal["best", "mean"] = "mean"
    goal: Literal["min", "max"] = "min"


class RiseSpec(Strict):
    factor: float = Field(gt=1)
    smoothing: Count = 20
    min_delta: float = Field(0.0, ge=0)
    skip: int = Field(0, ge=0)
    recovery: float = Field(0.0, ge=0, lt=1)
    resolve_factor: float | None = Field(None, gt=1)
    window: SpanField | None = None

    @model_validator(mode="after")
    def _one_level(self) -> RiseSpec:
        given = self.model_fields_set
        if self.window is not None and given & {"smoothing", "recovery", "skip", "resolve_factor"}:
            raise ValueError(
                "a rise's level is a `window` mean or an EWMA (`smoothing`, `recovery`, `skip`,"
                " `resolve_factor`), not both"
            )
        if self.resolve_factor is not None and self.resolve_factor > self.factor:
            raise ValueError("`resolve_factor` is at most `factor`: the level a firing rise leaves")
        return self


class PairSpec(Strict):
    other: str
    ratio_above: Positive | None = None
    gap_above: float | None = None
    other_below: float | None = None
    other_above: float | None = None
    rise_from_best: float | None = Field(None, ge=0)
    other_fall_since_best: float | None = Field(None, ge=0)
    other_smoothing: Count = 10
    jump_from_max: float | None = Field(None, gt=1)
    other_jump: float | None = Field(None, gt=1)

    @model_validator(mode="after")
    def _has_test(self) -> PairSpec:
        own = (self.ratio_above, self.gap_above, self.rise_from_best, self.jump_from_max)
        if all(t is None for t in own):
            raise ValueError(
                "a pair needs `ratio_above`, `gap_above`, `rise_from_best` or `jump_from_max`"
            )
        return self


class BaselineSpec(Strict):
    learn: SpanField
    skip: SpanField = m.Span(0.0, "points")
    rolling: bool = False
    min_points: int | None = Field(None, ge=3)
    z_above: float | None = None
    z_below: float | None = None
    ratio_above: Positive | None = None
    ratio_below: Positive | None = None
    value_above: float | None = None
    value_below: float | None = None

    @model_validator(mode="after")
    def _has_test(self) -> BaselineSpec:
        tests = (self.z_above, self.z_below, self.ratio_above, self.ratio_below)
        if all(t is None for t in tests):
            raise ValueError(
                "a baseline needs `z_above`, `z_below`, `ratio_above` or `ratio_below`"
            )
        if self.learn.unit != "points":
            raise ValueError("`learn` is counted in points, e.g. `200 points`")
        if self.min_points is not None and self.min_points > self.learn.amount:
            raise ValueError("`min_points` is at most `learn`: the points of the first baseline")
        return self


class ThroughputSpec(Strict):
    slowdown: float = Field(gt=1)
    source: Literal["clock", "step_time", "rate"] = "clock"
    learn: Count = 50
    learn_steps: int = Field(0, ge=0)
    skip: int = Field(5, ge=0)
    recent: Count = 9
    min_increase: float = Field(0.0, ge=0)
    min_gap: SpanField = m.Span(0.0, "seconds")

    @field_validator("min_gap")
    @classmethod
    def _gap_seconds(cls, value: m.Span) -> m.Span:
        if value.unit != "seconds":
            raise ValueError("a gap is a time, e.g. `10m` or `600s`")
        return value

    @model_validator(mode="after")
    def _gap_needs_clock(self) -> ThroughputSpec:
        if self.min_gap.amount and self.source != "clock":
            raise ValueError("`min_gap` is measured on the clock: it needs `source: clock`")
        return self


class StaleSpec(Strict):
    factor: float = Field(10.0, gt=1)
    min_steps: int = Field(0, ge=0)
    learn: Count = 3
    unchanged: bool = False


class NoDataSpec(Strict):
    factor: float = Field(20.0, gt=1)
    min_silence: SpanField = m.Span(900.0, "seconds")
    max_silence: SpanField | None = None
    learn: Count = 32

    @field_validator("min_silence", "max_silence")
    @classmethod
    def _seconds(cls, value: m.Span | None) -> m.Span | None:
        if value is not None and value.unit != "seconds":
            raise ValueError("silence is a time, e.g. `15m` or `900s`")
        return value


class GrowthSpec(Strict):
    window: SpanField
    min_growth: float = Field(4.0, gt=1)
    min_r2: float = Field(0.8, ge=0, le=1)
    min_points: int = Field(8, ge=3)
    min_value: float = Field(0.0, ge=0)
    threshold: Positive | None = None
    critical_within: SpanField | None = None

    @model_validator(mode="after")
    def _projection(self) -> GrowthSpec:
        if self.critical_within is not None:
            if self.threshold is None:
                raise ValueError("`critical_within` projects onto `threshold`; set one")
            if self.critical_within.unit != "steps":
                raise ValueError("`critical_within` is counted in steps")
        return self


class RepeatSpec(Strict):
    count: int = Field(ge=2)
    within: SpanField


class SpikeSpec(Strict):
    method: Literal["sigma", "ewma"] = "sigma"
    window: int = Field(100, ge=3)
    k: Positive = 6.0
    min_ratio: float = Field(1.5, ge=1)
    fast: Count = 3
    slow: Count = 100
    ratio: float = Field(2.0, gt=1)
    warmup: int = Field(20, ge=0)
    repeat: RepeatSpec | None = None
    settle: Count = 1


class AcrossRanksSpec(Strict):
    above_median: float | None = Field(None, gt=1)
    min_share: float = Field(0.0, ge=0)
    outside_band: Positive | None = None
    min_ratio: float = Field(2.0, gt=1)
    learn: int = Field(20, ge=0)
    min_ranks: int = Field(3, ge=2)

    @model_validator(mode="after")
    def _one_test(self) -> AcrossRanksSpec:
        if (self.above_median is None) == (self.outside_band is None):
            raise ValueError(
                "compare ranks by `above_median` (a straggler) or `outside_band` (a rank that"
                " diverges), one of the two"
            )
        if self.min_share and self.above_median is None:
            raise ValueError("`min_share` goes with `above_median`")
        return self


class AcrossLayersSpec(Strict):
    ratio_below: float = Field(gt=0, lt=1)
    resolve_above: float | None = Field(None, lt=1)

    @model_validator(mode="after")
    def _band(self) -> AcrossLayersSpec:
        if self.resolve_above is not None and self.resolve_above < self.ratio_below:
            raise ValueError("`resolve_above` is at least `ratio_below`")
        return self


class PatternSpec(Strict):
    regex: str = Field(min_length=1)
    level: str | list[str] | None = None
    events: list[Literal["line", "traceback", "report", "record"]] = []
    fallback: bool = False
    ends_run: Literal["crashed", "preempted", "cancelled", "finished"] | None = None
    cause: str | None = None
    collective_timeout: bool = False
    new_attempt: bool = False

    @field_validator("regex")
    @classmethod
    def _compiles(cls, text: str) -> str:
        """Compiled as it will run: RE2, linear in the line whatever the pattern
        (rules/pattern_set.py); what RE2 cannot run is refused here, with the reason."""
        try:
            compile_regex(text)
        except PatternError as exc:
            raise ValueError(f"bad regex: {exc} (patterns are RE2: docs/rules.md)") from None
        return text


class CollectiveHangSpec(Strict):
    grace: SecondsField = m.Span(10.0, "seconds")


class RestartsSpec(Strict):
    storm: int | None = Field(None, ge=1)
    within: SecondsField | None = None
    no_progress: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_test(self) -> RestartsSpec:
        if (self.storm is None) != (self.within is None):
            raise ValueError("a storm is `storm: N` restarts `within: SPAN`, both")
        if self.storm is not None and self.no_progress is not None:
            raise ValueError("one of `storm` or `no_progress` a rule (or neither: every restart)")
        return self


class CheckpointsSpec(Strict):
    overdue: float = Field(3.0, gt=1)
    learn: Count = 2
    min_late: SecondsField = m.Span(0.0, "seconds")
    lost: bool = False


# rules on text logs and job life (log_rules.py), not series
TEXT_KINDS = ("pattern", "collective_hang", "restarts", "checkpoints")
CONDITIONS: dict[str, type[Strict]] = {
    "non_finite": NonFiniteSpec,
    "threshold": ThresholdSpec,
    "plateau": PlateauSpec,
    "rise": RiseSpec,
    "pair": PairSpec,
    "baseline": BaselineSpec,
    "throughput": ThroughputSpec,
    "no_data": NoDataSpec,
    "stale": StaleSpec,
    "growth": GrowthSpec,
    "spike": SpikeSpec,
    "across_ranks": AcrossRanksSpec,
    "across_layers": AcrossLayersSpec,
    "pattern": PatternSpec,
    "collective_hang": CollectiveHangSpec,
    "restarts": RestartsSpec,
    "checkpoints": CheckpointsSpec,
}


class CommandActionSpec(Strict):
    command: list[str] = Field(min_length=1)  # argument list, no shell
    timeout: Positive = 30.0  # seconds


def _action(spec: Literal["stop"] | CommandActionSpec) -> m.Action:
    if isinstance(spec, CommandActionSpec):
        return m.Action("command", tuple(spec.command), spec.timeout)
    return m.Action("stop")


class RuleSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    metric: str | list[str] | None = None
    tag: str | list[str] | None = None
    severity: Literal["warning", "critical"] = "warning"
    family: str | None = None
    for_: HoldField | None = Field(None, alias="for")
    keep_firing_for: HoldField | None = None
    labels: dict[str, str] = {}
    message: str | None = None
    runbook: str | None = None
    min_step: int = Field(0, ge=0)
    axis: Literal["steps", "epochs"] | None = None
    actions: list[Literal["stop"] | CommandActionSpec] = []
    enabled: bool = True
    non_finite: NonFiniteSpec | None = None
    threshold: ThresholdSpec | None = None
    plateau: PlateauSpec | None = None
    rise: RiseSpec | None = None
    pair: PairSpec | None = None
    baseline: BaselineSpec | None = None
    throughput: ThroughputSpec | None = None
    no_data: NoDataSpec | None = None
    stale: StaleSpec | None = None
    growth: GrowthSpec | None = None
    spike: SpikeSpec | None = None
    across_ranks: AcrossRanksSpec | None = None
    across_layers: AcrossLayersSpec | None = None
    pattern: PatternSpec | None = None
    collective_hang: CollectiveHangSpec | None = None
    restarts: RestartsSpec | None = None
    checkpoints: CheckpointsSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_kind(cls, data: Any) -> Any:
        # `non_finite:` with nothing after it reads as null; it still names the kind
        if isinstance(data, dict):
            for kind in CONDITIONS:
                if kind in data and data[kind] in (None, True):
                    data = {**data, kind: {}}
        return data

    @field_validator("message")
    @classmethod
    def _template(cls, text: str | None) -> str | None:
        if text is None:
            return text
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        except ValueError as exc:
            raise ValueError(f"bad message template: {exc}") from None
        unknown = {n.split(".")[0].split("[")[0] for n in names} - MESSAGE_FIELDS
        if unknown or "" in names:
            raise ValueError(
                f"unknown placeholder {{{sorted(unknown or {''})[0]}}} in message; "
                f"known: {', '.join(sorted(MESSAGE_FIELDS))}"
            )
        return text

    @model_validator(mode="after")
    def _one_condition(self) -> RuleSpec:
        found = self._kinds()
        if not self.enabled and not found:  # `- {name: loss_plateau, enabled: false}`
            return self
        if not found and self.switch_only():  # `- {name: val_loss_stagnation, enabled: true}`
            return self
        if len(found) != 1:
            kinds = ", ".join(CONDITIONS)
            detail = "none" if not found else ", ".join(found)
            raise ValueError(f"a rule needs exactly one condition ({kinds}); found {detail}")
        if self.metric is not None and self.tag is not None:
            raise ValueError("give `metric` (canonical names) or `tag` (raw tags), not both")
        if found[0] in TEXT_KINDS and (self.metric is not None or self.tag is not None):
            raise ValueError(f"a {found[0]} reads the run's text logs, not a series: no `metric`")
        if found[0] == "pattern" and self.keep_firing_for and self.keep_firing_for.min_points:
            raise ValueError(
                "a pattern's `keep_firing_for` is a quiet span of steps or time, with no"
                " points in it to count: drop `and N points`"
            )
        if found[0] == "checkpoints" and (self.for_ or self.keep_firing_for):
            raise ValueError(
                "a checkpoints rule fires when the job is overdue and resolves at its next"
                " checkpoint: no `for` or `keep_firing_for`"
            )
        if self.metric is None and self.tag is None and found[0] not in ("no_data", *TEXT_KINDS):
            raise ValueError("a rule needs `metric` (a canonical name or glob) or `tag`")
        return self

    def _kinds(self) -> list[str]:
        return [k for k in CONDITIONS if getattr(self, k) is not None]

    def has_condition(self) -> bool:
        return bool(self._kinds())

    def switch_only(self) -> bool:
        """`{name, enabled: true}` and nothing else: switch on a rule an earlier file
        ships switched off (`enabled: false` with its whole body)."""
        return self.enabled and self.model_fields_set <= {"name", "enabled"}

    def kind(self) -> str:
        return self._kinds()[0]

    def to_rule(self, origin: str = "") -> m.Rule:
        kind = self.kind()
        spec = getattr(self, kind)
        fields = dict(spec)  # field values as validated; model_dump would turn Spans into dicts
        if kind == "spike":
            repeat = fields.pop("repeat")
            fields["repeat_count"] = repeat.count if repeat else None
            fields["repeat_within"] = repeat.within if repeat else None
        if kind == "no_data":
            fields["min_silence"] = fields["min_silence"].amount
            fields["max_silence"] = fields["max_silence"].amount if fields["max_silence"] else None
        if kind == "throughput":
            fields["min_gap"] = fields["min_gap"].amount
        if kind == "collective_hang":
            fields["grace"] = fields["grace"].amount
        if kind == "checkpoints":
            fields["min_late"] = fields["min_late"].amount
        if kind == "restarts" and fields["within"] is not None:
            fields["within"] = fields["within"].amount
        if kind == "across_layers" and fields["resolve_above"] is None:
            fields["resolve_above"] = fields["ratio_below"]
        if kind == "growth" and fields["critical_within"] is not None:
            fields["critical_within"] = fields["critical_within"].amount
        if kind == "pattern":
            level = fields.pop("level")
            fields["levels"] = (
                () if level is None else (level,) if isinstance(level, str) else tuple(level)
            )
            fields["events"] = tuple(fields["events"])
        condition: m.Condition = _DATACLASSES[kind](**fields)
        selects_series = kind not in TEXT_KINDS

        def globs(value: str | list[str] | None) -> tuple[str, ...]:
            return () if value is None else (value,) if isinstance(value, str) else tuple(value)

        return m.Rule(
            name=self.name,
            condition=condition,
            severity=self.severity,
            metrics=globs(self.metric) or (("*",) if self.tag is None and selects_series else ()),
            tags=globs(self.tag),
            family=self.family or self.name,
            for_=self.for_,
            keep_firing_for=self.keep_firing_for,
            labels=tuple(sorted(self.labels.items())),
            message=self.message,
            runbook=self.runbook,
            min_step=self.min_step,
            axis=self.axis,
            actions=tuple(_action(a) for a in self.actions),
            origin=origin,
        )


_DATACLASSES: dict[str, Any] = {
    "non_finite": m.NonFinite,
    "threshold": m.Threshold,
    "plateau": m.Plateau,
    "rise": m.Rise,
    "pair": m.Pair,
    "baseline": m.Baseline,
    "throughput": m.Throughput,
    "no_data": m.NoData,
    "stale": m.Stale,
    "growth": m.Growth,
    "spike": m.Spike,
    "across_ranks": m.AcrossRanks,
    "across_layers": m.AcrossLayers,
    "pattern": m.Pattern,
    "collective_hang": m.CollectiveHang,
    "restarts": m.Restarts,
    "checkpoints": m.Checkpoints,
}


class RuleFileSpec(Strict):
    version: Literal[1] = 1
    aliases: dict[str, list[str]] = {}
    rules: list[RuleSpec] = []
