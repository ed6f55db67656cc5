"""Points kept per run × tag, in bounded memory however long a run lasts.

A daemon watching a hundred runs for weeks cannot keep every point, and the
rules do not need it: they look at the recent window, and older history is
only evidence (plots, baselines), for which a summary per step bucket is
enough. So each series keeps

- `recent()`: the last `recent_size` points at full resolution, in strictly
  increasing step order — the timeline that led to the newest point;
- `history()`: every point that left that window, folded into `Bucket`
  summaries of consecutive points spanning `bucket_steps` steps. When more
  than `max_buckets` are closed, adjacent pairs are merged and the bucket
  width doubles: the whole history stays covered at half the resolution,
  at an amortised O(1) cost per point.

Steps that do not increase are deliberate, not errors:

- a rewind (step < the newest step) is a job restarted from a checkpoint.
  The points at or after the restart step belong to an abandoned timeline:
  they move from `recent()` to history, `segment` increments, and the window
  continues from the checkpoint's past, so windowed rules see one monotone
  axis;
- a repeated step (== the newest step) replaces the newest point in
  `recent()` — a step has one value, the latest written (a re-logged step,
  or a loss logged per micro-batch at one global step). The replaced point is
  still counted in history. It does not start a segment.

Every point added is thus in exactly one place: `len(recent())` plus the
bucket counts equals `count` (a series no rule reads keeps no history: its
points that left the window are only counted). Not thread-safe: one owner (the runtime) adds and
reads.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from trainsentry.point import Point
from trainsentry.store.buffers import cut_front

_new = tuple.__new__
_LAST = attrgetter("_last")  # a Series' newest point (set by its first add)
_STEP, _WALL = itemgetter(2), itemgetter(3)
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Bucket:
    """A summary of consecutive points that left the recent window.

    `first_step`/`last_step` are the steps of its first and last point in the
    order they left the window; min/max/mean ignore NaN (counted in `nan_count`
    so a bucket of NaN losses still shows), `last` is the last value as is.
    """

    first_step: int
    last_step: int
    count: int
    nan_count: int
    min: float
    max: float
    mean: float
    last: float


BUCKET_FIELDS = 8


def _fields(b: Bucket) -> tuple[float, ...]:
    return (b.first_step, b.last_step, b.count, b.nan_count, b.min, b.max, b.mean, b.last)


def _bucket(f: Sequence[float]) -> Bucket:
    return Bucket(int(f[0]), int(f[1]), int(f[2]), int(f[3]), f[4], f[5], f[6], f[7])


def _merge(a: Bucket, b: Bucket) -> Bucket:
    na, nb = a.count - a.nan_count, b.count - b.nan_count
    if not nb:
        low, high, mean = a.min, a.max, a.mean
    elif not na:
        low, high, mean = b.min, b.max, b.mean
    else:
        low, high = min(a.min, b.min), max(a.max, b.max)
        mean = (a.mean * na + b.mean * nb) / (na + nb)
    return Bucket(
        a.first_step,
        b.last_step,
        a.count + b.count,
        a.nan_count + b.nan_count,
        low,
        high,
        mean,
        b.last,
    )


class Series:
    """One run × tag. Read through `recent()`, `history()`, `last`, `segment`.

    The recent window is three typed arrays (step, wall time, value), not a
    deque of Points: 24 bytes a point instead of about 150 for a tuple and
    its boxed numbers. At 1,000 runs × 20 series × 1,000 points that is the
    difference between half a gigabyte and three. Points are rebuilt when
    the window is read, which only evidence (plots, bundles, peaks) does.
    The window is a slice `[_head:]` of the arrays; the dead prefix is cut
    off once it reaches a quarter of the window, so a point costs O(1)
    amortised and at most 1.25× the window is held.
    """

    __slots__ = (
        "_closed",
        "_compact_at",
        "_head",
        "_last",
        "_max_buckets",
        "_maxlen",
        "_open",
        "_open_key",
        "_steps",
        "_values",
        "_walls",
        "_width",
        "count",
        "segment",
    )

    def __init__(self, recent_size: int, bucket_steps: int, max_buckets: int) -> None:
        self._steps = array("q")
        self._walls = array("d")
        self._values = array("d")
        self._head = 0
        self._maxlen = recent_size
        self._compact_at = max(16, recent_size // 4)
        self._last: Point | None = None  # the newest point, as it was added
        # Closed buckets, BUCKET_FIELDS doubles each (a Bucket's fields in order).
        self._closed = array("d")
        # The bucket being filled: [first, last, count, nan_count, min, max, sum, last_value]
        self._open: list[float] | None = None
        self._open_key = 0
        self._width = bucket_steps
        self._max_buckets = max_buckets
        self.count = 0  # points ever added
        self.segment = 0  # rewinds seen

    @property
    def last(self) -> Point:
        if self._last is None:
            raise IndexError("an empty series has no last point")
        return self._last

    @property
    def bucket_steps(self) -> int:
        """The current bucket width: doubles each time history is coarsened."""
        return self._width

    def recent(self) -> list[Point]:
        last, h = self._last, self._head
        if last is None:
            return []
        run, tag = last.run, last.tag
        return [
            _new(Point, (run, tag, s, w, v))
            for s, w, v in zip(self._steps[h:], self._walls[h:], self._values[h:], strict=True)
        ]

    def history(self) -> list[Bucket]:
        self._retire()
        buckets = self._closed_buckets()
        if self._open is not None:
            buckets.append(self._close_open())
        return buckets

    def add(self, point: Point) -> None:
        _, _, step, wall, value = point
        steps = self._steps
        self.count += 1
        n = len(steps)
        if n > self._head and step <= steps[-1]:
            self._rewind(step)
        elif n - self._head == self._maxlen:
            self._head += 1  # the oldest point leaves the window; folded with its prefix
            if self._head >= self._compact_at:
                self._retire()
        try:
            steps.append(step)
        except OverflowError:  # a step beyond int64 (a garbled log): kept at the limit
            steps.append(INT64_MAX if step > 0 else -INT64_MAX - 1)
        self._walls.append(wall)
        self._values.append(value)
        self._last = point

    def extend(
        self,
        run: str,
        tag: str,
        steps: Sequence[int],
        walls: Sequence[float],
        values: Sequence[float],
        *,
        rising: bool,
    ) -> None:
        """`add` for each (step, wall, value), as one column. `rising`: the steps go
        strictly up and fit int64; then, when they also pass the newest step (every
        live write), they are appended by C-level extends (memcpy from the arrays
        the caller made once for all the tags of a shape), else point by point."""
        own = self._steps
        if not rising or (len(own) > self._head and steps[0] <= own[-1]):
            for k in range(len(steps)):
                self.add(_new(Point, (run, tag, steps[k], walls[k], values[k])))
            return
        own.extend(steps)  # an array("q") when rising
        self._walls.extend(walls)  # an array("d")
        self._values.extend(values)
        self.count += len(steps)
        excess = len(own) - self._head - self._maxlen
        if excess > 0:  # the oldest points leave the window; folded with its prefix
            self._head += excess
            if self._head >= self._compact_at:
                self._retire()
        self._last = _new(Point, (run, tag, steps[-1], walls[-1], values[-1]))

    def _rewind(self, step: int) -> None:
        """A rewind or a repeated step: the window's points at or after `step` leave it."""
        steps = self._steps
        if step < steps[-1]:
            self.segment += 1
        self._retire()  # what left the window earlier is folded first, in order
        cut = bisect_left(steps, step)
        self._fold(cut, len(steps))
        del steps[cut:], self._walls[cut:], self._values[cut:]

    def _retire(self) -> None:
        """Fold the points that left the window (the dead prefix) into history; cut them off.

        Folded a prefix at a time, not a point at a time: the window's steps
        increase strictly, so each bucket's share of the prefix is one slice
        (found by bisection) summarised by C-level min/max/sum. Per point that
        is a few list operations instead of a Python call and a dozen
        comparisons; the store was the largest per-point cost of a live fleet.
        """
        h = self._head
        if h:
            self._fold(0, h)
            cut_front((self._steps, self._walls, self._values), h)  # buffers kept: buffers.py
            self._head = 0

    def _fold(self, lo: int, hi: int) -> None:
        """Summarise the window's points [lo, hi) (steps increasing) into buckets."""
        if not self._max_buckets:
            return  # a series no rule reads keeps no history (SIDE_BUCKETS)
        steps, values = self._steps, self._values
        i = lo
        while i < hi:
            step = steps[i]
            current = self._open
            if current is None or step // self._width != self._open_key or step < current[1]:
                current = self._open_bucket(step, values[i])
            j = bisect_left(steps, (self._open_key + 1) * self._width, i, hi)
            group = values[i:j]
            finite = [v for v in group if v == v]
            current[1] = steps[j - 1]
            current[2] += j - i
            current[3] += j - i - len(finite)
            current[7] = group[-1]
            if finite:
                current[4] = min(current[4], min(finite))
                current[5] = max(current[5], max(finite))
                current[6] += sum(finite)
            i = j

    def _open_bucket(self, step: int, value: float) -> list[float]:
        """Close the open bucket (coarsening history if it is full) and open one at `step`."""
        if self._open is not None:
            self._closed.extend(_fields(self._close_open()))
            if len(self._closed) > self._max_buckets * BUCKET_FIELDS:
                self._coarsen()
        self._open = current = [step, step, 0, 0, math.inf, -math.inf, 0.0, value]
        self._open_key = step // self._width
        return current

    def _closed_buckets(self) -> list[Bucket]:
        c, n = self._closed, BUCKET_FIELDS
        return [_bucket(c[i : i + n]) for i in range(0, len(c), n)]

    def _close_open(self) -> Bucket:
        o = self._open
        assert o is not None
        finite = int(o[2] - o[3])
        nan = math.nan
        return Bucket(
            int(o[0]),
            int(o[1]),
            int(o[2]),
            int(o[3]),
            o[4] if finite else nan,
            o[5] if finite else nan,
            o[6] / finite if finite else nan,
            o[7],
        )

    def _coarsen(self) -> None:
        closed = self._closed_buckets()
        merged = [_merge(closed[i], closed[i + 1]) for i in range(0, len(closed) - 1, 2)]
        if len(closed) % 2:
            merged.append(closed[-1])
        self._closed = array("d", [x for b in merged for x in _fields(b)])
        self._width *= 2
        if self._open is not None:
            self._open_key = int(self._open[0]) // self._width
