"""Run rule test cases through the real engine and compare, strictly, with a readable diff.

Strict like promtool: `expect_transitions` is the exact list of transitions
(every one the engine emits must be listed, in order), and each `expect_at`
is the exact set of alerts shown as firing once the step's points are in.
A test that only checked "this fired" would miss the rule that also fires
on the healthy half of the series — the false alarm that makes people mute a
pack. `only:` narrows a case to the rules it is about, explicitly.

The engine is driven as the live daemon drives it: points in step order,
then `tick` at each slot's wall time, so no-data rules fire during a gap
(`_` slots) rather than when data resumes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from trainsentry.alert import Transition
from trainsentry.jobs import member_of
from trainsentry.point import CHECKPOINT_PREFIX, Row
from trainsentry.rules.engine import RUN_WIDE, Engine
from trainsentry.rules.log_rules import LogEngine
from trainsentry.ruletest.spec import Case, ExpectedAlert, ExpectedTransition, TestFile
from trainsentry.sources.textlog import LogDecoder


@dataclass
class CaseResult:
    name: str
    where: str
    failures: list[str] = field(default_factory=list)  # readable diff blocks; empty = passed
    transitions: list[Transition] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _substrings(text: str, wanted: str | list[str] | None) -> bool:
    if wanted is None:
        return True
    return all(w in text for w in ([wanted] if isinstance(wanted, str) else wanted))


def matches_alert(exp: ExpectedAlert, t: Transition) -> bool:
    return (
        exp.rule == t.rule
        and (exp.rank is None or exp.rank == member_of(t.run).rank)
        and (exp.severity is None or exp.severity == t.severity)
        and (exp.metric is None or exp.metric == t.metric)
        and all(t.labels.get(k) == v for k, v in exp.labels.items())
        and _substrings(t.message, exp.message)
    )


def matches_transition(exp: ExpectedTransition, t: Transition) -> bool:
    return (
        exp.step == t.step
        and exp.state == t.state
        and matches_alert(exp, t)
        and _substrings(t.reason or "", exp.reason)
        and (exp.escalated_from is None or exp.escalated_from == t.escalated_from)
    )


def describe(t: Transition) -> str:
    state = "escalated" if t.escalated_from else t.state
    rank = member_of(t.run).rank
    of = f" of rank {rank}" if rank is not None else ""
    return f"step {t.step:>7}  {state:<9} {t.severity:<8} {t.rule}{of} [{t.metric}]  {t.message}"


def describe_expected(exp: ExpectedAlert) -> str:
    head = ""
    if isinstance(exp, ExpectedTransition):
        state = "escalated" if exp.escalated_from else exp.state
        head = f"step {exp.step:>7}  {state:<9} "
    parts = [f"{head}{exp.severity or '*':<8} {exp.rule}"]
    if exp.rank is not None:
        parts.append(f"of rank {exp.rank}")
    if exp.metric:
        parts.append(f"[{exp.metric}]")
    if exp.labels:
        parts.append("labels " + ", ".join(f"{k}={v}" for k, v in exp.labels.items()))
    if exp.message is not None:
        wanted = [exp.message] if isinstance(exp.message, str) else exp.message
        parts.append("message contains " + " and ".join(repr(w) for w in wanted))
    if isinstance(exp, ExpectedTransition) and exp.reason:
        parts.append(f"reason contains {exp.reason!r}")
    return " ".join(parts)


def diff_transitions(
    expected: Sequence[ExpectedTransition], actual: Sequence[Transition]
) -> list[str]:
    """An in-order alignment (longest common subsequence under `matches`) as diff lines."""
    n, m = len(expected), len(actual)
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            if matches_transition(expected[i], actual[j]):
                lcs[i][j] = lcs[i + 1][j + 1] + 1
            else:
                lcs[i][j] = max(lcs[i + 1][j], lcs[i][j + 1])
    lines: list[str] = []
    i = j = 0
    while i < n or j < m:
        if i < n and j < m and matches_transition(expected[i], actual[j]):
            lines.append(f"    {describe(actual[j])}")
            i, j = i + 1, j + 1
        elif i < n and j < m:
            # either side may go; keep the LCS optimal, and on a tie show the earlier step first
            keep_if_dropping_expected, keep_if_dropping_actual = lcs[i + 1][j], lcs[i][j + 1]
            if keep_if_dropping_expected > keep_if_dropping_actual or (
                keep_if_dropping_expected == keep_if_dropping_actual
                and expected[i].step <= actual[j].step
            ):
                lines.append(f"  - {describe_expected(expected[i])}")
                i += 1
            else:
                lines.append(f"  + {describe(actual[j])}")
                j += 1
        elif i < n:
            lines.append(f"  - {describe_expected(expected[i])}")
            i += 1
        else:
            lines.append(f"  + {describe(actual[j])}")
            j += 1
    return lines


def diff_firing(expected: Sequence[ExpectedAlert], actual: Sequence[Transition]) -> list[str]:
    """The firing set at one step: each expectation takes one matching alert, any order."""
    left = list(actual)
    lines: list[str] = []
    missing: list[ExpectedAlert] = []
    for exp in expected:
        hit = next((t for t in left if matches_alert(exp, t)), None)
        if hit is None:
            missing.append(exp)
        else:
            left.remove(hit)
            lines.append(f"    {hit.severity:<8} {hit.rule} [{hit.metric}]  {hit.message}")
    lines += [f"  - {describe_expected(exp)}" for exp in missing]
    lines += [f"  + {t.severity:<8} {t.rule} [{t.metric}]  {t.message}" for t in left]
    return lines


class _Logs:
    """A case's text logs, read as the daemon reads their files: each path one decoder."""

    def __init__(self, case: Case, engine: LogEngine) -> None:
        self.case, self.engine = case, engine
        self.decoders: dict[str, LogDecoder] = {}
        self.k = 0

    def feed_until(self, wall: float, out: list[Transition]) -> None:
        logs = self.case.logs
        while self.k < len(logs) and logs[self.k][1] <= wall:
            at, wall, path, text, run = logs[self.k]
            self.k += 1
            out.extend(self.engine.saw(run, at, wall))
            decoder = self.decoders.setdefault(f"{run}/{path}", LogDecoder())
            data = text.encode() if text.endswith("\n") else (text + "\n").encode()
            events = decoder.feed(data, at_eof=True, file_time=wall).events
            events += decoder.let_go()  # the next step's lines come after a quiet moment
            out.extend(self.engine.feed(replace(e, run=run, path=path) for e in events))


