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

Rows (a record's values, `extend_rows`) are not filed one value at a time:
a run's rows wait, as columns in buffers kept per run (`_Waiting`), until
PENDING_ROWS have come (or anything reads the run), and are then filed a
shape at a time, each tag's values as one column appended with C-level array
extends. Readers never see the wait: every
read of a run files what waits first, and `newest()` counts it. On a live
fleet of one record per run a second this is the difference between a Python
call per value and a few per sixteen records.

Memory is what bounds a fleet: 1,000 runs × 20 series is 20,000 series. So
closed buckets are eight doubles in one flat array (64 bytes, not the ~260 of
a Bucket object and its boxed numbers), at most `max_buckets` of them; and a
series no rule reads (`Store(judged=...)`) keeps a short window and no history, since only
evidence reads it: the alerted series keeps its full window for the plots,
the incident bundle and the peak.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from operator import attrgetter, itemgetter, lt

from trainsentry.buffers import cut_front
from trainsentry.point import Point, Row, batches_of

_new = tuple.__new__
_LAST = attrgetter("_last")  # a Series' newest point (set by its first add)
_STEP, _WALL = itemgetter(2), itemgetter(3)
INT64_MAX = (1 << 63) - 1
# A series no rule reads: enough for a plot's context in an incident bundle, and no
# history (its older points are counted, not summarised): nothing reads the history
# of such a series, and folding it was 3 % of a live fleet's daemon CPU.
SIDE_RECENT = 100
SIDE_BUCKETS = 0
# Rows a run keeps waiting before they are filed (see above): at a record a second,
# sixteen seconds of a 20-value run is ~5 kB.
PENDING_ROWS = 16
# Shapes remembered per run as filed (their tags have series): more means a log whose
# keys keep changing, which is filed at once rather than remembered.
KNOWN_SHAPES = 256


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


class _Waiting:
    """A run's rows not filed yet, as columns in buffers kept from one filing to the
    next: steps, stamps, tags (the shared tuples) and every value in one flat
    array. No Python object per row or value, and no buffer made and freed per
    filing: at 1,000 runs x 20 series, rows waiting as objects, or buffers grown
    and freed every 16 rows, fragmented the heap (RSS +33 MB measured)."""

    __slots__ = ("fill", "rows", "shapes", "steps", "values", "walls")

    def __init__(self) -> None:
        self.rows = 0  # rows waiting
        self.fill = 0  # values waiting
        self.steps = array("q", bytes(8 * PENDING_ROWS))
        self.walls = array("d", bytes(8 * PENDING_ROWS))
        self.shapes: list[tuple[str, ...]] = [()] * PENDING_ROWS
        self.values = array("d")  # grows to the largest it needs, once


class Store:
    """All series, by run then tag; a deleted run is released as a whole."""

    def __init__(
        self,
        *,
        recent_size: int = 1000,
        bucket_steps: int = 100,
        max_buckets: int = 128,
        judged: Callable[[str], bool] | None = None,
    ) -> None:
        """`judged(tag)`: does a rule read this tag? Others keep SIDE_RECENT points."""
        if recent_size < 1 or bucket_steps < 1 or max_buckets < 2:
            raise ValueError("recent_size, bucket_steps >= 1 and max_buckets >= 2 required")
        self._recent_size = recent_size
        self._bucket_steps = bucket_steps
        self._max_buckets = max_buckets
        self._judged = judged
        self._runs: dict[str, dict[str, Series]] = {}
        self._pending: dict[str, _Waiting] = {}  # rows not filed yet, by run
        # per run: the row shapes filed (by id; the dict holds them, so ids stay theirs)
        self._known: dict[str, dict[int, tuple[str, ...]]] = {}
        # per run with rows waiting: the newest (step, wall time) over its series and rows
        self._top: dict[str, tuple[int, float]] = {}

    def add(self, point: Point) -> Series:
        """File one point; returns its series so a caller can read the window at once."""
        self._file(point.run)
        tags = self._tags(point.run)
        series = tags.get(point.tag) or self._new_series(tags, point.tag)
        series.add(point)
        return series

    def _tags(self, run: str) -> dict[str, Series]:
        tags = self._runs.get(run)
        if tags is None:
            tags = self._runs[run] = {}
        return tags

    def _new_series(self, tags: dict[str, Series], tag: str) -> Series:
        if self._judged is None or self._judged(tag):
            size, buckets = self._recent_size, self._max_buckets
        else:
            size = min(self._recent_size, SIDE_RECENT)
            buckets = min(self._max_buckets, SIDE_BUCKETS)
        series = tags[tag] = Series(size, self._bucket_steps, buckets)
        return series

    def extend(self, points: Iterable[Point]) -> None:
        """`add` for each point, as rows (consecutive points of one step and stamp)."""
        for run, rows in batches_of(points):
            self.extend_rows(run, rows)

    def extend_rows(self, run: str, rows: Sequence[Row]) -> None:
        """File one run's rows (see the module's docstring: they may wait a little)."""
        waiting = self._pending.get(run)
        if waiting is None:
            waiting = self._pending[run] = _Waiting()
            self._tags(run)
        if len(rows) > PENDING_ROWS:  # a backlog: filed at once, as columns
            self._file(run)
            self._file_rows(run, rows)
            return
        known = self._known.get(run)
        # Rows wait only while newest() can tell the run's newest point without filing
        # them: tags whose series exist, steps and stamps going up. Anything else (new
        # tags, a rewind, a repeated step, a stamp back or NaN) is filed at once.
        now = False
        step, wall = self._top.get(run, (0, 0.0))
        for row in rows:
            k = waiting.rows
            if k == PENDING_ROWS:
                self._file(run)
                k = 0
            try:
                waiting.steps[k] = row[0]
            except OverflowError:  # a step beyond int64 (a garbled log): filed alone
                self._file(run)
                self._file_rows(run, [row])
                continue
            waiting.walls[k] = row[1]
            waiting.shapes[k] = row[2]
            values, start = row[3], waiting.fill
            stop = start + len(values)
            if stop > len(waiting.values):
                waiting.values.frombytes(bytes(8 * (stop - len(waiting.values))))
            waiting.values[start:stop] = array("d", values)
            waiting.rows, waiting.fill = k + 1, stop
            if known is None or id(row[2]) not in known or not (row[0] > step and row[1] >= wall):
                now = True
            step, wall = row[0], row[1]
        if now or waiting.rows >= PENDING_ROWS:
            self._file(run)
        elif waiting.rows:
            self._top[run] = step, wall

    def _file(self, run: str) -> None:
        """File a run's waiting rows."""
        waiting = self._pending.get(run)
        if waiting is not None and waiting.rows:
            n = waiting.rows
            waiting.rows = waiting.fill = 0
            self._file_columns(
                run, waiting.steps[:n], waiting.walls[:n], waiting.shapes[:n], waiting.values, True
            )

    def _file_rows(self, run: str, rows: Sequence[Row]) -> None:
        """File rows at once, as the columns `_file_columns` takes."""
        steps: Sequence[int] = [r[0] for r in rows]
        try:
            steps, fits = array("q", steps), True
        except OverflowError:  # beyond int64: point by point, clipped by add
            fits = False
        walls = array("d", [r[1] for r in rows])
        flat = array("d", chain.from_iterable(r[3] for r in rows))
        self._file_columns(run, steps, walls, [r[2] for r in rows], flat, fits)

    def _file_columns(
        self,
        run: str,
        all_steps: Sequence[int],
        all_walls: Sequence[float],
        shapes: list[tuple[str, ...]],
        flat: Sequence[float],
        fits: bool,
    ) -> None:
        """File rows given as columns, a shape at a time, each tag's values as one column.

        `fits`: every step fits int64 (`all_steps` is an array of them).
        """
        tags = self._tags(run)
        known = self._known.get(run)
        if known is None or len(known) >= KNOWN_SHAPES:
            known = self._known[run] = {}
        nrows = len(shapes)
        row = at = 0  # where the group starts among the rows, and in `flat`
        while row < nrows:
            shape = shapes[row]
            stop = row + 1
            while stop < nrows and shapes[stop] is shape:
                stop += 1
            n, width = stop - row, len(shape)
            end = at + width * n
            if n == 1 or len(set(shape)) != width:
                # a lone row (writers of one scalar an event alternate tags: torch's
                # SummaryWriter), or a tag twice in a row: point by point, in order
                for k in range(row, stop):
                    step, wall = all_steps[k], all_walls[k]
                    for tag in shape:
                        series = tags.get(tag) or self._new_series(tags, tag)
                        series.add(_new(Point, (run, tag, step, wall, flat[at])))
                        at += 1
            else:
                # steps and stamps are the same for every tag of the shape: sliced once
                steps, walls = all_steps[row:stop], all_walls[row:stop]
                rising = fits and all(map(lt, steps, islice(steps, 1, None)))
                for i, tag in enumerate(shape):
                    series = tags.get(tag) or self._new_series(tags, tag)
                    column = flat[at + i : end : width]  # one tag's values, strided: C-level
                    series.extend(run, tag, steps, walls, column, rising=rising)
                at = end
            row = stop
            known[id(shape)] = shape
        lasts = list(map(_LAST, tags.values()))
        self._top[run] = max(map(_STEP, lasts)), max(map(_WALL, lasts))

    def runs(self) -> list[str]:
        return list(self._runs)

    def newest(self) -> Iterator[tuple[str, int, float, int]]:
        """Per run: the newest step and wall time over its series, and how many series.

        Read once a second for the status board over every series of the
        fleet, so the looping is left to C (map over getters), not Python.
        """
        pending, top = self._pending, self._top
        for run, tags in self._runs.items():
            waiting = pending.get(run)
            if waiting is not None and waiting.rows:  # known shapes going up: the last row's
                yield run, *top[run], len(tags)
                continue
            lasts = list(map(_LAST, tags.values()))
            if lasts:
                yield run, max(map(_STEP, lasts)), max(map(_WALL, lasts)), len(lasts)

    def series(self, run: str) -> dict[str, Series]:
        """The run's series by tag (a copy of the mapping; the series are live)."""
        self._file(run)
        return dict(self._runs.get(run, {}))

    def get(self, run: str, tag: str) -> Series | None:
        self._file(run)
        return self._runs.get(run, {}).get(tag)

    def last_point(self, run: str, tag: str) -> Point | None:
        series = self.get(run, tag)
        return series.last if series is not None else None

    def release_run(self, run: str) -> bool:
        """Forget a run (its directory was deleted); True if it was known."""
        self._pending.pop(run, None)
        self._known.pop(run, None)
        self._top.pop(run, None)
        return self._runs.pop(run, None) is not None
