"""Layer 3, shapes: exponential growth with a projection, and spikes.

Divergence announces itself before the NaN: the gradient norm grows
geometrically for tens of steps. A least-squares line through log(value)
against step over a sliding window measures that growth (its slope), how
clean it is (R²), and when the fitted curve will cross a threshold — the lead
time a page needs. The fit keeps running sums (n, Σx, Σy, Σx², Σxy, Σy²), so
each point costs O(1); x is taken relative to an origin that is moved to the
window's start whenever the sums are rebuilt, which keeps x² small enough
that the variance does not drown in rounding at step ten million.

Both shapes go quiet when the shape ends, not when the series is back: a norm
that grew ×10 and stopped there no longer grows, a loss that spiked and stayed
up is absorbed into the recent level. Their resolves say which it was: the
level before the alarm is kept when it goes active, and a resolve is
"recovered" only back near it, else "settled at a new level, ×N the old".
"""

from __future__ import annotations

import math
from collections import deque

from trainsentry.alert import RECOVERED
from trainsentry.rules.condition import RunView, SpanWindow, axis, fmt, median, settled
from trainsentry.rules.model import ACTIVE, CRITICAL, QUIET, Growth, Span, Spike
from trainsentry.rules.packed import Packed


class GrowthCondition(Packed):
    """Geometric growth along a clean log-linear fit.

    The level before the alarm is the window's oldest value when the growth
    first holds; a resolve is "recovered" once the median of the last three
    values is back within half the growth (in log space, the fit's own
    hysteresis) of it.
    """

    __slots__ = (
        "_amount", "_by_points", "_log_growth", "before", "count", "fit", "growing", "items",
        "origin", "rebuild_in", "spec", "sx", "sxx", "sxy", "sy", "syy", "value",
    )  # fmt: skip
    _packed = ("items",)

    def __init__(self, spec: Growth) -> None:
        self.spec = spec
        # read on every point of every loss: kept here rather than worked out from spec
        self._by_points = spec.window.unit == "points"
        self._amount = spec.window.amount
        self._log_growth = math.log(spec.min_growth)
        self.items: deque[tuple[float, float, float]] = deque()  # (position, x, y)
        self.origin = 0.0
        self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        self.rebuild_in = 0
        self.count = 0
        self.growing = False
        self.value = math.nan
        self.fit: tuple[float, float, float, float, float] | None = None  # slope, r2, span, yhat, x
        self.before = math.nan  # the value the growth that went active started from

    def _add(self, x: float, y: float, sign: float) -> None:
        x -= self.origin
        self.sx += sign * x
        self.sy += sign * y
        self.sxx += sign * x * x
        self.sxy += sign * x * y
        self.syy += sign * y * y

    def _rebuild(self) -> None:
        self.origin = self.items[0][1]
        self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        for _, x, y in self.items:
            self._add(x, y, 1.0)
        self.rebuild_in = len(self.items) + 16

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not (math.isfinite(value) and value > 0):
            return None  # log needs a positive finite value; NaN/inf is the non_finite rule's
        self.count += 1
        self.value = value
        items = self.items
        if items and step <= items[-1][1]:
            return None  # a repeated or rewound step adds nothing to a fit against step
        by_points, amount = self._by_points, self._amount
        position = (
            float(self.count) if by_points else axis(self.spec.window, step, wall_time, self.count)
        )
        y = math.log(value)
        items.append((position, float(step), y))
        # _add, inlined (with its sign): this runs for every point of every loss
        origin = self.origin
        x = step - origin
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y
        self.syy += y * y
        limit = position - amount
        while items and (len(items) > amount if by_points else items[0][0] <= limit):
            _, ox, oy = items.popleft()
            ox -= origin
            self.sx -= ox
            self.sy -= oy
            self.sxx -= ox * ox
            self.sxy -= ox * oy
            self.syy -= oy * oy
        self.rebuild_in -= 1
        if self.rebuild_in <= 0:
            self._rebuild()
        return self._judge(step)

    def _judge(self, step: int) -> int | None:
        n = len(self.items)
        if n < self.spec.min_points:
            self.fit = None
            return None
        sxx = self.sxx - self.sx * self.sx / n
        sxy = self.sxy - self.sx * self.sy / n
        syy = self.syy - self.sy * self.sy / n
        if sxx <= 0:
            return None
        slope = sxy / sxx
        r2 = sxy * sxy / (sxx * syy) if syy > 0 else 0.0
        span = self.items[-1][1] - self.items[0][1]
        x = step - self.origin
        yhat = (self.sy - slope * self.sx) / n + slope * x
        self.fit = (slope, r2, span, yhat, x)
        spec = self.spec
        # hysteresis: once growing, it takes half the growth (in log space) and a value
        # back under the threshold to count as recovered — not one noisy window
        needed = self._log_growth * (0.5 if self.growing else 1.0)
        past = self.growing and spec.threshold is not None and self.value >= spec.threshold
        self.growing = past or (
            slope > 0
            and slope * span >= needed
            and r2 >= spec.min_r2
            and self.value >= spec.min_value
        )
        if not self.growing:
            return QUIET
        if math.isnan(self.before):
            self.before = math.exp(self.items[0][2])
        ahead = self.steps_to_threshold()
        if spec.critical_within is not None and ahead is not None and ahead <= spec.critical_within:
            return CRITICAL
        return ACTIVE

    def resolved_reason(self) -> str:
        before, self.before = self.before, math.nan
        if not (before > 0 and self.items):
            return RECOVERED
        # the median of the last three values: one batch is not a level
        y = median(item[2] for item in list(self.items)[-3:])
        if y - math.log(before) > self._log_growth / 2:
            return settled(math.exp(y), before)
        return RECOVERED

    def steps_to_threshold(self) -> float | None:
        """Steps until the fitted curve reaches `threshold` (0 if already past)."""
        if self.fit is None or self.spec.threshold is None or self.fit[0] <= 0:
            return None
        slope, _, _, yhat, _ = self.fit
        if self.value >= self.spec.threshold:
            return 0.0
        return max((math.log(self.spec.threshold) - yhat) / slope, 0.0)

    def evidence(self) -> str:
        if self.fit is None:
            return f"is {fmt(self.value)} (too few points for a fit)"
        slope, r2, span, _, _ = self.fit
        text = (
            f"grew ×{math.exp(slope * span):.3g} in {span:.0f} steps "
            f"({len(self.items)} points, R² {r2:.2f}), now {fmt(self.value)}"
        )
        ahead = self.steps_to_threshold()
        if ahead is not None:
            if ahead == 0:
                text += f"; already past {fmt(self.spec.threshold or 0)}"
            else:
                text += f"; projected to pass {fmt(self.spec.threshold or 0)} in ~{ahead:.0f} steps"
        return text


