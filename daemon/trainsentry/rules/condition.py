"""The seam between the engine and the condition kinds, and their shared window.

A condition sees one series' points in order and answers each with a verdict
code (QUIET, ACTIVE, CRITICAL, or None for "cannot judge this point": a NaN
fed to a fit, a window not yet full). Verdicts are ints because they are made
for every point and every matching rule; the human-readable evidence is only
built, by `evidence()`, when an alert actually changes state.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from trainsentry.rules.model import Span
from trainsentry.rules.packed import Packed


class OtherSeries:
    """The latest value of a series another rule compares against (val vs train).

    Kept as an EWMA per requested span so that a noisy training loss is
    compared by its level, not by whichever batch happened to be last.
    """

    __slots__ = ("ewma", "step", "value")

    def __init__(self, spans: frozenset[int]) -> None:
        self.step = 0
        self.value = math.nan
        self.ewma: dict[int, float] = dict.fromkeys(spans, math.nan)

    def push(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            return
        self.step, self.value = step, value
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


_NOTHING: tuple[tuple[float, float], ...] = ()  # what falls out of most pushes


class SpanWindow(Packed):
    """The points within a span of the newest one, with running sum and sum of squares.

    Sums are rebuilt from the deque once per window length of evictions, which
    keeps float drift bounded at amortised O(1) per point.
    """

    __slots__ = ("_evicted", "first_position", "items", "span", "sum", "sumsq")
    _packed = ("items",)

    def __init__(self, span: Span) -> None:
        self.span = span
        self.items: deque[tuple[float, float]] = deque()  # (position on span's axis, value)
        self.sum = 0.0
        self.sumsq = 0.0
        self._evicted = 0
        self.first_position: float | None = None  # of the first point ever pushed

    def position(self, step: int, wall_time: float, index: int) -> float:
        return axis(self.span, step, wall_time, index)

    def push(self, position: float, value: float) -> Sequence[tuple[float, float]]:
        """Add a point; returns the points that fell out (oldest first).

        Nothing falls out of most pushes into a span of steps or seconds (the
        window is cut by position): that is told by one comparison, with no
        list made; the evictions then go one at a time as before.
        """
        if self.first_position is None:
            self.first_position = position
        items = self.items
        items.append((position, value))
        self.sum += value
        self.sumsq += value * value
        span = self.span
        if span.unit == "points":
            if len(items) <= span.amount:
                return _NOTHING
        elif items[0][0] > position - span.amount:
            return _NOTHING
        out: list[tuple[float, float]] = []
        limit = position - span.amount
        while items and (
            items[0][0] <= limit if span.unit != "points" else len(items) > span.amount
        ):
            old = items.popleft()
            self.sum -= old[1]
            self.sumsq -= old[1] * old[1]
            out.append(old)
        self._evicted += len(out)
        if self._evicted > len(items) + 16:
            self._evicted = 0
            self.sum = math.fsum(v for _, v in items)
            self.sumsq = math.fsum(v * v for _, v in items)
        return out

    def covered(self, position: float) -> bool:
        """True once the history seen reaches back a whole span."""
        if self.span.unit == "points":
            return len(self.items) >= self.span.amount
        return (
            self.first_position is not None and position - self.first_position >= self.span.amount
        )

    def mean(self) -> float:
        return self.sum / len(self.items) if self.items else math.nan

    def std(self) -> float:
        n = len(self.items)
        if n < 2:
            return 0.0
        mean = self.sum / n
        return math.sqrt(max(self.sumsq / n - mean * mean, 0.0))


def axis(span: Span, step: int, wall_time: float, index: int) -> float:
    """Where a point sits on a span's axis: its step, its wall time, or its index."""
    unit = span.unit
    return float(step) if unit == "steps" else wall_time if unit == "seconds" else float(index)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def fmt(value: float) -> str:
    """Numbers in messages: 4 significant digits, readable at any magnitude."""
    return f"{value:.4g}" if math.isfinite(value) else str(value)
