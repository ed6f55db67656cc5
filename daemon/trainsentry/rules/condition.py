"""The seam between the engine and the condition kinds, and their shared window.

A condition sees one series' points in order and answers each with a verdict
code (QUIET, ACTIVE, CRITICAL, or None for "cannot judge this point": a NaN
fed to a fit, a window not yet full). Verdicts are ints because they are made
for every point and every matching rule; the human-readable evidence is only
built, by `evidence()`, when an alert actually changes state.

A resolve says why (`resolved_reason`): "recovered" only when the series is
back in the band it left, the level it had before the alarm, which the
condition keeps when it goes active. Conditions whose quiet verdict can come
while the series stays away keep a firing alert firing there (HELD: a
baseline, a jump) or say what it settled at ("settled at a new level, ×5.4 the
old (0.1314 → 0.708)": a growth that stopped, a spike that became a level).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from typing import Protocol

from trainsentry.alert import RECOVERED, SETTLED
from trainsentry.rules.model import Span
from trainsentry.rules.packed import Packed
from trainsentry.store.buffers import NO_SHRINK, cut_front


class OtherSeries:
    """The latest value of a series another rule compares against (val vs train).

    Kept as an EWMA per requested span so that a noisy training loss is
    compared by its level, not by whichever batch happened to be last.
    """

    __slots__ = ("before", "ewma", "step", "value")

    def __init__(self, spans: frozenset[int]) -> None:
        self.step = 0
        self.value = math.nan
        self.ewma: dict[int, float] = dict.fromkeys(spans, math.nan)
        self.before = dict(self.ewma)  # the levels before the latest value: what it jumped from

    def push(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            return
        self.step, self.value = step, value
        self.before.update(self.ewma)
        for span, old in self.ewma.items():
            alpha = 2.0 / (span + 1.0)
            self.ewma[span] = value if math.isnan(old) else old + alpha * (value - old)


class RunView(Protocol):
    def other(self, canonical: str) -> OtherSeries | None: ...


class Evaluator(Protocol):
    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None: ...

    def evidence(self) -> str:
        """Why the last verdict was what it was: values, window, fit, projection."""
        ...

    # Optional: `resolved_reason() -> str`, called once the alert's lifecycle ends (it
    # resolved, or its pending streak was cancelled): why, in words, as of the latest
    # point; the level the condition kept from before the alarm is let go. A condition
    # without it resolves "recovered" (`reason_of`).


def reason_of(condition: object) -> str:
    """The reason of a resolve of `condition`'s alert (its episode ends with it)."""
    said = getattr(condition, "resolved_reason", None)
    return str(said()) if said is not None else RECOVERED


def settled(value: float, old: float) -> str:
    """The reason of a resolve whose series did not come back to the level it left."""
    moved = f"{fmt(old)} → {fmt(value)}"
    if old > 0 and value > 0:
        return f"{SETTLED}, ×{value / old:.3g} the old ({moved})"
    return f"{SETTLED} ({moved})"


class SpanWindow(Packed):
    """The points within a span of the newest one, with running sum and sum of squares.

    Two arrays of doubles (positions, values) read from `head` on, not a deque
    of tuples: 16 bytes a point instead of about 100. A loss logged every step
    fills a "2000 steps" plateau's two windows with 4,000 points a run; as
    tuples that was 0.4 MB a run, most of a fleet's memory once windows are
    full (the 10-minute soak never got there). The dead prefix is cut off 15
    at a time, so the buffers settle at their largest size (buffers.py).
    Sums are rebuilt once per window length of evictions, which keeps float
    drift bounded at amortised O(1) per point.
    """

    __slots__ = (
        "_evicted",
        "first_position",
        "head",
        "positions",
        "span",
        "sum",
        "sumsq",
        "values",
    )

    def __init__(self, span: Span) -> None:
        self.span = span
        self.positions = array("d")  # on the span's axis
        self.values = array("d")
        self.head = 0  # the window is [head:] of both
        self.sum = 0.0
        self.sumsq = 0.0
        self._evicted = 0
        self.first_position: float | None = None  # of the first point ever pushed

    def __len__(self) -> int:
        return len(self.values) - self.head

    @property
    def items(self) -> list[tuple[float, float]]:
        """The window's (position, value) points, oldest first."""
        h = self.head
        return list(zip(self.positions[h:], self.values[h:], strict=True))

    def position(self, step: int, wall_time: float, index: int) -> float:
        return axis(self.span, step, wall_time, index)

    def push(self, position: float, value: float) -> None:
        """Add a point; the oldest leave as the span says.

        Nothing falls out of most pushes into a span of steps or seconds (the
        window is cut by position): that is told by one comparison.
        """
        if self.first_position is None:
            self.first_position = position
        positions, values = self.positions, self.values
        positions.append(position)
        values.append(value)
        self.sum += value
        self.sumsq += value * value
        span, h = self.span, self.head
        size = len(values)
        if span.unit == "points":
            cut = h + max(0, math.ceil(size - h - span.amount))
        else:
            limit = position - span.amount
            cut = h
            while cut < size and positions[cut] <= limit:  # the front, as it came
                cut += 1
        if cut == h:
            return
        for k in range(h, cut):
            old = values[k]
            self.sum -= old
            self.sumsq -= old * old
        self.head = cut
        self._evicted += cut - h
        if self._evicted > size - cut + 16:
            self._evicted = 0
            self.sum = math.fsum(values[cut:])
            self.sumsq = math.fsum(v * v for v in values[cut:])
        if cut >= NO_SHRINK:
            cut_front((positions, values), cut)
            self.head = 0

    def covered(self, position: float) -> bool:
        """True once the history seen reaches back a whole span."""
        if self.span.unit == "points":
            return len(self) >= self.span.amount
        return (
            self.first_position is not None and position - self.first_position >= self.span.amount
        )

    def mean(self) -> float:
        n = len(self)
        return self.sum / n if n else math.nan

    def std(self) -> float:
        n = len(self)
        if n < 2:
            return 0.0
        mean = self.sum / n
        return math.sqrt(max(self.sumsq / n - mean * mean, 0.0))


def axis(span: Span, step: int, wall_time: float, index: int) -> float:
    """Where a point sits on a span's axis: its step, its wall time, or its index."""
    unit = span.unit
    return float(step) if unit == "steps" else wall_time if unit == "seconds" else float(index)


def median(values: Iterable[float]) -> float:
    return middle(sorted(values))


def middle(ordered: list[float]) -> float:
    """The median of values already in order."""
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def fmt(value: float) -> str:
    """Numbers in messages: 4 significant digits, readable at any magnitude."""
    return f"{value:.4g}" if math.isfinite(value) else str(value)