class SpikeCondition(Packed):
    """A point far above the recent level; repeated spike *episodes* escalate.

    `sigma`: above mean + k·σ of the last `window` points and at least
    `min_ratio` × the mean. `ewma`: a fast EWMA over `ratio` × a slow one.
    A spike enters the statistics clipped at the spike limit, so one spike does
    not hide the next, while a lasting level shift is absorbed over a window.

    Repeats count episodes, not points: a run of bad batches, or one bad batch
    whose loss takes a few steps to come down, is one event. An episode ends
    once the series has been back within normal (at or under the limit) for
    `settle` points in a row; the next spike after that starts a new one.

    The level before the alarm is the mean the first spike rose from; a
    resolve is "recovered" once the recent level (the median of the last three
    values, or the fast average) is back within `min_ratio` × that mean (`ratio` × the slow
    average, for `ewma`), else the spikes became a level.
    """

    __slots__ = (
        "before", "calm", "count", "fast", "in_episode", "limit", "mean", "recent", "slow",
        "spec", "spikes", "value", "window",
    )  # fmt: skip
    _packed = ("spikes",)

    def __init__(self, spec: Spike) -> None:
        self.spec = spec
        self.window = SpanWindow(Span(float(spec.window), "points"))
        self.fast = math.nan
        self.slow = math.nan
        self.count = 0
        self.value = math.nan
        self.mean = math.nan
        self.limit = math.nan
        self.in_episode = False
        self.calm = 0  # points within normal since the last spike
        self.spikes: deque[float] = deque()  # where recent spike episodes began
        self.before: tuple[float, float] | None = None  # (mean, top of its band) at the first spike
        self.recent: deque[float] = deque(maxlen=3)  # the window holds them clipped

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not math.isfinite(value):
            return None
        spec = self.spec
        self.count += 1
        self.value = value
        if spec.method == "sigma":
            self.recent.append(value)
            window = self.window
            # len(), the window's mean() and std(), inlined: this runs for every loss point
            n = len(window.values) - window.head
            mean = window.sum / n if n else math.nan
            std = math.sqrt(max(window.sumsq / n - mean * mean, 0.0)) if n >= 2 else 0.0
            ready = n >= spec.warmup and n >= 3
            self.mean = mean
            self.limit = limit = max(mean + spec.k * std, mean + (spec.min_ratio - 1.0) * abs(mean))
            spike = ready and value > limit
            window.push(self.count, min(value, limit) if ready else value)
        else:
            fast_a, slow_a = 2.0 / (spec.fast + 1.0), 2.0 / (spec.slow + 1.0)
            self.fast = value if math.isnan(self.fast) else self.fast + fast_a * (value - self.fast)
            self.slow = value if math.isnan(self.slow) else self.slow + slow_a * (value - self.slow)
            self.mean, self.limit = self.slow, spec.ratio * self.slow
            spike = self.count > spec.warmup and self.slow > 0 and self.fast > self.limit
        if not spike:
            self.calm += 1
            if self.calm >= spec.settle:
                self.in_episode = False
            return QUIET
        self.calm = 0
        if self.before is None:  # the band of a level: σ is a batch's spread, not a level's
            mean, top = self.mean, self.limit
            if spec.method == "sigma":
                top = mean + (spec.min_ratio - 1.0) * abs(mean)
            self.before = (mean, top)
        within = spec.repeat_within
        if not self.in_episode:
            self.in_episode = True
            if within is not None:
                self.spikes.append(axis(within, step, wall_time, self.count))
        if spec.repeat_count is None or within is None:
            return ACTIVE
        position = axis(within, step, wall_time, self.count)
        while self.spikes and self.spikes[0] <= position - within.amount:
            self.spikes.popleft()
        return CRITICAL if len(self.spikes) >= spec.repeat_count else ACTIVE

    def resolved_reason(self) -> str:
        before, self.before = self.before, None
        if before is None:
            return RECOVERED
        # the median of the last three values (one batch is not a level), or the fast EWMA
        level = median(self.recent) if self.spec.method == "sigma" else self.fast
        mean, limit = before
        return settled(level, mean) if level > limit else RECOVERED

    def evidence(self) -> str:
        spec = self.spec
        if spec.method == "sigma":
            std = self.window.std()
            sigmas = (self.value - self.mean) / std if std > 0 else math.inf
            text = (
                f"jumped to {fmt(self.value)}, {sigmas:.3g}σ above its mean {fmt(self.mean)} "
                f"over the last {len(self.window)} points (limit {fmt(self.limit)})"
            )
        else:
            text = (
                f"has a fast average {fmt(self.fast)}, ×{self.fast / self.slow:.3g} the slow "
                f"one {fmt(self.slow)} (limit ×{fmt(spec.ratio)})"
            )
        if spec.repeat_count and spec.repeat_within and len(self.spikes) > 1:
            text += f"; {len(self.spikes)} spike episodes within {spec.repeat_within}"
        return text