def run_case(case: Case, engine: Engine, log_engine: LogEngine | None = None) -> CaseResult:
    """Feed the case's points to a fresh engine and compare what it says with what was expected."""
    result = CaseResult(case.name, case.where)
    out: list[Transition] = []
    snapshots: list[tuple[int, list[Transition]]] = []
    pending = list(case.expect_at)
    k = 0
    points = case.points
    texts = LogEngine(engine.rules) if log_engine is None else log_engine
    logs = _Logs(case, texts)

    def shown() -> list[Transition]:
        return engine.firing() + texts.firing()

    for step, wall in case.ticks:
        while pending and pending[0].step < step:
            snapshots.append((pending.pop(0).step, shown()))
        while k < len(points) and points[k].wall_time <= wall:
            point = points[k]
            k += 1
            row = Row(point.step, point.wall_time, (point.tag,), (point.value,))
            out.extend(texts.stepped(point.run, (row,)))
            if not point.tag.startswith(CHECKPOINT_PREFIX):  # a save is no logged step
                out.extend(texts.saw(point.run, point.step, point.wall_time))
            life = texts.life(point.run)
            if life is None or not life.ended:  # as the daemon does (runtime/service.py)
                out.extend(engine.feed(point))
        logs.feed_until(wall, out)
        while texts.ended:
            run, life = texts.ended.pop(0)
            out.extend(engine.finish(run, life.reason))
        ticked = engine.tick(wall)
        out.extend(ticked)
        for t in ticked:  # a run that went quiet is stalled, as the daemon tells it
            if t.metric == RUN_WIDE:
                out.extend(texts.stalled(t.run, t.state == "firing"))
        out.extend(texts.tick(wall))  # held collective timeouts (rules/hang.py)
    snapshots += [(at.step, shown()) for at in pending]
    out.extend(texts.tick(math.inf))  # what a replay decides at its end (hang.py)
    if case.finish:
        for run in texts.lives():
            out.extend(texts.finish(run))
        out.extend(engine.finish_all())

    def relevant(t: Transition) -> bool:
        return case.only is None or t.rule in case.only

    result.transitions = [t for t in out if relevant(t)]
    if case.expect_transitions is not None:
        diff = diff_transitions(case.expect_transitions, result.transitions)
        if any(line.startswith(("  -", "  +")) for line in diff):
            head = "transitions (- expected but missing, + happened but not expected):"
            result.failures.append("\n".join([head, *diff]))
    for at, (step, firing) in zip(case.expect_at, snapshots, strict=True):
        diff = diff_firing(at.firing, [t for t in firing if relevant(t)])
        if any(line.startswith(("  -", "  +")) for line in diff):
            lines = diff or ["    (nothing)"]
            result.failures.append(
                "\n".join([f"firing at step {step} (- missing, + extra):", *lines])
            )
    return result


def run_file(test_file: TestFile, select: str | None = None) -> list[CaseResult]:
    """Every case of a file, each on a fresh engine (cases never share state)."""
    return [
        run_case(case, Engine(test_file.rules))
        for case in test_file.cases
        if select is None or select in case.name
    ]
