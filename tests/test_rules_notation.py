"""A compact series notation for rule tests, promtool-style, on an explicit step axis.

`values("0 1 2 nan _ 5")` is six slots: numbers, `nan`/`inf`/`-inf`, and `_`
for "nothing logged at this step". `a+bxn` expands to n+1 values a, a+b, ...
(promtool's notation), `a-bxn` counts down, `axn` repeats a n+1 times and
`a*rxn` is geometric (a, a·r, a·r², ...) — the shape of a diverging gradient
norm. The other rule test modules import these helpers.
"""

from __future__ import annotations

import math
import re
import textwrap

from trainsentry.point import Point
from trainsentry.rules.engine import Engine
from trainsentry.rules.lifecycle import Transition
from trainsentry.rules.loader import parse_text
from trainsentry.rules.model import RuleSet

WALL0 = 1_700_000_000.0
_TERM = re.compile(
    r"^(?P<a>[-+]?[\d.e]+|nan|inf|-inf|_)(?:(?P<op>[-+*])(?P<b>[\d.e]+))?x(?P<n>\d+)$"
)


def values(spec: str) -> list[float | None]:
    out: list[float | None] = []
    for token in spec.split():
        match = _TERM.match(token)
        if match is None:
            out.append(None if token == "_" else float(token))
            continue
        a, op, b, n = match["a"], match["op"], match["b"], int(match["n"])
        if a == "_":
            out.extend([None] * n)
            continue
        start = float(a)
        step = float(b) if b else 0.0
        for i in range(n + 1):
            if op == "*":
                out.append(start * step**i)
            else:
                out.append(start + (step if op != "-" else -step) * i)
    return out


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
    out = []
    for i, value in enumerate(values(spec)):
        step = start + i * every
        if value is not None:
            out.append(Point(run, tag, step, WALL0 + step * seconds_per_step, value))
    return out


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


def test_numbers_nan_and_gaps_are_read_in_order() -> None:
    got = values("0 1.5 nan _ -inf 5")
    assert got[:2] == [0.0, 1.5] and math.isnan(got[2] or 0.0)
    assert got[3] is None and got[4] == -math.inf and got[5] == 5.0


def test_promtool_expansions_give_n_plus_one_values() -> None:
    assert values("1+1x3") == [1.0, 2.0, 3.0, 4.0]
    assert values("10-2x2") == [10.0, 8.0, 6.0]
    assert values("7x2") == [7.0, 7.0, 7.0]
    assert values("1*2x3") == [1.0, 2.0, 4.0, 8.0]
    assert values("_x2 1") == [None, None, 1.0]


def test_points_skip_gaps_but_keep_the_step_axis() -> None:
    got = points("1 _ 3", every=10, start=100)
    assert [(p.step, p.value) for p in got] == [(100, 1.0), (120, 3.0)]
    assert got[1].wall_time - got[0].wall_time == 20.0
