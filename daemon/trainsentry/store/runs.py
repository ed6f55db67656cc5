"""All series of all runs, and the rows that wait to be filed into them.

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

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from operator import attrgetter, itemgetter, lt

from trainsentry.point import Point, Row, batches_of
from trainsentry.store.series import Series

_new = tuple.__new__
_LAST = attrgetter("_last")  # a Series' newest point (set by its first add)
_STEP, _WALL = itemgetter(2), itemgetter(3)
# A series no rule reads: enough for a plot's context in an incident bundle, and no
# history (its older points are counted, not summarised): nothing reads the history
# of such a series, and folding it was 3 % of a live fleet's daemon CPU.
SIDE_RECENT = 100
SIDE_BUCKETS = 0
# Rows a run keeps waiting before they are filed (see the docstring): at a record a
# second, sixteen seconds of a 20-value run is ~5 kB.
PENDING_ROWS = 16
# Shapes remembered per run as filed (their tags have series): more means a log whose
# keys keep changing, which is filed at once rather than remembered.
KNOWN_SHAPES = 256


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
