"""Layer 2, the run's own clock: throughput drops and silence.

Both compare a run with its own pace, because a healthy pace ranges from
milliseconds per step (an MLP) to a minute (a large model), and logging
intervals from a second to an hour.

Throughput needs no special metric: seconds per step can be read off any
series' (step, wall_time) pairs, since most writers stamp wall time when a
value is logged, not when it is flushed (those that stamp at flush time, or
not at all, are handled: see ThroughputCondition). Its recent level is a
*median* of the last few intervals, so the pause for an evaluation or a
checkpoint is not a drop; a data loader that has become the bottleneck is.

Silence ("no data") is judged against the run's typical interval between new
steps, with a floor well above writers' buffering: tensorboardX and torch's
SummaryWriter hold points up to flush_secs=120 s, and a TF2 writer flushes
every 10 events or 120 s, so a live daemon can see two minutes of quiet from
a perfectly healthy job.
"""

from __future__ import annotations

import math
from collections import deque

from trainsentry.rules.condition import RunView, fmt, median
from trainsentry.rules.model import ACTIVE, QUIET, NoData, Stale, Throughput
from trainsentry.rules.packed import Packed


def _duration(seconds: float) -> str:
    """120 s stays "120s"; longer reads as "15m" or "2h05m", the way people say it."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 120:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    if whole < 7200:
        minutes, secs = divmod(whole, 60)
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    hours, minutes = divmod(whole // 60, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"


def _times(ratio: float) -> str:
    """×7.63, ×3,530: a ratio as people read it."""
    return f"×{ratio:,.0f}" if math.isfinite(ratio) and ratio >= 100 else f"×{ratio:.3g}"


class ThroughputCondition(Packed):
    """Seconds per step now against the run's own baseline, by ratio and by an absolute margin.

    From the clock, an interval runs between two *distinct* wall stamps: a
    writer that flushes on a timer, or a CSV read back with its file's mtime,
    stamps several steps at once, and those steps share the time to the next
    stamp instead of counting as zero-second steps followed by one huge one.
    A ratio alone is not enough: a model whose steps take 3 ms slows ×3 whenever
    the scheduler hands its core to a neighbour, which costs nobody anything —
    `min_increase` asks for a slowdown someone would notice. With `recent: 1`
    the condition judges each interval alone, and `min_gap` asks for a pause of
    minutes: a step that hung and came back, whatever the logging interval.
    """

    __slots__ = (
        "baseline", "last", "learn_from", "learning", "now", "previous", "recent", "seen",
        "settled", "spec", "steps",
    )  # fmt: skip
    _packed = ("recent",)

    def __init__(self, spec: Throughput) -> None:
        self.spec = spec
        self.last: tuple[int, float] | None = None  # (step, wall) of the last distinct stamp
        self.previous = 0  # the step an interval was measured from
        self.steps = 0  # steps in the last interval
        self.seen = 0
        self.learning: list[float] = []
        self.learn_from: int | None = None  # the step the window being learned began at
        self.baseline = math.nan
        self.settled = math.inf  # the median of the last window learned after the baseline
        self.now = math.nan
        self.recent: deque[float] = deque(maxlen=spec.recent)

    def _seconds_per_step(self, step: int, wall_time: float, value: float) -> float | None:
        source = self.spec.source
        if source == "step_time":
            return value if math.isfinite(value) and value >= 0 else None
        if source == "rate":
            return 1.0 / value if math.isfinite(value) and value > 0 else None
        last = self.last
        if not math.isfinite(wall_time):
            return None
        if last is None or step <= last[0] or wall_time < last[1]:
            self.last = (step, wall_time)  # first point, a rewind, or a clock set back
            return None
        if wall_time == last[1]:
            return None  # stamped with the step before: the next stamp covers both
        self.last = (step, wall_time)
        self.previous, self.steps = last[0], step - last[0]
        return (wall_time - last[1]) / (step - last[0])

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        per_step = self._seconds_per_step(step, wall_time, value)
        if per_step is None:
            return None
        self.seen += 1
        if self.seen <= self.spec.skip:
            return None
        spec = self.spec
        self.recent.append(per_step)  # the baseline's intervals too: judged once it is learned
        window = self._learn(step, per_step)
        if math.isnan(self.baseline):
            if window is not None:
                self.baseline = window
            return None
        if window is not None:
            # The run's settled pace, not its first steps': a warm-up slower than what
            # follows (compilation, caches filling, a data loader's first epoch) taught a
            # baseline that a later ×3 slowdown never passes. Two windows in a row faster
            # than the baseline lower it to the slower of the two: one window's median is
            # already robust to jitter, and asking two keeps a lucky quiet stretch between
            # a bursty neighbour's slices from teaching a pace the run does not hold.
            # Never raised: a run that slows for good stays slow against what it was.
            self.baseline = min(self.baseline, max(window, self.settled))
            self.settled = window
        if self.baseline <= 0 or len(self.recent) < spec.recent:
            return None  # a zero baseline means no real clock (e.g. file mtimes): cannot judge
        self.now = median(self.recent) if spec.recent > 1 else per_step
        slow = self.now > spec.slowdown * self.baseline
        # the time lost in this interval: what its steps took beyond the baseline pace,
        # the same measure whether they are 1 step apart or 500
        if spec.min_gap and (per_step - self.baseline) * self.steps < spec.min_gap:
            return QUIET
        return ACTIVE if slow and self.now - self.baseline >= spec.min_increase else QUIET

    def _learn(self, step: int, per_step: float) -> float | None:
        """The median of a window of `learn` intervals (or fewer that cover `learn_steps`
        when points are sparse) each time one fills; None meanwhile."""
        spec = self.spec
        if self.learn_from is None:
            self.learn_from = self.previous if spec.source == "clock" else step
        self.learning.append(per_step)
        spanned = spec.learn_steps and step - self.learn_from >= spec.learn_steps
        if len(self.learning) < spec.learn and not (spanned and len(self.learning) >= 2):
            return None
        window = median(self.learning)
        self.learning, self.learn_from = [], None
        return window

    def evidence(self) -> str:
        spec, now = self.spec, self.now
        ratio = now / self.baseline if self.baseline > 0 else math.nan
        unit = "unit" if spec.source == "rate" else "step"
        limits = f"×{fmt(spec.slowdown)}"
        if spec.min_increase:
            limits += f" and +{_duration(spec.min_increase)}/{unit}"
        if spec.min_gap:
            limits += f" and a gap of {_duration(spec.min_gap)}"
        pace = f"the run's baseline {_duration(self.baseline)}/{unit}"
        if spec.source == "clock" and spec.recent == 1:
            each = "" if self.steps == 1 else f" ({_duration(now)}/step over {self.steps} steps)"
            return (
                f"came {_duration(now * self.steps)} after step {self.previous}{each}, "
                f"{_times(ratio)} {pace} (limits {limits})"
            )
        against = f"{_times(ratio)} {pace} (limits {limits})"
        if spec.source == "clock":
            what = f"advances at {_duration(now)}/step"
        elif spec.source == "rate":
            what = f"is down to {fmt(1.0 / now)}/s" if now > 0 else "is down"
        else:
            what = f"is {_duration(now)}/step"
        kind = "intervals" if spec.source == "clock" else "values"
        median_of = f" (median of the last {len(self.recent)} {kind})" if spec.recent > 1 else ""
        return f"{what}{median_of}, {against}"


class NoDataClock(Packed):
    """Per run, not per series: when would silence become suspicious?

    The engine feeds it every point of the run (`observe`) and asks `due()` for
    the deadline; it fires at the deadline, on the data's time axis, both when
    a later point reveals a gap (replay) and when `tick(now)` passes it (live).
    """

    __slots__ = ("fresh", "intervals", "last_step", "last_wall", "spec", "step_wall", "wait")
    _packed = ("intervals",)

    def __init__(self, spec: NoData) -> None:
        self.spec = spec
        self.intervals: deque[float] = deque(maxlen=spec.learn)
        self.last_step: int | None = None
        self.last_wall = -math.inf
        self.step_wall = -math.inf  # wall time at which the latest step was first seen
        self.wait = self._allowed()
        self.fresh = 0  # intervals added since `wait` was computed

    def observe(self, step: int, wall_time: float) -> None:
        if not math.isfinite(wall_time):
            return
        if step != self.last_step and wall_time >= self.step_wall:
            if self.last_step is not None and wall_time > self.step_wall:
                self.intervals.append(wall_time - self.step_wall)
                self.fresh += 1
                # the median moves slowly: refresh it every few intervals, not every point
                if self.fresh >= 4 or len(self.intervals) <= 4:
                    self.wait, self.fresh = self._allowed(), 0
            self.last_step, self.step_wall = step, wall_time
        if wall_time > self.last_wall:
            self.last_wall = wall_time

    def typical(self) -> float:
        return median(self.intervals) if len(self.intervals) >= 3 else math.nan

    def _allowed(self) -> float:
        typical = self.typical()
        wait = self.spec.min_silence
        if not math.isnan(typical):
            wait = max(wait, self.spec.factor * typical)
        if self.spec.max_silence is not None:
            wait = min(wait, self.spec.max_silence)
        return wait

    def due(self) -> float:
        return self.last_wall + self.wait

    def verdict(self, now: float) -> int:
        return ACTIVE if self.last_step is not None and now > self.last_wall + self.wait else QUIET

    def evidence(self) -> str:
        typical = self.typical()
        basis = (
            f"{fmt(self.spec.factor)} × the typical interval {_duration(typical)}"
            if not math.isnan(typical)
            else "too few intervals to learn the pace"
        )
        return (
            f"no new data for {_duration(self.wait)} after step {self.last_step} "
            f"({basis}; at least {_duration(self.spec.min_silence)}); "
            f"the job may be hung, dead or finished"
        )


class StaleCondition:
    """One series that stops while its run goes on: a layer that no longer gets gradients.

    A frozen layer (or one cut off by a detached tensor) has no gradient, so
    the probe and per-layer loggers write nothing for it: no value to judge,
    only an absence. Its own points teach the series' pace; the engine asks
    `deadline()` for the run step past which the silence is suspicious and,
    when the run's other series get there, fires on the run's step. Judged on
    steps, not time, so an evaluation pause is not a silence; a point of the
    series itself is quiet, and resolves it. With `unchanged`, a point that
    repeats the value before it is no news either: Lightning re-logs the last
    value a hook gave it at each logging step after the hook stops giving one
    (to the epoch's end), so a frozen parameter's `grad_2.0_norm/...` goes on,
    bit for bit the same.
    """

    __slots__ = ("intervals", "last", "now", "seen", "spec", "value")

    def __init__(self, spec: Stale) -> None:
        self.spec = spec
        self.intervals: deque[int] = deque(maxlen=9)
        self.last: int | None = None  # the step of its last new value
        self.seen: int | None = None  # the step of its last point, new or repeated
        self.value = math.nan
        self.now = 0  # the run's step when it was last found stale

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if self.seen is not None and step > self.seen:
            self.intervals.append(step - self.seen)
        self.seen = step
        if self.spec.unchanged and value == self.value:  # NaN is never equal: it is news
            return None
        self.value = value
        self.last = step
        return QUIET

    def typical(self) -> float:
        return median(self.intervals) if len(self.intervals) >= self.spec.learn else math.nan

    def deadline(self) -> float:
        """The run step past which this series is stale (inf: too few intervals yet)."""
        typical = self.typical()
        if self.last is None or math.isnan(typical):
            return math.inf
        return self.last + max(self.spec.factor * typical, self.spec.min_steps)

    def evidence(self) -> str:
        every = fmt(self.typical())
        if self.seen is not None and self.last is not None and self.seen > self.last:
            return (
                f"has repeated {fmt(self.value)} since step {self.last} while its run went on "
                f"to step {self.now} (it came every {every} steps): the last value re-logged, "
                f"as for a layer that gets no gradient"
            )
        return (
            f"has had no point since step {self.last} while its run went on to step "
            f"{self.now} (it came every {every} steps): no longer written, "
            f"as for a layer that gets no gradient"
        )
