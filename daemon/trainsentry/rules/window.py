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

from trainsentry.alert import RECOVERED
from trainsentry.rules.condition import RunView, axis, fmt, median, middle, settled
from trainsentry.rules.model import ACTIVE, HELD, QUIET, Baseline, Pair, Plateau, Rise, Span
from trainsentry.rules.packed import Packed
from trainsentry.store.buffers import NO_SHRINK, cut_front

BUCKETS = 128  # a plateau window's resolution: its edges move a 128th of it at a time


def bucket_width(amount: float) -> float:
    """Whole steps (or points) a bucket of a window of `amount`: the largest divisor of
    it up to a 128th of it, so a loss logged every k steps, k a multiple of the width
    (every 10, 50, 100 steps into a "2000 steps" window: width 10), is windowed exactly."""
    whole = int(amount)
    limit = max(1, int(amount // BUCKETS))
    if whole != amount:
        return float(limit)
    return float(next(w for w in range(limit, 0, -1) if whole % w == 0))


class BucketWindows(Packed):
    """A span's last window and the window before it, as running sums over buckets.

    What a plateau compares: the mean of the points within a span of the
    newest one (`recent`) against the mean of the span before (`older`). Kept
    point by point, a loss logged every step holds 4,000 points a run in the
    default "2000 steps" windows, 64 kB a run and most of a fleet's rule state
    (the prefilled soak: 330 MB RSS at 1,000 runs). So points are summed into
    buckets of `width` on the span's axis (`bucket_width`: at most a 128th of
    the span, in whole steps or points; windows of up to 255 steps or points
    keep a bucket per step or point and are exact), and a "2000 steps" window
    is 200 buckets, 10 kB a run for both. Its edges move a bucket at a time: for
    a loss logged at steps that are not multiples of the width, the window
    spans the span give or take a bucket (1990 to 2010 steps). A bucket
    belongs to `recent` while its key is within `reach` of the newest key,
    then to `older` for `reach` more; a clock set back files its points in the
    newest bucket (the front as it came). Each sum is rebuilt
    once per window length of bucket moves, which bounds float drift.
    """

    __slots__ = (
        "_first",
        "_moves",
        "_split",
        "counts",
        "first_position",
        "keys",
        "older_count",
        "older_reach",
        "older_sum",
        "reach",
        "recent_count",
        "recent_sum",
        "span",
        "sums",
        "width",
    )

    def __init__(self, span: Span, *, older: bool = True) -> None:
        """`older=False`: only the recent window is read, and the one before it is not
        kept (half the buckets: a rise over a window needs no window before it)."""
        self.span = span
        amount = span.amount
        if span.unit == "seconds":
            self.width = amount / BUCKETS
            self.reach = float(BUCKETS)
        else:  # whole steps or points a bucket; a points window keeps floor(amount) of them
            self.width = bucket_width(amount)
            self.reach = (amount if span.unit == "steps" else math.floor(amount)) / self.width
        self.older_reach = self.reach if older else 0.0
        self.keys = array("d")
        self.sums = array("d")
        self.counts = array("q")
        self._first = 0  # older is [_first:_split] of the buckets, recent [_split:]
        self._split = 0
        self.recent_sum = self.older_sum = 0.0
        self.recent_count = self.older_count = 0
        self._moves = 0  # buckets moved since the sums were rebuilt
        self.first_position: float | None = None  # of the first point ever pushed

    def recent_mean(self) -> float:
        n = self.recent_count
        return self.recent_sum / n if n else math.nan

    def older_mean(self) -> float:
        n = self.older_count
        return self.older_sum / n if n else math.nan

    def position(self, step: int, wall_time: float, index: int) -> float:
        return axis(self.span, step, wall_time, index)

    def push(self, position: float, value: float) -> None:
        if self.first_position is None:
            self.first_position = position
        keys, sums, counts = self.keys, self.sums, self.counts
        key = math.floor(position / self.width)
        self.recent_sum += value
        self.recent_count += 1
        if keys and key <= keys[-1]:  # the newest bucket (or a clock set back): no edge moves
            sums[-1] += value
            counts[-1] += 1
            return
        keys.append(key)
        sums.append(value)
        counts.append(1)
        edge = key - self.reach  # buckets at or before it have left recent
        split, size = self._split, len(keys)
        while split < size and keys[split] <= edge:
            self.recent_sum -= sums[split]
            self.recent_count -= counts[split]
            self.older_sum += sums[split]
            self.older_count += counts[split]
            split += 1
        first, edge = self._first, edge - self.older_reach
        while first < split and keys[first] <= edge:
            self.older_sum -= sums[first]
            self.older_count -= counts[first]
            first += 1
        self._moves += split - self._split
        self._split, self._first = split, first
        if self._moves > size - first + 16:
            self._moves = 0
            self.recent_sum = math.fsum(sums[split:])
            self.older_sum = math.fsum(sums[first:split])
        if first >= NO_SHRINK:
            cut_front((keys, sums, counts), first)
            self._first, self._split = 0, split - first


class PlateauCondition:
    """No real improvement over a window.

    `mean`: the mean of the last window against the mean of the window before
    it — robust to per-batch noise, for training loss. `best`: the best value
    has not improved by the margin for a window — Keras EarlyStopping's rule,
    for evaluations that come a few at a time.
    """

    __slots__ = (
        "_amount", "_sign", "_unit", "best", "best_at", "best_step", "count", "gain", "spec",
        "windows",
    )  # fmt: skip

    def __init__(self, spec: Plateau) -> None:
        self.spec = spec
        self.windows = BucketWindows(spec.window)
        self.count = 0
        self.best = math.nan
        self.best_at = 0.0
        self.best_step = 0
        self.gain = math.nan
        # read on every point of every loss: kept here rather than looked up through spec
        self._sign = 1.0 if spec.goal == "min" else -1.0
        self._unit = spec.window.unit
        self._amount = spec.window.amount

    def _needed(self, reference: float) -> float:
        return max(self.spec.min_delta, self.spec.min_improvement * abs(reference))

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not math.isfinite(value):
            return None
        self.count += 1
        unit = self._unit  # axis(), inlined
        if unit == "steps":
            position = float(step)
        else:
            position = wall_time if unit == "seconds" else float(self.count)
        if self.spec.method == "best":
            sign = self._sign
            if math.isnan(self.best) or sign * (self.best - value) > self._needed(self.best):
                self.best, self.best_at, self.best_step = value, position, step
                return QUIET
            stuck = position - self.best_at >= self._amount
            return ACTIVE if stuck else QUIET
        windows = self.windows
        windows.push(position, value)
        older = windows.older_count
        if not older:
            return None
        if unit == "points":
            if older < self._amount:
                return None
        else:
            first = windows.first_position
            if first is None or position - first < 2 * self._amount:
                return None  # not a whole window and the one before it seen yet
        before = windows.older_sum / older  # the windows' means, inlined
        n = windows.recent_count
        now = windows.recent_sum / n if n else math.nan
        gain = self.gain = self._sign * (before - now)
        return ACTIVE if gain <= 0 or gain < self._needed(before) else QUIET

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
    best, and the median of the last three values is back under the alarm
    line (a loss that overshot and settled far above its best is not coming
    back), the series is recovering and the verdict is held: a pending alert
    is cancelled (its `for` restarts), but a firing one stays firing. Whether
    a run has recovered is judged against where it was before the fault, its
    best, not against the excursion's peak: a loss that diverged to 100× its
    best and came down to 50× is still lost, and resolves only once its level
    is back under `factor` × its best (or `resolve_factor` ×, lower: a level that
    settled near the line dips under it and back, and that is one divergence,
    not a resolve and a re-fire each dip). Divergence keeps setting new peaks, or
    holds a high plateau, and stays active; the `for` then only has to
    outlast a burst.
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
        "recent",
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
        self.recent: deque[float] = deque(maxlen=3)

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if math.isnan(value):
            return None
        if math.isinf(value):
            value = math.copysign(1e300, value)  # an infinite loss diverged; keep the sums finite
        self.count += 1
        self.recent.append(value)
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
        spec = self.spec
        if not (rise > (spec.factor - 1.0) * abs(self.best) and rise > spec.min_delta):
            band = spec.resolve_factor
            if band is not None and rise > (band - 1.0) * abs(self.best) and rise > spec.min_delta:
                return HELD  # under the line, not back: a firing rise stays firing
            self.peak = math.nan
            return QUIET
        if math.isnan(self.peak) or self.ewma > self.peak:
            self.peak = self.ewma
        recovery = self.spec.recovery
        # coming back down, and the last three values (their median: one noisy batch
        # is not a level) already under the alarm line: a level that fell from its
        # peak but stays far above the best has not recovered
        rise_now = median(self.recent) - self.best
        back = (
            rise_now <= (self.spec.factor - 1.0) * abs(self.best) or rise_now <= self.spec.min_delta
        )
        recovering = (
            recovery > 0 and self.fast < self.peak - recovery * (self.peak - self.best) and back
        )
        return HELD if recovering else ACTIVE

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
    points every learn/8 points (at least every 2: two sorts a point would be
    most of a small ring's cost, and a baseline is no worse a point late).
    With `min_points`, judging starts once that many are in, on the baseline
    of the points there are, relearned with each new one until `learn` are
    in: a run logging once an epoch is judged within a few epochs. MAD has a
    floor of 0.1 % of the median so a flat baseline does not turn every
    wiggle into a huge z.

    The band the series left is the range of the baseline's points when it
    first went anomalous: a firing alert holds (HELD) while the series stays
    outside it on the side it left, however the rolling baseline moves, and
    resolves "recovered" once back in it. A norm still ×8 its old median
    after a ×12 blow-up is under the alarm line and not back (the rolling
    median had crept up under a growing norm, and the alert "recovered"
    steps before the NaN); a change that persists keeps it firing to the
    end of the run.
    """

    __slots__ = (
        "band", "count", "mad", "med", "ring", "since_refresh", "spec", "value", "z",
    )  # fmt: skip
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
        self.band: tuple[float, float] | None = None  # (lowest, highest) it left

    def _learn(self) -> None:
        ordered = sorted(self.ring)  # a rolling baseline relearns every few points
        self.med = med = middle(ordered)
        self.mad = middle(sorted([abs(v - med) for v in ordered]))
        self.since_refresh = 0

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if math.isnan(value):
            return None
        self.count += 1
        skip = self.spec.skip
        if step < skip.amount if skip.unit == "steps" else self.count <= skip.amount:
            return None  # the run's first points: transients, not its baseline
        learned = not math.isnan(self.med)
        hit = self._judge(value) if learned else False
        # An anomaly never joins the rolling baseline: otherwise a layer that blows
        # up and stays up becomes its own normal and the alert "recovers" while
        # the norm is still ×40 ("define normal first", then keep it).
        if math.isfinite(value) and (not learned or (self.spec.rolling and not hit)):
            self.ring.append(value)
            self.since_refresh += 1
            full = len(self.ring) == self.ring.maxlen
            early = not full and len(self.ring) >= (self.spec.min_points or math.inf)
            if (full or early) and (
                not learned or early or self.since_refresh >= max(2, len(self.ring) // 8)
            ):
                self._learn()
        if math.isnan(self.med):
            return None
        if not learned:
            hit = self._judge(value)
        if hit:
            if self.band is None:
                self.band = (min(self.ring), max(self.ring))
            return ACTIVE
        band = self.band
        if band is not None:
            spec = self.spec
            up = spec.z_above is not None or spec.ratio_above is not None
            down = spec.z_below is not None or spec.ratio_below is not None
            if (up and value > band[1]) or (down and value < band[0]):
                return HELD  # under the alarm line, not back where it was
            self.band = None
        return QUIET

    def resolved_reason(self) -> str:
        band, self.band = self.band, None
        if band is None or math.isnan(self.value):
            return RECOVERED
        return settled(self.value, self.med)

    def _judge(self, value: float) -> bool:
        spec, med = self.spec, self.med
        self.value = value
        scale = max(1.4826 * self.mad, 1e-3 * abs(med), 1e-12)
        z = self.z = (value - med) / scale
        ratio = value / med if med > 0 else math.nan
        # every limit given must be passed (AND), the first missed ending it, with nothing
        # built on the way: three losses' baselines judge every point of every run
        return (
            (spec.z_above is None or z > spec.z_above)
            and (spec.z_below is None or z < spec.z_below)
            and (spec.ratio_above is None or ratio > spec.ratio_above)
            and (spec.ratio_below is None or ratio < spec.ratio_below)
            and (spec.value_above is None or value > spec.value_above)
            and (spec.value_below is None or value < spec.value_below)
        )

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

    Jumps are the other use: a learning rate far above any it had while the
    loss of the same record leaps above its level before it. Two independent
    signals agreeing on one point can page at once where one alone could be
    an odd batch or a deliberate change; the alert then holds while the
    series stays above its highest before the jump (`mark`), not only while it
    stays ×`jump_from_max` above it: an lr ×100 whose schedule decays it is
    under the jump's line long before it is back (HF's linear decay, ×18 its
    value before the jump), and that is no recovery.

    Without a jump, a resolve is "recovered" once this series is back within
    `rise_from_best` of its best; else it says where it settled.
    """

    __slots__ = (
        "awaits", "best", "best_step", "mark", "other", "other_at_best", "other_before",
        "peak", "peak_before", "spec", "value",
    )  # fmt: skip

    def __init__(self, spec: Pair) -> None:
        self.spec = spec
        self.value = math.nan
        self.other = math.nan
        self.other_before = math.nan
        self.best = math.nan
        self.best_step = 0
        self.other_at_best = math.nan
        self.peak = math.nan  # the highest value so far
        self.peak_before = math.nan  # ... before the latest
        self.mark = math.nan  # the highest before a jump that paged, until back under it
        # a jump judged before the other's value of the same step was in: the engine
        # judges it again when that value comes (the lr written before the loss)
        self.awaits = False

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not math.isfinite(value):
            return None
        series = run.other(self.spec.other)
        if series is None or math.isnan(series.value):
            return None
        other = series.ewma.get(self.spec.other_smoothing, series.value)
        spec = self.spec
        # While a jump lasts its values are not the series' normal: the highest before
        # the jump stays the mark, and the alert holds until the series is back under it.
        peak = self.peak_before = self.peak
        jumped = spec.jump_from_max is not None and peak > 0 and value > spec.jump_from_max * peak
        if not jumped and self.mark == self.mark:  # a jump that paged: is it back?
            if value > self.mark:
                self.value, self.awaits = value, False
                return HELD  # under the jump's line, still above all it had before
            self.mark = math.nan
        if not jumped:
            self.peak = value if math.isnan(peak) else max(peak, value)
            if spec.jump_from_max is not None:
                self.value = value
                return QUIET  # the test every jump rule needs failed: the common case, cheaply
        if spec.other_jump is not None:  # the other's own latest value, not its level
            other = series.value
            self.other_before = series.before.get(spec.other_smoothing, math.nan)
        self.value, self.other = value, other
        if math.isnan(self.best) or value < self.best:
            self.best, self.best_step, self.other_at_best = value, step, other
        before = self.other_before
        checks = [
            (spec.jump_from_max, jumped),
            (spec.other_jump, before > 0 and other > (spec.other_jump or 0) * before),
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
        if all(hit for limit, hit in checks if limit is not None):
            self.awaits = False
            if jumped and math.isnan(self.mark):
                self.mark = peak
            return ACTIVE
        self.awaits = jumped and spec.other_jump is not None and series.step < step
        return HELD if jumped else QUIET

    def resolved_reason(self) -> str:
        mark, self.mark = self.mark, math.nan
        if mark == mark:  # a jump's alert resolves only once back under its mark
            return settled(self.value, mark)
        rise = self.spec.rise_from_best
        if rise is not None and self.value - self.best > rise * abs(self.best):
            return settled(self.value, self.best)
        return RECOVERED

    def evidence(self) -> str:
        spec, name = self.spec, self.spec.other
        parts = [f"is {fmt(self.value)} while {name} is {fmt(self.other)}"]
        if spec.jump_from_max is not None and self.peak_before > 0:
            ratio, peak = self.value / self.peak_before, fmt(self.peak_before)
            parts.append(f"×{ratio:.3g} the highest it had before ({peak})")
        if spec.other_jump is not None and self.other_before > 0:
            ratio = self.other / self.other_before
            parts.append(f"{name} ×{ratio:.3g} its level before ({fmt(self.other_before)})")
        if spec.ratio_above is not None and self.other > 0:
            ratio = self.value / self.other
            parts.append(f"a ratio of ×{ratio:.3g} (limit ×{fmt(spec.ratio_above)})")
        if spec.gap_above is not None:
            parts.append(f"gap {fmt(self.value - self.other)} (limit {fmt(spec.gap_above)})")
        if spec.rise_from_best is not None and self.best:
            rise = (self.value - self.best) / abs(self.best)
            # a blown-up loss is "×3e+14 its best", not a percentage of 17 digits
            up = f"up {rise:.1%}" if rise < 10 else f"×{rise + 1:.3g}"
            parts.append(f"{up} from its best {fmt(self.best)} at step {self.best_step}")
        if spec.other_fall_since_best is not None and self.other_at_best:
            fall = (self.other_at_best - self.other) / abs(self.other_at_best)
            parts.append(f"{name} down {fall:.1%} since then")
        return "; ".join(parts)


class WindowRiseCondition:
    """A mean over a span of steps well above the lowest mean of that span the run had.

    An EWMA over points averages a different stretch of training at each
    cadence, and too few points of a sparse log: Lightning's default logs
    one batch's loss every 50 steps, whose single-batch values swing ×100
    around a near-zero level, and a run ends before a 20-point EWMA and its
    warm-up have settled. A window on the step axis averages the same
    stretch of training at every cadence (1000 steps: 2 points at HF's 500,
    20 at Lightning's 50, 1000 when every step is logged). The best is the
    lowest mean of a whole window; the level is judged once a whole window
    is in, and the verdict clears as soon as the mean is back under the line,
    so recovery is judged against the run's best, not the excursion's peak.
    """

    __slots__ = ("best", "best_step", "count", "level", "spec", "windows")

    def __init__(self, spec: Rise) -> None:
        assert spec.window is not None
        self.spec = spec
        self.windows = BucketWindows(spec.window, older=False)
        self.count = 0
        self.level = math.nan
        self.best = math.nan
        self.best_step = 0

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if not math.isfinite(value):
            return None  # the non-finite rules' to judge; one inf would poison the sums
        self.count += 1
        windows, span = self.windows, self.windows.span
        position = windows.position(step, wall_time, self.count)
        windows.push(position, value)
        first = windows.first_position
        if first is None or position - first < span.amount:
            return None  # not a whole window yet: its mean would be the warm-up's
        level = self.level = windows.recent_mean()
        if math.isnan(self.best) or level < self.best:
            self.best, self.best_step = level, step
            return QUIET
        rise = level - self.best
        spec = self.spec
        high = rise > (spec.factor - 1.0) * abs(self.best) and rise > spec.min_delta
        return ACTIVE if high else QUIET

    def evidence(self) -> str:
        ratio = self.level / self.best if self.best > 0 else math.nan
        times = f"×{ratio:.3g} " if math.isfinite(ratio) else ""
        window = self.spec.window
        return (
            f"is up: its mean over the last {window} ({fmt(self.level)}) is {times}the lowest "
            f"mean over {window} it had ({fmt(self.best)}, to step {self.best_step})"
        )
