"""Layer 2, window conditions: a series judged against its own recent past.

A loss is noisy per batch and its healthy scale differs per model, so these
conditions compare a run with itself: window means rather than single points
(plateau), a smoothed level against its own best (rise), a baseline of median
and MAD learned from the run's own early history (baseline) — "define normal
before alerting" — and one series against another of the same run (pair).
Every update is amortised O(1): deques with running sums, and sorting only
once per baseline refresh.
"""

from __future__ import annotations

import math
from array import array
from collections import deque

from trainsentry.buffers import NO_SHRINK, cut_front
from trainsentry.rules.condition import RunView, axis, fmt, median
from trainsentry.rules.model import ACTIVE, QUIET, Baseline, Pair, Plateau, Rise, Span
from trainsentry.rules.packed import Packed


class AdjacentWindows(Packed):
    """A span's last window and the window before it, in one pair of arrays.

    What a plateau compares: the points within a span of the newest one
    (`recent`), and the points that fell out of it, within a span of the last
    one that fell (`older`), each with a running sum. They were two span
    windows, the one pushing what it dropped into the other; a loss logged
    every step then made a tuple and a list per point and held every point
    twice in the hand-over. Here a point is written once and only moves across
    the boundary index: the arrays are [older | recent], from `_first` and
    `_split`. The sums take the same operations in the same order as the two
    windows did (the property test compares them bit for bit), and each is
    rebuilt once per window length of its evictions, which bounds float drift.
    """

    __slots__ = (
        "_first",
        "_older_out",
        "_recent_out",
        "_split",
        "first_position",
        "older_sum",
        "positions",
        "recent_sum",
        "span",
        "values",
    )

    def __init__(self, span: Span) -> None:
        self.span = span
        self.positions = array("d")
        self.values = array("d")
        self._first = 0  # older is [_first:_split], recent [_split:]
        self._split = 0
        self.recent_sum = 0.0
        self.older_sum = 0.0
        self._recent_out = 0  # evictions since each sum was last rebuilt
        self._older_out = 0
        self.first_position: float | None = None  # of the first point ever pushed

    @property
    def recent_len(self) -> int:
        return len(self.values) - self._split

    @property
    def older_len(self) -> int:
        return self._split - self._first

    def recent_mean(self) -> float:
        n = self.recent_len
        return self.recent_sum / n if n else math.nan

    def older_mean(self) -> float:
        n = self.older_len
        return self.older_sum / n if n else math.nan

    def position(self, step: int, wall_time: float, index: int) -> float:
        return axis(self.span, step, wall_time, index)

    def push(self, position: float, value: float) -> None:
        if self.first_position is None:
            self.first_position = position
        positions, values = self.positions, self.values
        positions.append(position)
        values.append(value)
        self.recent_sum += value
        amount, by_points = self.span.amount, self.span.unit == "points"
        split = self._split
        size = len(values)
        if by_points:
            cut = split + max(0, math.ceil(size - split - amount))
        else:
            limit = position - amount
            cut = split
            while cut < size and positions[cut] <= limit:  # the front, as it came
                cut += 1
        if cut == split:
            return
        for k in range(split, cut):
            self.recent_sum -= values[k]
        self._recent_out += cut - split
        if self._recent_out > size - cut + 16:
            self._recent_out = 0
            self.recent_sum = math.fsum(values[cut:])
        for k in range(split, cut):  # one by one into older, as the two windows did
            self._split = k + 1
            self._enter_older(k, amount, by_points)
        if self._first >= NO_SHRINK:
            first = self._first
            cut_front((positions, values), first)
            self._first, self._split = 0, self._split - first

    def _enter_older(self, k: int, amount: float, by_points: bool) -> None:
        """The point at k has just left recent: older takes it and drops what it outgrew."""
        positions, values = self.positions, self.values
        self.older_sum += values[k]
        first, end = self._first, k + 1
        if by_points:
            cut = first + max(0, math.ceil(end - first - amount))
        else:
            limit = positions[k] - amount
            cut = first
            while cut < end and positions[cut] <= limit:
                cut += 1
        if cut == first:
            return
        for j in range(first, cut):
            self.older_sum -= values[j]
        self._first = cut
        self._older_out += cut - first
        if self._older_out > end - cut + 16:
            self._older_out = 0
            self.older_sum = math.fsum(values[cut:end])


