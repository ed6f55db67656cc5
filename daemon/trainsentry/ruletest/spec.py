"""A rule test file, read with the rule loader's marks so every error says file:line:col.

A test that cannot be read must fail as loudly as a rule that cannot: an
expectation naming a misspelt rule would otherwise pass forever by expecting
nothing of a rule that does not exist. So rule names in expectations are
checked against the loaded rules, series notation errors point at the bad
token inside the string, and unknown keys get "did you mean".
"""

from __future__ import annotations

import bisect
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from trainsentry.jobs import ranked_run
from trainsentry.point import Point
from trainsentry.rules.loader import DEFAULT_PACK, RuleFileError, load_rules
from trainsentry.rules.marked_yaml import MarkedDocument, YamlPath, read_mapping, report
from trainsentry.rules.model import RuleSet
from trainsentry.rules.notation import NotationError, slots
from trainsentry.rules.schema import Strict

WALL0 = 1_700_000_000.0  # wall time of step 0: 2023-11-14, any fixed instant would do
Substrings = str | list[str]


class SeriesSpec(Strict):
    values: str
    start: int | None = None
    interval: int | None = Field(None, ge=1)


class LogSpec(Strict):
    """Text a job wrote at a step: read as its log file would be (sources/textlog.py); with
    `rank`, the log of that rank of the case's job; with `attempt`, of that attempt."""

    step: int
    text: str
    path: str = "stdout.log"
    rank: int | None = Field(None, ge=0)
    attempt: int | None = Field(None, ge=0)


class AttemptSpec(Strict):
    """One attempt of the case's job (torchrun's `attempt_<N>/`): from step `start`, `after`
    seconds after the attempt before it logged its last point."""

    start: int = Field(0, ge=0)
    after: float = Field(10.0, ge=0)
    series: dict[str, str | SeriesSpec] = Field(default_factory=dict)


class ExpectedAlert(Strict):
    """What an expected alert must match; keys left out match anything."""

    rule: str
    severity: Literal["warning", "critical"] | None = None
    metric: str | None = None  # the raw tag
    rank: int | None = None  # the rank of the case's job whose alert it is
    labels: dict[str, str] = Field(default_factory=dict)  # a subset of the alert's labels
    message: Substrings | None = None  # substring(s) of the message


class ExpectedTransition(ExpectedAlert):
    step: int
    state: Literal["firing", "resolved"] = "firing"
    reason: str | None = None  # substring of a resolve's reason ("recovered", "data stopped")
    escalated_from: Literal["warning"] | None = None


class ExpectAtSpec(Strict):
    step: int
    firing: list[ExpectedAlert] = Field(default_factory=list)


