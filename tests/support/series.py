"""Series written in the rule-test notation, turned into points, and rules run over them.

The rule tests of several rooms (rules, runtime) build their inputs the same
way `trainsentry test` does, so a case reads like a rule-test file: a series
in the notation, a rule's YAML, the transitions as (state, severity, step).
Wall time follows the step from the rule tests' own WALL0.
"""

from __future__ import annotations

import textwrap

from trainsentry.alert import Transition
from trainsentry.point import Point
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import parse_text
from trainsentry.rules.model import RuleSet
from trainsentry.rules.notation import samples
from trainsentry.ruletest.spec import WALL0

__all__ = ["WALL0", "evaluate", "merge", "points", "ruleset", "timeline"]


def points(
    spec: str,
    tag: str = "loss",
    run: str = "r",
    *,
    start: int = 0,
    every: int = 1,
    seconds_per_step: float = 1.0,
) -> list[Point]:
    """Points at steps start, start+every, ...; wall time follows the step."""
    return [
        Point(run, tag, step, WALL0 + step * seconds_per_step, value)
        for step, value in samples(spec, start=start, interval=every)
    ]


def merge(*series: list[Point]) -> list[Point]:
    """Interleave series by step, as one writer logging several tags per step would."""
    return sorted((p for s in series for p in s), key=lambda p: (p.step, p.wall_time))


def ruleset(rules_yaml: str, aliases_yaml: str = "") -> RuleSet:
    """Rules from the YAML of a `rules:` list (and optional `aliases:` mapping)."""
    text = "rules:\n" + textwrap.indent(textwrap.dedent(rules_yaml).strip("\n"), "  ") + "\n"
    if aliases_yaml:
        text += "aliases:\n" + textwrap.indent(textwrap.dedent(aliases_yaml).strip("\n"), "  ")
    parsed = parse_text(text, "test.yaml")
    return RuleSet(tuple(parsed.rules), tuple((k, tuple(v)) for k, v in parsed.aliases.items()))


def evaluate(rules: RuleSet | str, *series: list[Point], finish: bool = False) -> list[Transition]:
    engine = Engine(rules if isinstance(rules, RuleSet) else ruleset(rules))
    out = engine.feed_all(merge(*series))
    if finish:
        out.extend(engine.finish_all())
    return out


def timeline(transitions: list[Transition]) -> list[tuple[str, str, int]]:
    """(state, severity, step) per transition: what most assertions compare."""
    return [(t.state, t.severity, t.step) for t in transitions]