class PlateauCondition:
    """No real improvement over a window.

    `mean`: the mean of the last window against the mean of the window before
    it — robust to per-batch noise, for training loss. `best`: the best value
    has not improved by the margin for a window — Keras EarlyStopping's rule,
    for evaluations that come a few at a time.
    """

    __slots__ = ("best", "best_at", "best_step", "count", "gain", "spec", "windows")

    def __init__(self, spec: Plateau) -> None:
        self.spec = spec
        self.windows = AdjacentWindows(spec.window)
        self.count = 0
        self.best = math.nan
        self.best_at = 0.0
        self.best_step = 0
        self.gain = math.nan

    def _needed(self, reference: float) -> float:
        return max(self.spec.min_delta, self.spec.min_improvement * abs(reference))

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not math.isfinite(value):
            return None
        self.count += 1
        sign = 1.0 if self.spec.goal == "min" else -1.0
        windows = self.windows
        position = windows.position(step, wall_time, self.count)
        if self.spec.method == "best":
            if math.isnan(self.best) or sign * (self.best - value) > self._needed(self.best):
                self.best, self.best_at, self.best_step = value, position, step
                return QUIET
            stuck = position - self.best_at >= self.spec.window.amount
            return ACTIVE if stuck else QUIET
        windows.push(position, value)
        first = windows.first_position
        older = windows.older_len
        if self.spec.window.unit == "points":
            full = older >= self.spec.window.amount
        else:
            full = first is not None and position - first >= 2 * self.spec.window.amount
        if not full or not older:
            return None
        before, now = windows.older_sum / older, windows.recent_mean()
        self.gain = sign * (before - now)
        return ACTIVE if self.gain <= 0 or self.gain < self._needed(before) else QUIET

    def evidence(self) -> str:
        spec = self.spec
        needs = []
        if spec.min_improvement:
            needs.append(f"{spec.min_improvement:.3g} relative")
        if spec.min_delta:
            needs.append(f"{fmt(spec.min_delta)} absolute")
        need = f"needs {' or '.join(needs)}" if needs else ""
        if spec.method == "best":
            best = f"{fmt(self.best)}, from step {self.best_step},"
            tail = f" ({need})" if need else ""
            return f"has not improved on its best {best} for {spec.window}{tail}"
        before = self.windows.older_mean()
        rel = self.gain / abs(before) if before else math.nan
        tail = f"; {need}" if need else ""
        return (
            f"improved {rel:.2%} over the last {spec.window} "
            f"(mean {fmt(self.windows.recent_mean())} vs {fmt(before)} before{tail})"
        )