class CaseSpec(Strict):
    name: str
    run: str = "test/run"
    start: int = Field(0, ge=0)
    interval: int = Field(1, ge=1)
    seconds_per_step: float | str = 1.0  # or a pace series on the case's slots
    series: dict[str, str | SeriesSpec] = Field(default_factory=dict)
    # a job of this many ranks (`<run>/rank<R>`, jobs/identity.py), each logging `series`
    # but where `rank_series` gives a rank series of its own
    ranks: int | None = Field(None, ge=2, le=64)
    rank_series: dict[int, dict[str, str | SeriesSpec]] = Field(default_factory=dict)
    # series of the case's run itself beside its ranks: the job's own logs (its checkpoints
    # on the run above its ranks, as HF's output_dir holds them above its runs/)
    job_series: dict[str, str | SeriesSpec] = Field(default_factory=dict)
    # the case's job restarted: each attempt a run of its own, `<run>_testagnt/attempt_<N>/0`
    attempts: list[AttemptSpec] = Field(default_factory=list, max_length=64)
    # the attempts written into the case's run itself, one after another (a Slurm job
    # requeued into the same slurm-<id>.out and metrics file), not torchrun's attempt_<N>/
    attempts_in_one_run: bool = False
    logs: list[LogSpec] = Field(default_factory=list)
    only: list[str] | None = None
    finish: bool = False
    expect_transitions: list[ExpectedTransition] | None = None
    expect_at: list[ExpectAtSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _expects_something(self) -> CaseSpec:
        if self.expect_transitions is None and not self.expect_at:
            raise ValueError("a test needs `expect_transitions` (use [] for none) or `expect_at`")
        if not self.series and not self.logs and not self.attempts and not self.job_series:
            raise ValueError("a test needs `series`, `attempts` or `logs`")
        if self.job_series and self.ranks is None:
            raise ValueError("`job_series` are the run above the case's `ranks`: give `ranks`")
        if self.attempts and (self.series or self.ranks or self.expect_at):
            raise ValueError("`attempts` give the series, on no ranks and no `expect_at`")
        if self.attempts_in_one_run and not self.attempts:
            raise ValueError("`attempts_in_one_run` goes with `attempts`")
        if any(log.attempt is not None and log.attempt >= len(self.attempts) for log in self.logs):
            raise ValueError(f"a log's attempt is one of the {len(self.attempts)} `attempts`")
        ranks = self.ranks or 0
        if any(r >= ranks for r in self.rank_series) or any(
            log.rank is not None and log.rank >= ranks for log in self.logs
        ):
            raise ValueError(f"a rank is one of the `ranks: {self.ranks}` of the case's job")
        return self


class TestFileSpec(Strict):
    rule_files: list[str] = Field(min_length=1)
    tests: list[CaseSpec] = Field(min_length=1)


@dataclass(frozen=True)
class Case:
    """One test case, ready to run: its points in feed order and its expectations."""

    name: str
    where: str  # "file:line" of the case, for reports
    run: str
    points: list[Point]
    ticks: list[tuple[int, float]]  # (step, wall) of every slot, gaps included: the live clock
    only: frozenset[str] | None
    finish: bool
    expect_transitions: list[ExpectedTransition] | None
    expect_at: list[ExpectAtSpec]
    # (step, wall, path, text, run): what the job's text logs say at a step, in step order
    logs: list[tuple[int, float, str, str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class TestFile:
    path: str
    rules: RuleSet
    cases: list[Case]


class TestFileError(Exception):
    """Every problem found in a test file, each "file:line:col: message"."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def _token_mark(mark: yaml.Mark, spec: str, offset: int) -> yaml.Mark:
    """Move `mark` onto the token at `offset` when the scalar sits on one line as written."""
    buffer, pointer = mark.buffer, mark.pointer
    if buffer is None:
        return mark
    opened = 1 if buffer[pointer : pointer + 1] in ("'", '"') else 0
    begin = pointer + opened
    if buffer[begin : begin + offset] != spec[:offset]:
        return mark
    return yaml.Mark(
        mark.name,
        mark.index + opened + offset,
        mark.line,
        mark.column + opened + offset,
        buffer,
        pointer + opened + offset,
    )


@dataclass(frozen=True)
class Clock:
    """Wall time of a step, from a pace (seconds per step) that may change along the run.

    A constant pace is the common case; a pace series (`"0.5x99 3.5x50"`) is how
    a test slows a run down or makes it hang for the throughput and stall rules.
    Slot k's pace holds from its step up to the next slot's.
    """

    steps: list[int]
    paces: list[float]
    offsets: list[float]  # wall time (from WALL0) at each slot's step

    @classmethod
    def build(cls, start: int, paces: list[tuple[int, float]]) -> Clock:
        steps, rates, offsets = [start], [paces[0][1]], [0.0]
        for step, pace in paces:
            if step <= steps[-1]:
                rates[-1] = pace
                continue
            offsets.append(offsets[-1] + (step - steps[-1]) * rates[-1])
            steps.append(step)
            rates.append(pace)
        return cls(steps, rates, offsets)

    def wall(self, step: int) -> float:
        k = max(0, bisect.bisect_right(self.steps, step) - 1)
        return WALL0 + self.offsets[k] + (step - self.steps[k]) * self.paces[k]


def _clock(spec: CaseSpec, doc: MarkedDocument, where: YamlPath) -> Clock | None:
    pace = spec.seconds_per_step
    if isinstance(pace, float | int):
        if pace <= 0:
            doc.error(doc.values.get(where), f"seconds_per_step must be positive, got {pace}")
            return None
        return Clock([spec.start], [float(pace)], [0.0])
    mark = doc.values.get(where)
    try:
        got = slots(pace, start=spec.start, interval=spec.interval)
    except NotationError as exc:
        doc.error(_token_mark(mark, pace, exc.offset) if mark else None, str(exc))
        return None
    paces = [(s.step, s.value) for s in got if s.value is not None]
    if not paces or any(not (v > 0 and math.isfinite(v)) for _, v in paces):
        doc.error(mark, "seconds_per_step: every pace must be a positive number of seconds")
        return None
    return Clock.build(spec.start, paces)


def _case(spec: CaseSpec, i: int, doc: MarkedDocument, rules: RuleSet) -> Case | None:
    before = len(doc.errors)
    names = [r.name for r in rules.rules]

    def check_rule(name: str, where: YamlPath) -> None:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"did you mean `{close[0]}`?" if close else "it is in none of the rule files"
            doc.error(doc.values.get(where), f"unknown rule `{name}`; {hint}")

    base: YamlPath = ("tests", i)
    for k, name in enumerate(spec.only or ()):
        check_rule(name, (*base, "only", k))
    for k, exp in enumerate(spec.expect_transitions or ()):
        check_rule(exp.rule, (*base, "expect_transitions", k, "rule"))
    for k, at in enumerate(spec.expect_at):
        for j, alert in enumerate(at.firing):
            check_rule(alert.rule, (*base, "expect_at", k, "firing", j, "rule"))

    clock = _clock(spec, doc, (*base, "seconds_per_step"))
    if clock is None:
        return None
    if spec.attempts:
        return _attempts_case(spec, i, doc, clock, base)
    points: list[tuple[int, int, int, Point]] = []
    ticks: set[int] = set()
    for rank, run, tag, series, where in _series_of(spec, base):
        order = list(spec.series).index(tag) if tag in spec.series else len(spec.series)
        if isinstance(series, SeriesSpec):
            text, where = series.values, (*where, "values")
            start = series.start if series.start is not None else spec.start
            interval = series.interval or spec.interval
        else:
            text, start, interval = series, spec.start, spec.interval
        try:
            got = slots(text, start=start, interval=interval)
        except NotationError as exc:
            mark = doc.values.get(where)
            doc.error(_token_mark(mark, text, exc.offset) if mark else None, str(exc))
            continue
        for slot in got:
            ticks.add(slot.step)
            if slot.value is not None:
                point = Point(run, tag, slot.step, clock.wall(slot.step), slot.value)
                points.append((slot.step, rank, order, point))
    logs = sorted(
        (
            (log.step, clock.wall(log.step), log.path, log.text, _run_of(spec.run, log.rank))
            for log in spec.logs
        ),
        key=lambda x: x[0],
    )
    ticks.update(step for step, *_ in logs)
    if len(doc.errors) > before:
        return None
    # by step; within a step rank by rank, each in the file's series order
    points.sort(key=lambda p: (p[0], p[1], p[2]))
    ordered = [p for *_, p in points]
    return _built(spec, doc, base, ordered, [(s, clock.wall(s)) for s in sorted(ticks)], logs)


def _run_of(run: str, rank: int | None) -> str:
    return run if rank is None else ranked_run(run, rank)


ATTEMPT_AGENT = "testagnt"  # as torchrun's agent names its log directory (jobs/identity.py)


def attempt_run(run: str, attempt: int) -> str:
    return f"{run}_{ATTEMPT_AGENT}/attempt_{attempt}/0"


def _attempts_case(
    spec: CaseSpec, i: int, doc: MarkedDocument, clock: Clock, base: YamlPath
) -> Case | None:
    """A case of `attempts`: each attempt's steps on its own clock, later than the one
    before's, so the feed (in wall order) goes back in steps at each restart."""
    pace = clock.paces[0]
    before = len(doc.errors)
    feed: list[tuple[float, int, Point]] = []
    ticks: list[tuple[int, float]] = []
    starts: list[tuple[str, float, int]] = []  # per attempt: its run, its wall at `start`
    end = WALL0 - pace
    for n, attempt in enumerate(spec.attempts):
        run = spec.run if spec.attempts_in_one_run else attempt_run(spec.run, n)
        begin = end + attempt.after + pace
        starts.append((run, begin, attempt.start))
        last = begin
        for order, (tag, series) in enumerate(attempt.series.items()):
            where: YamlPath = (*base, "attempts", n, "series", tag)
            text = series.values if isinstance(series, SeriesSpec) else series
            try:
                got = slots(text, start=attempt.start, interval=spec.interval)
            except NotationError as exc:
                mark = doc.values.get(where)
                doc.error(_token_mark(mark, text, exc.offset) if mark else None, str(exc))
                continue
            for slot in got:
                wall = begin + (slot.step - attempt.start) * pace
                last = max(last, wall)
                ticks.append((slot.step, wall))
                if slot.value is not None:
                    feed.append((wall, order, Point(run, tag, slot.step, wall, slot.value)))
        end = last
    logs = []
    for log in spec.logs:
        n = log.attempt or 0
        run, begin, start = starts[n] if n < len(starts) else (spec.run, WALL0, 0)
        logs.append((log.step, begin + (log.step - start) * pace, log.path, log.text, run))
    if len(doc.errors) > before:
        return None
    feed.sort(key=lambda x: (x[0], x[1]))
    ordered = sorted(set(ticks), key=lambda t: (t[1], t[0]))
    logs.sort(key=lambda x: (x[1], x[0]))
    return _built(spec, doc, base, [p for *_, p in feed], ordered, logs)


def _built(
    spec: CaseSpec,
    doc: MarkedDocument,
    base: YamlPath,
    points: list[Point],
    ticks: list[tuple[int, float]],
    logs: list[tuple[int, float, str, str, str]],
) -> Case:
    """The case, its points and ticks in feed order."""
    mark = doc.values.get(base)
    return Case(
        name=spec.name,
        where=f"{doc.name}:{mark.line + 1}" if mark else doc.name,
        run=spec.run,
        points=points,
        ticks=ticks,
        only=frozenset(spec.only) if spec.only is not None else None,
        finish=spec.finish,
        expect_transitions=spec.expect_transitions,
        expect_at=sorted(spec.expect_at, key=lambda a: a.step),
        logs=logs,
    )


def _series_of(
    spec: CaseSpec, base: YamlPath
) -> list[tuple[int, str, str, str | SeriesSpec, YamlPath]]:
    """(rank, run, tag, series, where) of every series a case's run or job logs; the job's
    own series (`job_series`) before its ranks' at a step, as rank -1."""
    if spec.ranks is None:
        return [(0, spec.run, t, s, (*base, "series", t)) for t, s in spec.series.items()]
    out: list[tuple[int, str, str, str | SeriesSpec, YamlPath]] = [
        (-1, spec.run, t, s, (*base, "job_series", t)) for t, s in spec.job_series.items()
    ]
    for rank in range(spec.ranks):
        own = spec.rank_series.get(rank, {})
        for tag, series in {**spec.series, **own}.items():
            where = (*base, "rank_series", rank, tag) if tag in own else (*base, "series", tag)
            out.append((rank, ranked_run(spec.run, rank), tag, series, where))
    return out


def _rules(spec: TestFileSpec, path: Path, doc: MarkedDocument) -> RuleSet | None:
    paths: list[str] = []
    before = len(doc.errors)
    for k, name in enumerate(spec.rule_files):
        target = name if name == DEFAULT_PACK else str(path.parent / name)
        if target != DEFAULT_PACK and not Path(target).exists():
            doc.error(doc.values.get(("rule_files", k)), f"no such rule file: {target}")
        paths.append(target)
    if len(doc.errors) > before:
        return None
    try:
        return load_rules(paths)
    except RuleFileError as exc:
        mark = doc.values.get(("rule_files",))
        doc.error(
            mark, f"the rule files have {len(exc.errors)} error(s):\n" + "\n".join(exc.errors)
        )
        return None


def load_test_file(path: str | Path) -> TestFile:
    """Parse and check a test file; raises TestFileError with all its errors."""
    path = Path(path)
    doc = MarkedDocument(str(path))
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TestFileError([f"{path}:1:1: cannot read: {exc}"]) from None
    expected = "a mapping with `rule_files:` and `tests:`"
    data = read_mapping(text, doc, "rule test file", expected)
    if not data:
        if data is not None:  # an empty file
            doc.error(None, f"expected {expected}")
        raise TestFileError(doc.rendered())
    spec: TestFileSpec | None
    try:
        spec = TestFileSpec.model_validate(data)
        valid = list(enumerate(spec.tests))
    except ValidationError as exc:
        report(exc, doc, TestFileSpec)
        spec, valid = _valid_parts(data)
    if spec is None:
        raise TestFileError(doc.rendered())
    rules = _rules(spec, path, doc)
    if rules is None:
        raise TestFileError(doc.rendered())
    cases = [_case(case, i, doc, rules) for i, case in valid]
    if doc.errors:
        raise TestFileError(doc.rendered())
    return TestFile(str(path), rules, [c for c in cases if c is not None])


def _valid_parts(data: dict[str, Any]) -> tuple[TestFileSpec | None, list[tuple[int, CaseSpec]]]:
    """The rule files and the cases that validate on their own, by their index.

    A typo in one case must not hide the bad tokens and unknown rule names of
    the others (or of itself, once fixed): every error is reported at once.
    """
    raw = data.get("tests")
    valid: list[tuple[int, CaseSpec]] = []
    for i, case in enumerate(raw if isinstance(raw, list) else ()):
        try:
            valid.append((i, CaseSpec.model_validate(case)))
            continue
        except ValidationError as exc:  # reported already, at its own lines
            unknown = {e["loc"][0] for e in exc.errors() if e["type"] == "extra_forbidden"}
        if not unknown or not isinstance(case, dict):
            continue
        try:  # a misspelt key aside, the rest of the case may have more to say
            valid.append(
                (i, CaseSpec.model_validate({k: v for k, v in case.items() if k not in unknown}))
            )
        except ValidationError:
            continue
    if not valid:
        return None, []
    try:
        spec = TestFileSpec.model_validate(
            {"rule_files": data.get("rule_files"), "tests": [valid[0][1]]}
        )
    except ValidationError:
        return None, []
    return spec, valid
