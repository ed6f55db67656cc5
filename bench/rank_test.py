"""When a fault's trace in the logged loss could first be told from the run's noise.

The detection bench times a page from the first logged point after the fault's
onset. Some faults do not show there: 10 % of labels randomised moves a
single 8-sample batch's loss inside its old range for several logged points. To
tell those apart from a late rule, the bench asks an oracle that knows the onset
(which no monitor does): an exact one-sided Mann-Whitney test of the points
since onset against the points just before it. Until it says p < `VISIBLE_P`,
nothing that reads the loss can tell a shift from noise at that error rate, so
a page cannot be owed yet. The oracle tests once at each length; a monitor
tests at every point without knowing the onset, so it needs more evidence, not
less: the oracle is a bound, not a target to tune to.

Exact rather than the normal approximation, because the counts that matter are
small (3 points against 20) where the approximation is off by a factor; no
scipy dependency for one distribution.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

# The oracle's error rate: one healthy run in a hundred would "show" a fault at
# any one length. A monitor that tests every point needs far stricter evidence.
VISIBLE_P = 0.01
# Past this many points since onset the oracle stops asking: a fault that has
# not shown by then is reported as not shown.
MAX_POINTS = 200


def _u_rows(below: int) -> Iterator[list[float]]:
    """For 1, 2, ... points after: the distribution of U (the number of (after,
    before) pairs where the first is larger) among `below` points before, when all
    orderings are equally likely; index = U. Built a row of `after` at a time:
    the largest value is an after point (it beats every before point) with
    probability a/(a+b), else a before point."""
    prev = [[1.0] for _ in range(below + 1)]  # after = 0: U is 0 whatever b is
    after = 0
    while True:
        after += 1
        row = [[1.0]]  # below = 0: U is 0
        for b in range(1, below + 1):
            top, rest = after / (after + b), b / (after + b)
            dist = [0.0] * (after * b + 1)
            for u, p in enumerate(prev[b]):
                dist[u + b] += top * p
            for u, p in enumerate(row[b - 1]):
                dist[u] += rest * p
            row.append(dist)
        prev = row
        yield row[below]


def _wins(a: float, before: list[float]) -> float:
    """The points before that `a` is higher than; ties count half, a non-finite point
    after counts as higher than every point before."""
    if not math.isfinite(a):
        return float(len(before))
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for b in before)


def _u(after: list[float], before: list[float]) -> float:
    """Pairs where the point after is higher (U)."""
    return sum(_wins(a, before) for a in after)


def p_above(after: list[float], before: list[float]) -> float:
    """One-sided exact p that `after` lies no higher than `before`."""
    if not after or not before:
        return 1.0
    rows = _u_rows(len(before))
    for _ in range(len(after) - 1):
        next(rows)
    return _tail(next(rows), _u(after, before))


def _tail(dist: list[float], u: float) -> float:
    return min(1.0, sum(dist[math.ceil(u - 1e-9) :]))


def first_visible(after: list[float], before: list[float]) -> int | None:
    """The number of points since onset at which the oracle first tells the run's
    points apart from `before` (p < VISIBLE_P); None if it never does."""
    if not before:
        return None
    rows = _u_rows(len(before))
    u = 0.0
    for n, a in enumerate(after[:MAX_POINTS], 1):
        u += _wins(a, before)  # U of the first n points, one point's pairs added a step
        if _tail(next(rows), u) < VISIBLE_P:
            return n
    return None