class RiseCondition:
    """A smoothed series well above its own smoothed best: sustained divergence, not a spike.

    With `recovery`, an excursion is judged by where the series is going too.
    A burst of bad batches drags the smoothed level (EWMA over `smoothing`
    points) far up, and it stays up for many points after the burst because an
    EWMA lags; but the moment the burst ends the raw loss is back down. So a
    fast EWMA (over a quarter of the span) is compared with the excursion's
    peak: once it has fallen `recovery` of the way from that peak towards the
    best, the series is recovering and the verdict is quiet, which restarts
    the rule's `for`. Divergence keeps setting new peaks, or holds a high
    plateau, and stays active; the `for` then only has to outlast a burst.
    """

    __slots__ = (
        "alpha",
        "best",
        "best_step",
        "count",
        "ewma",
        "fast",
        "fast_alpha",
        "peak",
        "spec",
    )

    def __init__(self, spec: Rise) -> None:
        self.spec = spec
        self.alpha = 2.0 / (spec.smoothing + 1.0)
        self.fast_alpha = 2.0 / (max(1, spec.smoothing // 4) + 1.0)
        self.ewma = math.nan
        self.fast = math.nan
        self.best = math.nan
        self.best_step = 0
        self.count = 0
        self.peak = math.nan  # highest smoothed level of the current excursion

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if math.isnan(value):
            return None
        if math.isinf(value):
            value = math.copysign(1e300, value)  # an infinite loss diverged; keep the sums finite
        self.count += 1
        if math.isnan(self.ewma):
            self.ewma = self.fast = value
        else:
            self.ewma += self.alpha * (value - self.ewma)
            self.fast += self.fast_alpha * (value - self.fast)
        if self.count <= self.spec.skip + self.spec.smoothing // 2:
            return None
        if math.isnan(self.best) or self.ewma < self.best:
            self.best, self.best_step = self.ewma, step
            self.peak = math.nan
            return QUIET
        rise = self.ewma - self.best
        if not (rise > (self.spec.factor - 1.0) * abs(self.best) and rise > self.spec.min_delta):
            self.peak = math.nan
            return QUIET
        if math.isnan(self.peak) or self.ewma > self.peak:
            self.peak = self.ewma
        recovery = self.spec.recovery
        recovering = recovery > 0 and self.fast < self.peak - recovery * (self.peak - self.best)
        return QUIET if recovering else ACTIVE

    def evidence(self) -> str:
        ratio = self.ewma / self.best if self.best > 0 else math.nan
        times = f"×{ratio:.3g} " if math.isfinite(ratio) else ""
        return (
            f"is rising: its smoothed level {fmt(self.ewma)} (EWMA over {self.spec.smoothing} "
            f"points) is {times}its best {fmt(self.best)}, from step {self.best_step}"
        )


class BaselineCondition(Packed):
    """Robust z-score (median/MAD) and ratio against the run's own early history.

    The baseline is learned once from the first `learn` points after `skip`
    (initial transients), or, with `rolling`, refreshed from the last `learn`
    points every learn/8 points. MAD has a floor of 0.1 % of the median so a
    flat baseline does not turn every wiggle into a huge z.
    """

    __slots__ = ("count", "mad", "med", "ring", "since_refresh", "spec", "value", "z")
    _packed = ("ring",)

    def __init__(self, spec: Baseline) -> None:
        self.spec = spec
        self.count = 0
        self.ring: deque[float] = deque(maxlen=max(int(spec.learn.amount), 3))
        self.med = math.nan
        self.mad = math.nan
        self.since_refresh = 0
        self.value = math.nan
        self.z = math.nan

    def _skipping(self, step: int) -> bool:
        skip = self.spec.skip
        return step < skip.amount if skip.unit == "steps" else self.count <= skip.amount

    def _learn(self) -> None:
        values = list(self.ring)
        self.med = median(values)
        self.mad = median([abs(v - self.med) for v in values])
        self.since_refresh = 0

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if math.isnan(value):
            return None
        self.count += 1
        if self._skipping(step):
            return None
        learned = not math.isnan(self.med)
        hit = self._judge(value) if learned else False
        # An anomaly never joins the rolling baseline: otherwise a layer that blows
        # up and stays up becomes its own normal and the alert "recovers" while
        # the norm is still ×40 ("define normal first", then keep it).
        if math.isfinite(value) and (not learned or (self.spec.rolling and not hit)):
            self.ring.append(value)
            self.since_refresh += 1
            full = len(self.ring) == self.ring.maxlen
            if full and (not learned or self.since_refresh >= max(1, len(self.ring) // 8)):
                self._learn()
        if math.isnan(self.med):
            return None
        if not learned:
            hit = self._judge(value)
        return ACTIVE if hit else QUIET

    def _judge(self, value: float) -> bool:
        spec, med = self.spec, self.med
        self.value = value
        scale = max(1.4826 * self.mad, 1e-3 * abs(med), 1e-12)
        self.z = (value - med) / scale
        ratio = value / med if med > 0 else math.nan
        checks = (
            (spec.z_above, self.z > (spec.z_above or 0)),
            (spec.z_below, self.z < (spec.z_below or 0)),
            (spec.ratio_above, ratio > (spec.ratio_above or 0)),
            (spec.ratio_below, ratio < (spec.ratio_below or 0)),
            (spec.value_above, value > (spec.value_above or 0)),
            (spec.value_below, value < (spec.value_below or 0)),
        )
        return all(hit for limit, hit in checks if limit is not None)

    def evidence(self) -> str:
        kind = "rolling" if self.spec.rolling else "learned"
        ratio = f"×{self.value / self.med:.3g} " if self.med > 0 else ""
        return (
            f"is {fmt(self.value)}, {ratio}the median {fmt(self.med)} of the run's {kind} "
            f"baseline (robust z {self.z:.3g}; MAD {fmt(self.mad)} over {len(self.ring)} points)"
        )


class PairCondition:
    """Two series of one run judged together: validation against training.

    Overfitting is not visible in either loss alone: it is validation loss rising
    while training loss keeps falling, or a training loss near zero with a
    validation loss many times larger. The rule reads this series (usually
    `val_loss`) and looks up the other one's smoothed level in the same run.
    All configured tests must hold (AND); write two rules for OR.
    """

    __slots__ = ("best", "best_step", "other", "other_at_best", "spec", "value")

    def __init__(self, spec: Pair) -> None:
        self.spec = spec
        self.value = math.nan
        self.other = math.nan
        self.best = math.nan
        self.best_step = 0
        self.other_at_best = math.nan

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not math.isfinite(value):
            return None
        series = run.other(self.spec.other)
        if series is None or math.isnan(series.value):
            return None
        other = series.ewma.get(self.spec.other_smoothing, series.value)
        self.value, self.other = value, other
        spec = self.spec
        if math.isnan(self.best) or value < self.best:
            self.best, self.best_step, self.other_at_best = value, step, other
        checks = [
            (spec.ratio_above, other > 0 and value / other > (spec.ratio_above or 0)),
            (spec.gap_above, value - other > (spec.gap_above or 0)),
            (spec.other_below, other < (spec.other_below or 0)),
            (spec.other_above, other > (spec.other_above or 0)),
            (
                spec.rise_from_best,
                value - self.best > (spec.rise_from_best or 0) * abs(self.best)
                and value > self.best,
            ),
            (
                spec.other_fall_since_best,
                self.other_at_best - other
                > (spec.other_fall_since_best or 0) * abs(self.other_at_best)
                and other < self.other_at_best,
            ),
        ]
        return ACTIVE if all(hit for limit, hit in checks if limit is not None) else QUIET

    def evidence(self) -> str:
        spec, name = self.spec, self.spec.other
        parts = [f"is {fmt(self.value)} while {name} is {fmt(self.other)}"]
        if spec.ratio_above is not None and self.other > 0:
            ratio = self.value / self.other
            parts.append(f"a ratio of ×{ratio:.3g} (limit ×{fmt(spec.ratio_above)})")
        if spec.gap_above is not None:
            parts.append(f"gap {fmt(self.value - self.other)} (limit {fmt(spec.gap_above)})")
        if spec.rise_from_best is not None and self.best:
            rise = (self.value - self.best) / abs(self.best)
            parts.append(f"up {rise:.1%} from its best {fmt(self.best)} at step {self.best_step}")
        if spec.other_fall_since_best is not None and self.other_at_best:
            fall = (self.other_at_best - self.other) / abs(self.other_at_best)
            parts.append(f"{name} down {fall:.1%} since then")
        return "; ".join(parts)
