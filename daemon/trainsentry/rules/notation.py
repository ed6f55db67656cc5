"""A compact series notation for rule tests, promtool-style, on an explicit step axis.

A rule is only trusted once someone has watched it fire on a made-up series
and stay quiet on a nearly-identical one; writing such series point by point
is tedious enough that nobody does it. So a series is one line of tokens:

- `2.5`, `-1e-3`, `nan`, `inf`, `-inf`: one value in the next slot;
- `_`: no point logged in that slot (the step axis still advances);
- `a+bxn` / `a-bxn`: n+1 values a, a±b, ..., a±n·b (promtool's notation —
  the off-by-one trap: `1+1x3` is 1 2 3 4);
- `axn`: a, repeated n+1 times; `_xn`: n empty slots (not n+1: gaps are counted);
- `a*rxn`: geometric, a, a·r, ..., a·rⁿ (n+1 values): a diverging gradient norm;
- `(a b c)xn`: the group repeated n+1 times, like `axn`: noise with a known spread;
- `STEP:TERM`: put TERM at step STEP (`400:nan`, `1000:1*1.2x30`); later slots
  continue from there.

Slots are `interval` steps apart from `start`. Errors carry the offset of the
bad token, so a test file can point at file:line:col of the token itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan"
_UNSIGNED = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_TOKEN = re.compile(
    rf"^(?:(?P<at>\d+):)?(?P<a>{_NUM}|_)(?:(?P<op>[-+*])(?P<b>{_UNSIGNED}))?(?:x(?P<n>\d+))?$",
    re.IGNORECASE,
)
MAX_SLOTS = 10_000_000  # a typo such as `1x1000000000` must not eat the machine

SYNTAX_HELP = (
    "expected a number, nan, inf, `_`, `a+bxn`, `a-bxn`, `axn`, `a*rxn`, "
    "or `STEP:` before any of them"
)


class NotationError(ValueError):
    """A bad token; `offset` is where it starts in the series text."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Slot:
    """One position on the step axis; `value` None means nothing was logged there."""

    step: int
    value: float | None


_REPEAT = re.compile(r"x(\d+)(?=\s|$)")


def _tokens(spec: str, base: int = 0) -> list[tuple[int, str]]:
    """Tokens with their offsets; a repeated group `(...)xn` (nestable) is expanded in place."""
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(spec):
        if spec[i].isspace():
            i += 1
            continue
        if spec[i] != "(":
            j = i
            while j < len(spec) and not spec[j].isspace():
                j += 1
            out.append((base + i, spec[i:j]))
            i = j
            continue
        depth, j = 0, i
        while j < len(spec):
            depth += {"(": 1, ")": -1}.get(spec[j], 0)
            if depth == 0:
                break
            j += 1
        repeat = _REPEAT.match(spec, j + 1) if j < len(spec) else None
        if repeat is None:
            raise NotationError("a group needs a closing `)` and a count: `(1 2)x4`", base + i)
        inner = _tokens(spec[i + 1 : j], base + i + 1)
        for off, tok in inner:
            if ":" in tok:
                raise NotationError(f"`{tok}`: no `STEP:` inside a repeated group", off)
        copies = int(repeat[1]) + 1
        if len(inner) * copies > MAX_SLOTS:
            raise NotationError(f"the group makes more than {MAX_SLOTS} slots", base + i)
        out.extend(inner * copies)
        i = repeat.end()
    return out


def slots(spec: str, *, start: int = 0, interval: int = 1) -> list[Slot]:
    """Every slot of `spec`, gaps included, with the step it sits at."""
    if interval < 1:
        raise NotationError(f"the interval must be at least 1 step, got {interval}")
    out: list[Slot] = []
    step = start
    for offset, token in _tokens(spec):
        match = _TOKEN.match(token)
        if match is None:
            raise NotationError(f"cannot read `{token}`: {SYNTAX_HELP}", offset)
        if match["at"] is not None:
            step = int(match["at"])
        a, op, b, n = match["a"], match["op"], match["b"], match["n"]
        if n is None and op is not None:
            raise NotationError(f"`{token}` needs a count: `{token}x10` is 11 values", offset)
        count = int(n) if n is not None else 0
        if len(out) + count > MAX_SLOTS:
            raise NotationError(f"`{token}` makes more than {MAX_SLOTS} slots", offset)
        if a == "_":
            if op is not None:
                raise NotationError(f"`{token}`: a gap `_` takes no `+`, `-` or `*`", offset)
            for _ in range(max(count, 1)):  # `_x3` is three gaps: n, not n+1
                out.append(Slot(step, None))
                step += interval
            continue
        first = float(a)
        delta = float(b) if b is not None else 0.0
        for i in range(count + 1):
            if op == "*":
                value = first * delta**i
            elif op == "-":
                value = first - delta * i
            else:
                value = first + delta * i
            out.append(Slot(step, value))
            step += interval
    return out


def values(spec: str) -> list[float | None]:
    """The values of `spec` slot by slot (None for `_`): what most assertions compare."""
    return [s.value for s in slots(spec)]


def samples(spec: str, *, start: int = 0, interval: int = 1) -> list[tuple[int, float]]:
    """(step, value) for every slot that holds a value: the points a writer would log."""
    return [
        (s.step, s.value)
        for s in slots(spec, start=start, interval=interval)
        if s.value is not None
    ]
